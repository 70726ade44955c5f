"""Workers read archive members: consecutive members by one ranged read, each archive file opened once.

In:  member locators (``ImageRef.source``, see :mod:`beam_jobs.sources.archives.archive_members`), and, for
     validation, the locators a chunk will read in the order it reads them: a part lists an
     archive's members in archive order, so its images sit one after another in the archive file.
Out: each member's bytes, inflated and checked against what its archive declared
     (:func:`archive_members.member_bytes`).

Why not ``FileSystems.open(archive)`` per member: Beam's S3 and GCS readers
read 16 MiB ahead on every read (a buffer for streaming a file front to back),
so one 100 KB member cost a 16 MiB download, and opening the archive for it a
request of its own. Here each archive file is opened once per reader
(:func:`beam_jobs.files.filesystems.open_for_ranges`: a read fetches what it asks
for, no more), members that follow one another in the archive (gaps of at
most :data:`MAX_GAP`: tar headers, padding, skipped files) are fetched by one
request of at most :data:`MAX_RUN` bytes, and a member read alone (the
writer's, in shard order) is fetched exactly. Memory: one run.
"""

from __future__ import annotations

import dataclasses
import os
from typing import BinaryIO, Iterable, Optional

from beam_jobs.files.filesystems import FileSystems, open_for_ranges
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.hub import hub_cells
from beam_jobs.sources.archives.archive_members import ArchiveError, Located

# Members closer than this are fetched together (a tar puts 512-1,023 bytes of header and padding between
# two files); reading the gap costs less than another request's round trip.
MAX_GAP = 256 << 10
# One request fetches at most this much (a member larger than it is fetched alone): the memory a reader holds.
MAX_RUN = 16 << 20


@dataclasses.dataclass(frozen=True)
class _Span:
    """Bytes ``start .. end`` of one archive file (``in_work``, ``file``), fetched by one request."""

    in_work: bool
    file: str
    start: int
    end: int


def plan_runs(sources: Iterable[str]) -> dict[str, _Span]:
    """For each locator in a run of two or more consecutive members, the span its run fetches.

    Plain files and refused members neither join nor break a run.
    """
    spans: dict[str, _Span] = {}
    run: list[str] = []
    span: Optional[_Span] = None

    def close() -> None:
        if len(run) > 1:
            spans.update((source, span) for source in run)

    for source in sources:
        if not source or source.startswith(archive_members.REFUSED) or hub_cells.is_cell(source):
            continue
        located = archive_members.parse_locator(source)
        start = located.member.offset
        end = start + located.member.size
        if (span is not None and (located.in_work, located.file) == (span.in_work, span.file)
                and span.end <= start <= span.end + MAX_GAP and end - span.start <= MAX_RUN):
            span = dataclasses.replace(span, end=end)
            run.append(source)
            continue
        close()
        span, run = _Span(located.in_work, located.file, start, end), [source]
    close()
    return spans



def where(source: str) -> str:
    """Where an item's bytes are, for a rejection's detail, when its path alone does not say it: a Parquet
    row's file, row group and row; "" otherwise."""
    if hub_cells.is_cell(source):
        file, group, row, _ = hub_cells.parse_cell(source)
        return f"{file} row group {group} row {row}" if file else f"row group {group} row {row}"
    return ""


UNKNOWN_ITEM_BYTES = 100_000  # an item whose size the listing does not know (a Parquet row, an object in S3)


def input_bytes(src: str, refs: Iterable, limit: int) -> int:
    """The bytes the first ``limit`` items hold as stored: a local file's size, an archive member's stored
    size; :data:`UNKNOWN_ITEM_BYTES` for the rest. Only for small runs (the rule that runs them in one
    process): one ``stat`` an image."""
    total = 0
    local = FileSystems.get_scheme(src) in (None, "file")
    for count, ref in enumerate(refs):
        if count == limit:
            break
        if ref.source.startswith(archive_members.REFUSED):
            continue
        if ref.source and not hub_cells.is_cell(ref.source):
            total += archive_members.parse_locator(ref.source).member.size
        elif not ref.source and local:
            try:
                total += os.stat(os.path.join(src, *ref.relpath.split("/"))).st_size
            except OSError:
                continue  # gone since listed: validation says so
        else:
            total += UNKNOWN_ITEM_BYTES
    return total


def keeps_bytes(source: str) -> bool:
    """Whether validation keeps this item's bytes for the writer: a Parquet row cannot be read alone cheaply
    (the writer, in shard order, would read a whole row group for each row)."""
    return hub_cells.is_cell(source)


class MemberReader:
    """Reads archive members of SRC (or of archives inflated into the work folder) for one chunk of work.

    ``upcoming``: the locators this reader will be asked for, in that order
    (members read in another order, or not listed, are fetched alone).
    Close it (or use it as a context manager) to close the archive files.
    """

    def __init__(self, src: str, work: str = "", upcoming: Iterable[str] = (), local_paths: bool = False) -> None:
        self._src, self._work, self._local_paths = src, work, local_paths
        self._spans = plan_runs(upcoming)
        self._handles: dict[tuple[bool, str], BinaryIO] = {}
        self._window: tuple[Optional[_Span], bytes] = (None, b"")
        self._cells: Optional[hub_cells.CellReader] = None  # rows of a Parquet dataset
        self.requests = 0  # ranged reads made (what the object-store tests count)

    def read(self, source: str) -> bytes:
        """The bytes of the member ``source`` locates.

        Raises:
          ArchiveError: the archive ends inside the member, or its bytes do not
            inflate to what the archive declared.
          OSError: the archive file cannot be read.
        """
        if hub_cells.is_cell(source):
            if self._cells is None:
                self._cells = hub_cells.CellReader(self._src, self._local_paths)
            return self._cells.read(source)
        located = archive_members.parse_locator(source)
        if not isinstance(located, Located):
            raise ValueError("a refused member has no bytes to read")
        member = located.member
        span = self._spans.get(source)
        if span is None:
            stored = self._fetch(located.in_work, located.file, member.offset, member.size)
        else:
            if self._window[0] != span:
                self._window = (span, self._fetch(span.in_work, span.file, span.start, span.end - span.start))
            at = member.offset - span.start
            stored = self._window[1][at:at + member.size]
        if len(stored) < member.size:
            raise ArchiveError(f"{member.path}: the archive ends {member.size - len(stored)} bytes into it")
        return archive_members.member_bytes(member, stored)

    def _fetch(self, in_work: bool, file: str, offset: int, size: int) -> bytes:
        handle = self._handles.get((in_work, file))
        if handle is None:
            root = self._work if in_work else self._src
            path = FileSystems.join(root, *file.split("/")) if file else root
            handle = self._handles[(in_work, file)] = open_for_ranges(path)
        self.requests += 1
        handle.seek(offset)
        return handle.read(size)

    def close(self) -> None:
        handles, self._handles, self._window, cells, self._cells = self._handles, {}, (None, b""), self._cells, None
        for handle in handles.values():
            handle.close()
        if cells is not None:
            cells.close()

    def __enter__(self) -> "MemberReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
