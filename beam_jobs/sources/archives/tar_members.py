"""The member table of an uncompressed tar, read header by header, fast, and exactly as ``tarfile`` reads it.

In: a seekable file object over a ``.tar`` (local, an object store's ranged
reader, or a range of an outer tar). Out: :class:`Member` and :class:`Refused`
entries (see :mod:`archive_members`), in archive order.

Why not ``tarfile`` alone: it builds a full ``TarInfo`` per header (21 field
conversions), about 45 us a member: listing ImageNet's 1.28M members took a
minute, twice (the lister reads the headers in two passes to keep memory
flat). Most headers are plain ustar or GNU headers of a file or a folder; this
module checks and slices those itself (about 10 us) and hands every
other header to ``tarfile`` at its offset: GNU long names and pax headers,
sparse files, base-256 numbers, bad checksums, end markers, cuts. So what a
header means is always what ``tarfile`` says (a Hypothesis test compares the
two on mutated archives), and the hostile cases keep ``tarfile``'s handling.
"""

from __future__ import annotations

import re
import tarfile
from typing import BinaryIO, Iterator, NamedTuple, Optional, Union

from beam_jobs.sources.archives.archive_members import Entry, Member, Refused, normalise

_BLOCK = tarfile.BLOCKSIZE
_WINDOW = 64 << 10  # header bytes read at once: ~60 headers of tiny members; one read per header of large ones
# The number fields (mode, uid, gid, size, mtime, checksum, devmajor, devminor) as most tars write them: octal
# digits between spaces, then NULs or anything after a NUL. Others (base-256, signs, tabs) go to tarfile.
_NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156), (329, 337), (337, 345))
_OCTAL = re.compile(rb" *[0-7]* *(?:\0[\x00-\xff]*)?")
_SIMPLE_TYPES = frozenset(b"01234567\0")  # regular (0, 7, NUL), hard and symbolic links, devices, folder, FIFO
_REGULAR = frozenset(b"07\0")
# Global pax keys (a "g" header) that do not change what a member is; any other sends the rest to tarfile.
_HARMLESS_GLOBALS = frozenset({"comment", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "charset",
                               "hdrcharset"})


class _Header(NamedTuple):
    """What a member's header says, whether read here or by tarfile."""

    name: str
    kind: str  # "file", "folder", "symlink", "hardlink" or "special"
    linkname: str
    data_at: int  # where its bytes start, in the tar
    size: int
    next_at: int  # where the next header starts
    mtime_ns: int = 0  # its modification time: an update's stamp of the member (with its size)


def scan_tar(handle: BinaryIO, size: int, base: int = 0) -> Iterator[Entry]:
    """The members of an uncompressed tar of ``size`` bytes read through ``handle`` (which starts at ``base``
    of the outermost file), in archive order. Folders are left out: a folder is its members."""
    try:
        archive = tarfile.open(fileobj=handle, mode="r:")  # noqa: SIM115 (closed below; never extracts)
    except tarfile.ReadError as err:
        yield Refused("", "truncated-archive", f"no tar header could be read: {err}")
        return
    window = _Window(handle, size)
    with archive:
        offset, fast = 0, False  # the first header was read by tarfile.open: take it from tarfile
        while True:
            header = _read_header(window, offset, size) if fast else None
            if header is None:  # not a plain header: tarfile decides what it is
                try:
                    header = _tarfile_header(archive, offset)
                except (tarfile.ReadError, EOFError) as err:  # a cut or corrupt header: what came before stands
                    yield Refused("", "truncated-archive", f"the tar breaks after byte {archive.offset}: {err}")
                    return
                if header is None:
                    yield from _unless_ended(handle, archive.offset, size)
                    return
                fast = not set(archive.pax_headers) - _HARMLESS_GLOBALS
            entry = _entry(header, size, base)
            if entry is not None:
                yield entry
            if isinstance(entry, Refused) and entry.reason == "truncated-archive":
                return  # the archive ends inside this member: nothing follows
            offset = header.next_at


