"""Compressed archives, inflated once: a ``.tar.gz``, ``.tar.bz2`` or ``.tar.xz`` can only be read front to back.

In:  a compressed tar (a file object over it: local, an object store's, or a
     range of an outer tar), read by the launcher while it lists SRC.
Out: a local uncompressed copy (:class:`Inflated`), which the launcher places
     in the run's work folder (:func:`place_inflated`) where its members'
     locators point, so the workers read it by offset like any tar. Temporary
     disk: its uncompressed size, gone with the work folder.

Bounded: a stream inflating past :data:`MAX_INFLATE_RATIO` times its size (and
past 1 MiB) is cut there; a stream that breaks keeps what came before. Either
way the members before that point are whole, and the cause is one refusal.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import lzma
import os
import zlib
from typing import BinaryIO, Iterable, Optional

from apache_beam.io.filesystem import CompressionTypes

from beam_jobs.files.filesystems import FileSystems
from beam_jobs.runtime import interrupt
from beam_jobs.sources.archives import archive_members

DECOMPRESSORS = {
    "gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "bz2": bz2.BZ2File,
    "xz": lzma.LZMAFile,
}
# A compressed tar inflating past this many times its size (and past 1 MiB) is cut there and refused.
MAX_INFLATE_RATIO = archive_members.MAX_RATIO
INFLATED_FOLDER = "inflated"  # in the run's work folder: compressed archives, inflated once
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Inflated:
    """A compressed archive inflated by the launcher: a local file, to be placed at ``name`` in the work folder."""

    local: str
    name: str  # relative to the work folder: inflated/<key>.tar

    @classmethod
    def named(cls, display: str, scratch: str) -> "Inflated":
        """Where the archive shown as ``display`` is inflated: named by its place, the same in every run."""
        key = hashlib.sha256(display.encode("utf-8", "surrogatepass")).hexdigest()[:24]
        return cls(os.path.join(scratch, f"inflated-{key}.tar"), f"{INFLATED_FOLDER}/{key}.tar")


def inflate(source: BinaryIO, kind: str, local: str) -> tuple[int, Optional[tuple[str, str]]]:
    """Inflate the compressed tar ``source`` (``kind``: gz, bz2 or xz) into the file ``local``, front to back.

    Returns the bytes written and, when the stream broke or passed the bound,
    ``(reason, detail)`` for the one refusal that says so.
    """
    size = source.seek(0, os.SEEK_END)
    source.seek(0)
    bound = max(MAX_INFLATE_RATIO * size, 1 << 20)
    written, problem = 0, None
    with open(local, "wb") as out:
        try:
            with DECOMPRESSORS[kind](source) as stream:
                while chunk := stream.read1(_CHUNK):  # read1: a cut loses no more than one raw buffer
                    interrupt.raise_if_received()
                    if written + len(chunk) > bound:
                        out.write(chunk[: bound - written])
                        written = bound
                        problem = ("suspicious-compression", f"inflates past {bound} bytes ({MAX_INFLATE_RATIO}x "
                                   f"its {size}); only the members before that point are read")
                        break
                    out.write(chunk)
                    written += len(chunk)
        except (EOFError, OSError, zlib.error, lzma.LZMAError) as err:
            problem = ("truncated-archive", f"its {kind} stream breaks after {written} inflated bytes ({err}); "
                       "the members before that point are read")
    return written, problem


def place_inflated(inflated: Iterable[Inflated], work: str) -> None:
    """Put the launcher's inflated archives where their members' locators point: ``work/inflated/``.

    A rename when the work folder is on the same local disk; an upload
    otherwise. One already there (a resumed run's) is kept: it holds the same bytes.
    """
    for item in inflated:
        target = FileSystems.join(work, *item.name.split("/"))
        if FileSystems.exists(target):
            continue
        folder = FileSystems.join(work, INFLATED_FOLDER)
        if FileSystems.get_scheme(work) in (None, "file"):
            os.makedirs(folder, exist_ok=True)
            os.replace(item.local, target)
            continue
        with open(item.local, "rb") as source, FileSystems.create(
                target, compression_type=CompressionTypes.UNCOMPRESSED) as out:
            while chunk := source.read(_CHUNK):
                out.write(chunk)
        os.remove(item.local)
