"""Tar headers read by the workers: the member tables of the run's tars, made before the launcher plans.

In:  the top-level uncompressed tars under SRC (:class:`archives.TarUnit`), a
     folder the launcher and every worker can reach (inside the run's work
     folder), and the run's Beam runner.
Out: :class:`Tables`: one table per tar, and per tar stored inside one (each
     class tar of ImageNet's tar of tars): its :func:`tar_members.scan_tar`
     entries, in archive order. The launcher's lister reads a table in place of
     the tar's headers (:func:`archives.list_tree`), so the listing, and every
     byte after it, is the same whoever read the headers.

Why: a tar has no index. Its headers are spread through it, one before each
member, so listing it reads the whole file: ImageNet's train tar is 138 GB and
1.28M headers, a folder of WebDataset shards thousands of files. Read by the
launcher, that is one process downloading the dataset once before any worker
starts; read here, it is spread over the workers, each near its own share.

Two stages, so a tar of tars spreads too: the first reads each top-level tar's
own headers (ImageNet's train tar: its 1,000 class tars, one header each, the
rest skipped) and hands every stored tar inside it to the second as a unit of
its own; the second reads a unit, and any tar nested deeper in it, whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import marshal
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from typing import BinaryIO, Callable, Iterator, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes

from beam_jobs.files.filesystems import FileSystems, open_for_scanning
from beam_jobs.sources.archives import archive_members, archives, tar_members
from beam_jobs.sources.archives.archive_members import ArchiveError, Entry, RangeFile
from beam_jobs.sources.archives.archives import TarUnit

logger = logging.getLogger(__name__)

# --archive-scan auto: the workers read the tars' headers when the top-level tars hold at least AUTO_BYTES
# (a pipeline's start-up, seconds, then costs less than the launcher's reading), else the launcher does.
AUTO_BYTES = 4 << 30
_TABLE = ".entries"
_COPY = 1 << 20


class Tables:
    """The member tables the workers wrote into ``folder``: ``scan(unit)`` replays one, or is None when the
    workers wrote none for it (a tar inside a zip, an inflated one: the launcher reads those itself)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        found = FileSystems.match([FileSystems.join(folder, "*" + _TABLE)])[0].metadata_list
        self._names = {posixpath.basename(meta.path) for meta in found}

    def __len__(self) -> int:
        return len(self._names)

    def scan(self, unit: TarUnit) -> Optional[Callable[[], Iterator[Entry]]]:
        """The entries of ``unit`` as :func:`tar_members.scan_tar` gave them, as a scan that runs any number of times."""
        name = table_name(unit)
        if name not in self._names:
            return None
        path = FileSystems.join(self.folder, name)
        return lambda: _replay(path)

    def remove(self) -> None:
        """Delete the tables (the listing that read them is spilled to the launcher's scratch)."""
        _remove_folder(self.folder)


def scan_on_workers(units: Sequence[TarUnit], folder: str, run: Callable[[Callable[[beam.Pipeline], None]], None],
                    mode: str = "auto") -> Optional[Tables]:
    """Read the headers of ``units`` on the workers into tables in ``folder``; None when ``mode`` says the
    launcher reads them (``"launcher"``, or ``"auto"`` and fewer than :data:`AUTO_BYTES` of tars).

    ``run(build)``: runs a Beam pipeline that ``build`` fills in, on the run's runner.
    """
    total = sum(unit.size for unit in units)
    if not units or mode == "launcher" or (mode == "auto" and total < AUTO_BYTES):
        return None
    started = time.monotonic()

    def build(pipeline: beam.Pipeline) -> None:
        _ = (
            pipeline
            | "TopLevelTars" >> beam.Create(list(units), reshuffle=True)
            | "ReadOwnHeaders" >> beam.ParDo(_ScanTar(folder, nested=False))
            | "SpreadInnerTars" >> beam.Reshuffle()
            | "ReadInnerTars" >> beam.ParDo(_ScanTar(folder, nested=True))
        )

    run(build)
    tables = Tables(folder)
    logger.info("the workers read the headers of %d tar(s) (%.1f GB) into %d member tables in %.1f s", len(units),
                total / 1e9, len(tables), time.monotonic() - started)
    return tables


def table_name(unit: TarUnit) -> str:
    """The file name of ``unit``'s table: a digest of where its bytes are, the same in the launcher and workers."""
    where = f"{unit.in_work}\0{unit.file}\0{unit.base}\0{unit.size}"
    return hashlib.sha256(where.encode("utf-8", "surrogatepass")).hexdigest()[:32] + _TABLE


class _ScanTar(beam.DoFn):
    """Writes a tar's table; ``nested=False`` yields the tars stored in it as units for the next stage,
    ``nested=True`` reads those (and deeper ones) here."""

    def __init__(self, folder: str, nested: bool) -> None:
        self._folder, self._nested = folder, nested

    def process(self, unit: TarUnit) -> Iterator[TarUnit]:
        with open_for_scanning(unit.path) as handle:
            inner = write_table(handle, unit, self._folder)
            if not self._nested:
                yield from inner
                return
            while inner:
                inner.extend(write_table(handle, inner.pop(), self._folder))


def write_table(handle: BinaryIO, unit: TarUnit, folder: str) -> list[TarUnit]:
    """Read ``unit``'s headers through ``handle`` (its file) into its table in ``folder``, whole or not at all;
    return the tars stored in it that :func:`archives.list_tree` reads (not past :data:`archives.MAX_DEPTH`).

    A tar that cannot be read ends its table with the error, which :class:`Tables` raises where the launcher
    reads it, as reading the tar there would.
    """
    inner: list[TarUnit] = []
    with tempfile.TemporaryFile() as spool:
        try:
            for entry in tar_members.scan_tar(RangeFile(handle, unit.base, unit.size), unit.size, unit.base):
                spool.write(marshal.dumps(archive_members.entry_record(entry)))
                if isinstance(entry, archive_members.Member) and unit.depth + 1 < archives.MAX_DEPTH \
                        and archives.is_tar(posixpath.basename(entry.path)):
                    inner.append(dataclasses.replace(unit, base=entry.offset, size=entry.size, depth=unit.depth + 1))
        except (ArchiveError, OSError) as err:
            spool.write(marshal.dumps((str(err), isinstance(err, ArchiveError), None)))
        spool.seek(0)
        _write_whole(FileSystems.join(folder, table_name(unit)), spool)
    return inner


def _replay(path: str) -> Iterator[Entry]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        while True:
            try:
                record = marshal.load(handle)
            except EOFError:
                return
            if record[-1] is None:  # the tar could not be read past here: raise as reading it would
                message, unreadable, _ = record
                raise ArchiveError(message) if unreadable else OSError(message)
            yield archive_members.entry_from_record(record)


def _write_whole(path: str, source: BinaryIO) -> None:
    """Copy ``source`` to ``path``: renamed into place locally (a retried worker never leaves half a table),
    uploaded elsewhere (an object appears whole)."""
    if FileSystems.get_scheme(path) in (None, "file"):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(temporary, "wb") as out:
            shutil.copyfileobj(source, out, _COPY)
        os.replace(temporary, path)
        return
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        shutil.copyfileobj(source, out, _COPY)


def _remove_folder(folder: str) -> None:
    if FileSystems.get_scheme(folder) in (None, "file"):
        shutil.rmtree(folder, ignore_errors=True)
        return
    found = FileSystems.match([FileSystems.join(folder, "*")])[0].metadata_list
    if found:
        FileSystems.delete([meta.path for meta in found])