class _Window:
    """Reads of a file through a window of :data:`_WINDOW` bytes: consecutive small headers cost one read."""

    def __init__(self, handle: BinaryIO, size: int) -> None:
        self._handle, self._size, self._start, self._data = handle, size, 0, b""

    def block(self, offset: int) -> bytes:
        """The 512 bytes at ``offset`` (fewer at the end of the file)."""
        start = offset - self._start
        if start < 0 or start + _BLOCK > len(self._data):
            self._handle.seek(offset)  # tarfile shares the handle: always seek
            # Up to a byte short of the end: a BufferedReader (an object store's reader) drops its buffer once
            # read to its end, and tarfile's read of the end marker would then cost another request.
            self._start, self._data = offset, self._handle.read(max(_BLOCK, min(_WINDOW, self._size - offset - 1)))
            start = 0
        return self._data[start:start + _BLOCK]


def _read_header(window: _Window, offset: int, size: int) -> Optional[_Header]:
    """The plain ustar or GNU header at ``offset``, or None for anything tarfile must read (see the module)."""
    if offset + _BLOCK > size:
        return None
    block = window.block(offset)
    if len(block) < _BLOCK or block[156] not in _SIMPLE_TYPES:
        return None
    for start, end in _NUMBERS:  # tarfile refuses a header whose numbers do not read; these read plainly
        if _OCTAL.fullmatch(block, start, end) is None:
            return None
    if _octal(block[148:156]) != sum(block) - sum(block[148:156]) + 256:  # 256: the checksum field as spaces
        return None
    length, name, link, prefix = _octal(block[124:136]), block[:100], block[157:257], block[345:500]
    name = _text(name)
    folder = block[156] == 0x35 or block[156] == 0 and name.endswith("/")  # an old tar's folder: a file "x/"
    if prefix[0]:
        name = f"{_text(prefix)}/{name}"
    if folder:
        return _Header(name.rstrip("/"), "folder", "", offset + _BLOCK, length, offset + _BLOCK)
    mtime_ns = _octal(block[136:148]) * 1_000_000_000
    regular = block[156] in _REGULAR
    data_at = offset + _BLOCK
    next_at = data_at + (-(-length // _BLOCK) * _BLOCK if regular else 0)
    what = "file" if regular else {0x31: "hardlink", 0x32: "symlink"}.get(block[156], "special")
    return _Header(name, what, _text(link), data_at, length, next_at, mtime_ns)


def _octal(field: bytes) -> int:
    """A number field that :data:`_OCTAL` matched."""
    return int(field.split(b"\0", 1)[0].strip(b" ") or b"0", 8)


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")  # tarfile's defaults on POSIX


def _tarfile_header(archive: tarfile.TarFile, offset: int) -> Optional[_Header]:
    """The member at ``offset`` as tarfile reads it (None at the end); ``offset`` 0 is the one tarfile.open read."""
    if offset:
        archive.offset = offset
    info = archive.next()
    archive.members = []  # tarfile keeps every header it read: memory would follow the member count
    if info is None:
        return None
    if info.isdir():
        kind = "folder"
    elif info.issym() or info.islnk():
        kind = "symlink" if info.issym() else "hardlink"
    else:
        kind = "file" if info.isreg() and not info.issparse() else "special"
    return _Header(info.name, kind, info.linkname, info.offset_data, info.size, archive.offset,
                   round(float(info.mtime) * 1e9))


def _unless_ended(handle: BinaryIO, offset: int, size: int) -> Iterator[Refused]:
    """A refusal when the tar stops at ``offset`` without its end marker (cut short, or a corrupt header:
    tarfile takes either for the end)."""
    handle.seek(offset)
    block = handle.read(_BLOCK)
    if offset < size and len(block) == _BLOCK and not block.strip(b"\0"):
        return  # the end-of-archive marker
    what = "ends" if offset >= size else "breaks (not a tar header)"
    yield Refused("", "truncated-archive", f"the tar {what} at byte {offset}; the members before it are whole")


def _entry(header: _Header, size: int, base: int) -> Union[Entry, None]:
    if header.kind == "folder":  # nothing to place (folders come from files' paths): "./" of tar -C DIR . too
        return None
    path = normalise(header.name)
    if isinstance(path, Refused):
        return path
    if header.kind in ("symlink", "hardlink"):
        which = "symbolic" if header.kind == "symlink" else "hard"
        return Refused(path, "link", f"a {which} link to {header.linkname!r}")
    if header.kind == "special":
        return Refused(path, "special-file", "a device, FIFO or sparse file, not a regular file")
    if header.data_at + header.size > size:
        return Refused(path, "truncated-archive", f"the tar ends at byte {size}, inside this member "
                       f"({header.size} bytes from byte {header.data_at})")
    return Member(path, base + header.data_at, header.size, header.size, stamp=header.mtime_ns)
