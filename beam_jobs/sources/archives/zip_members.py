"""A zip's member table, read from its central directory without extracting or trusting it.

In:  a seekable file object over a ``.zip`` (local, or an object store's ranged reader), or a range of
     one (a zip inside an uncompressed tar).
Out: :class:`~beam_jobs.sources.archives.archive_members.Member` (where a regular file's bytes sit in the
     outermost file) or :class:`~beam_jobs.sources.archives.archive_members.Refused` (why a member is not
     converted: links, special files, encrypted, unsupported compression, zip bombs by ratio or by
     overlapping members, a missing local header), in archive order, as :mod:`tar_members` reads tars.
"""

from __future__ import annotations

import bisect
import stat
import struct
import zipfile
from typing import BinaryIO, Iterator, Union

from beam_jobs.sources.archives.archive_members import (DEFLATED, MAX_RATIO, RATIO_FLOOR, STORED, ArchiveError, Entry, Member,
                                               Refused, normalise)

_ZIP_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_ZIP_LOCAL_SIGNATURE = b"PK\x03\x04"


def scan_zip(handle: BinaryIO, base: int = 0, limit: int = 1 << 62) -> Iterator[Entry]:
    """The members of a zip read through ``handle`` (starting at ``base`` of the outermost file).

    ``limit``: the most bytes one member may inflate to (the caller's
    ``--max-pixels``-scale bound). Raises :class:`ArchiveError` when the
    central directory cannot be read.
    """
    try:
        archive = zipfile.ZipFile(handle)  # noqa: SIM115 (closed below)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as err:
        raise ArchiveError(f"not a readable zip: {err}") from err
    with archive:
        infos = archive.infolist()
    spans = _Spans()
    for info in infos:
        entry = _zip_entry(handle, info, base, limit)
        if isinstance(entry, Member) and entry.size:
            other = spans.overlapped(entry.offset, entry.offset + entry.size)
            if other is not None:
                entry = Refused(entry.path, "overlapping-member", f"its bytes overlap those of {other!r}")
            else:
                spans.add(entry.offset, entry.offset + entry.size, entry.path)
        if entry is not None:
            yield entry


def _zip_entry(handle: BinaryIO, info: zipfile.ZipInfo, base: int, limit: int) -> Union[Entry, None]:
    if info.is_dir():  # nothing to place (folders come from files' paths): "./" too
        return None
    path = normalise(info.filename)
    if isinstance(path, Refused):
        return path
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return Refused(path, "link", "a symbolic link")
    if stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # zipfile's own writestr leaves the type bits unset
        return Refused(path, "special-file", "a device, FIFO or socket, not a regular file")
    if info.flag_bits & 0x1:
        return Refused(path, "encrypted", "an encrypted member")
    if info.compress_type not in (STORED, DEFLATED):
        return Refused(path, "unsupported-compression", f"compression method {info.compress_type} "
                       "(stored and deflated members are read)")
    if info.file_size > limit or (info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * info.compress_size):
        return Refused(path, "suspicious-compression", f"claims {info.file_size} bytes from {info.compress_size} "
                       f"stored (at most {MAX_RATIO}x, and {limit} bytes, are read): a zip bomb")
    handle.seek(info.header_offset)
    header = handle.read(_ZIP_LOCAL_HEADER.size)
    if len(header) < _ZIP_LOCAL_HEADER.size or header[:4] != _ZIP_LOCAL_SIGNATURE:
        return Refused(path, "truncated-archive", f"no local header at byte {info.header_offset}")
    name_length, extra_length = _ZIP_LOCAL_HEADER.unpack(header)[1:]
    offset = base + info.header_offset + _ZIP_LOCAL_HEADER.size + name_length + extra_length
    return Member(path, offset, info.compress_size, info.file_size, info.compress_type, info.CRC)


class _Spans:
    """Byte ranges of the zip members accepted so far: disjoint, kept sorted, so a new member's overlap is
    found by bisection (a zip of a million members would take hours checked pairwise)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._paths: list[str] = []

    def overlapped(self, start: int, end: int) -> Union[str, None]:
        """The path of an accepted member whose bytes overlap ``start .. end``, if any."""
        index = bisect.bisect_right(self._starts, start)
        if index and self._ends[index - 1] > start:  # the range starting at or before ``start`` reaches into it
            return self._paths[index - 1]
        if index < len(self._starts) and self._starts[index] < end:  # the next range starts inside it
            return self._paths[index]
        return None

    def add(self, start: int, end: int, path: str) -> None:
        index = bisect.bisect_right(self._starts, start)
        self._starts.insert(index, start)
        self._ends.insert(index, end)
        self._paths.insert(index, path)
