"""What an archive holds, read without extracting it and without trusting it: the member table.

In: a seekable file object over a ``.zip`` (local, or an object store's ranged
reader), or a range of one (an archive inside an uncompressed tar); tars are
read by :mod:`zip_members` and tars by :mod:`tar_members` into these entries. Out: :class:`Member` (a
regular file: its normalised path and where its bytes sit in the outermost
file) or :class:`Refused` (a member that must not be converted, with a reason
for ``rejected.jsonl``), in archive order.

Archives come from strangers, so no member is trusted:

* ``unsafe-path``: an absolute name, a ``..`` component, or an empty name;
* ``link``: symbolic and hard links; ``special-file``: devices, FIFOs, sparse files;
* ``suspicious-compression``: a zip member that claims to inflate past
  :data:`MAX_RATIO` times its stored size (and past 1 MiB), or past the
  caller's byte limit: zip bombs are refused from the central directory,
  before a byte is inflated; ``overlapping-member``: a zip member whose bytes
  overlap another's (the other classic bomb); ``encrypted``; ``unsupported-compression``;
* ``truncated-archive``: the archive ends inside a member or a header; the
  members before the cut are whole and listed, the cut is one refusal naming
  where it broke.

A zip whose central directory cannot be read is an :class:`ArchiveError` (the
caller names the file): nothing in it can be located. Member bytes are read
with :func:`read_member`, which inflates with a bound, so memory never follows
what an archive claims; a large one is read as a stream (:func:`open_member`).

A listed member travels through the conversion as its *locator*
(``ImageRef.source``): a short text saying which file holds its bytes and
where (:func:`locator`, :func:`parse_locator`), or why it is refused
(:func:`refusal`). Plain files have the empty locator.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import io
import marshal
import posixpath
import tempfile
import zipfile
import zlib
from typing import BinaryIO, Callable, Iterator, Optional, Union

import numpy

# A member inflating past this many times its stored size (and past _RATIO_FLOOR bytes) is refused.
# Compressed images (JPEG, PNG, WebP) deflate by 1-1.1x; raw BMP or TIFF of photos by 2-4x; only flat
# synthetic images reach 100x, and a deflate bomb 1000x.
MAX_RATIO = 100
RATIO_FLOOR = 1 << 20
STORED, DEFLATED = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED


class UnreadableItem(ValueError):
    """An item whose bytes cannot be had from its locator (an archive member, a Parquet cell): ``reason`` is the
    rejection's. Validation rejects the one item; every source's read error is one of these."""

    def __init__(self, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.reason = reason


class ArchiveError(UnreadableItem):
    """An archive, or a member of one, that cannot be read (a ``.zip`` that is not one, a corrupt central
    directory, bytes that do not inflate to what the archive declares)."""

    def __init__(self, detail: str, reason: str = "corrupt-member") -> None:
        super().__init__(detail, reason)


@dataclasses.dataclass(frozen=True)
class Member:
    """A regular file in an archive: ``size`` stored bytes at ``offset`` of the outermost file."""

    path: str  # normalised: "/"-separated, no "./", no leading or trailing "/"
    offset: int
    size: int
    length: int  # bytes once inflated (== size when stored)
    method: int = STORED
    # What an update compares (docs/update.md, "Archives"), from the header only: a tar member's modification
    # time in ns, a zip member's CRC-32 of its bytes; 0 when the header says nothing.
    stamp: int = 0


@dataclasses.dataclass(frozen=True)
class Refused:
    """A member that is not converted, and why (a reason of ``rejected.jsonl`` and the detail)."""

    path: str
    reason: str
    detail: str


Entry = Union[Member, Refused]


class RangeFile(io.RawIOBase):
    """Bytes ``start .. start + size`` of a seekable file, as a file of their own (an archive in an archive)."""

    def __init__(self, handle: BinaryIO, start: int, size: int) -> None:
        super().__init__()
        self._handle, self._start, self._size, self._position = handle, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer) -> int:
        wanted = min(len(buffer), self._size - self._position)
        if wanted <= 0:
            return 0
        self._handle.seek(self._start + self._position)
        data = self._handle.read(wanted)
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)


def normalise(name: str) -> Union[str, Refused]:
    """A member's path as an extraction would place it, or why it must not be placed anywhere."""
    if not name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):  # "C:..." too
        return Refused(name or "(empty name)", "unsafe-path", "an absolute or empty member name")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        return Refused(name, "unsafe-path", "a member name with '..' points outside the archive")
    if not parts:
        return Refused(name, "unsafe-path", "an empty member name")
    return "/".join(parts)


# --- locators: where a listed member's bytes are, as text carried by its ImageRef --------------------------------

IN_SRC, IN_WORK, REFUSED = "a", "w", "!"


@dataclasses.dataclass(frozen=True)
class Located:
    """A member's bytes: ``member`` (offset, sizes, method) in ``file``.

    ``file`` is relative to SRC ("" when SRC itself is the archive), or to the
    run's work folder when ``in_work`` (a compressed archive inflated there).
    """

    file: str
    in_work: bool
    member: Member


def locator(file: str, member: Member, in_work: bool = False) -> str:
    """The text that locates ``member``'s bytes in ``file`` (see :class:`Located`)."""
    kind = IN_WORK if in_work else IN_SRC
    return f"{kind}:{member.method}:{member.offset}:{member.size}:{member.length}:{member.stamp}:{file}"


def refusal(reason: str, detail: str) -> str:
    """The locator of a member that is listed only to be rejected: validation reports ``reason`` and ``detail``."""
    return f"{REFUSED}{reason}\t{detail}"


def parse_locator(text: str) -> Union[Located, Refused]:
    """What :func:`locator` or :func:`refusal` wrote (raises ValueError on anything else)."""
    if text.startswith(REFUSED):
        reason, _, detail = text[1:].partition("\t")
        return Refused("", reason, detail)
    kind, method, offset, size, length, stamp, file = text.split(":", 6)
    if kind not in (IN_SRC, IN_WORK):
        raise ValueError(f"not a member locator: {text!r}")
    return Located(file, kind == IN_WORK, Member("", int(offset), int(size), int(length), int(method), int(stamp)))


def copy_member(handle: BinaryIO, member: Member, out: BinaryIO, chunk: int = 1 << 20) -> None:
    """Write ``member``'s inflated bytes to ``out``, a chunk at a time (memory: a chunk, whatever its size).

    Raises :class:`ArchiveError` when it does not inflate to exactly the length it declares.
    """
    stream = MemberStream(handle, member, chunk)
    while data := stream.read(chunk):
        out.write(data)


class MemberStream(io.RawIOBase):
    """``member``'s inflated bytes read front to back, ``chunk`` stored bytes fetched at a time from ``handle``
    (the outermost file): a large member (COCO's annotation file in ``annotations_trainval2017.zip``) is read
    as a stream, never held whole. Never inflates past the length the archive declared.

    Raises :class:`ArchiveError` (from ``read``) when the archive ends inside the member, or its bytes do
    not inflate to exactly that length. ``owned``: closing the stream closes ``handle``.
    """

    def __init__(self, handle: BinaryIO, member: Member, chunk: int = 1 << 20, owned: bool = False) -> None:
        super().__init__()
        self._handle, self._member, self._chunk, self._owned = handle, member, chunk, owned
        self._next, self._remaining = member.offset, member.size  # the stored bytes not fetched yet
        self._inflater = zlib.decompressobj(-zlib.MAX_WBITS) if member.method == DEFLATED else None
        self._tail = memoryview(b"")  # stored bytes fetched, not yet given out (or inflated)
        self._written = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        piece = self._piece(len(buffer))
        buffer[:len(piece)] = piece
        return len(piece)

    def _piece(self, size: int):
        path = self._member.path
        while True:
            if not self._tail and self._remaining:
                self._handle.seek(self._next)
                data = self._handle.read(min(self._chunk, self._remaining))
                if not data:
                    raise ArchiveError(f"{path}: the archive ends {self._remaining} bytes into it")
                self._next, self._remaining, self._tail = self._next + len(data), self._remaining - len(data), \
                    memoryview(data)
            if self._inflater is None:
                piece, self._tail = self._tail[:size], self._tail[size:]
            else:
                try:
                    piece = self._inflater.decompress(self._tail, size)
                except zlib.error as err:
                    raise ArchiveError(f"{path}: its deflated bytes are corrupt: {err}") from err
                self._tail = memoryview(self._inflater.unconsumed_tail)
            if piece:
                self._written += len(piece)
                if self._written > self._member.length:
                    raise ArchiveError(f"{path}: inflates past the {self._member.length} bytes it declares")
                return piece
            if not (self._tail or self._remaining):
                break
        if self._written != self._member.length:
            raise ArchiveError(f"{path}: inflates to {self._written} bytes, not the {self._member.length} it declares")
        return b""

    def close(self) -> None:
        if self._owned and not self.closed:
            self._handle.close()
        super().close()


def open_member(handle: BinaryIO, member: Member, owned: bool = False) -> BinaryIO:
    """``member``'s bytes as a buffered stream (:class:`MemberStream`); ``owned``: closing it closes ``handle``."""
    return io.BufferedReader(MemberStream(handle, member, owned=owned), 1 << 20)


def read_member(handle: BinaryIO, member: Member) -> bytes:
    """The bytes of ``member`` (inflated), reading ``handle`` (the outermost file) at its offset.

    Never inflates past the length the archive declared: a member that
    would is an :class:`ArchiveError`, so memory stays bounded by what was
    checked when the member was listed.
    """
    handle.seek(member.offset)
    stored = handle.read(member.size)
    if len(stored) < member.size:
        raise ArchiveError(f"{member.path}: the archive ends {member.size - len(stored)} bytes into it")
    return member_bytes(member, stored)


def member_bytes(member: Member, stored: bytes) -> bytes:
    """``member``'s bytes from its ``stored`` bytes: inflated, never past the length its archive declared.

    Raises :class:`ArchiveError` when they do not inflate to exactly that length.
    """
    if member.method == STORED:
        return stored
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        data = inflater.decompress(stored, member.length + 1)
    except zlib.error as err:
        raise ArchiveError(f"{member.path}: its deflated bytes are corrupt: {err}") from err
    if len(data) != member.length or inflater.unconsumed_tail:
        raise ArchiveError(f"{member.path}: inflates to other than the {member.length} bytes it declares")
    return data


def streamed_folder_members(scan: Callable[[], Iterator[Entry]], name: str = "") -> tuple[str, Iterator[Entry]]:
    """:func:`folder_members` in memory that does not follow the member count: two passes of ``scan()``.

    The first keeps an 8-byte hash of each member's path (8 MB a million
    members) and the top folders; the second yields the entries, a member
    replaced by a later one of the same path refused as ``duplicate-member``,
    members' paths stripped of the one top folder when :func:`folder_members` would.
    Returns ``(top folder stripped or "", entries)``.
    """
    hashes = array.array("Q")
    tops: set[str] = set()
    deeper = False
    for entry in scan():
        if isinstance(entry, Member):
            hashes.append(_path_hash(entry.path))
            if len(tops) < 2:
                tops.add(posixpath.dirname(entry.path).split("/")[0])
            deeper = deeper or entry.path.count("/") >= 2
    values = numpy.frombuffer(hashes, dtype=numpy.uint64) if hashes else numpy.zeros(0, numpy.uint64)
    ordered = numpy.sort(values)
    repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    last = {value: index for index, value in enumerate(values.tolist()) if value in repeated} if repeated else {}
    del hashes, values, ordered
    top = next(iter(tops)) if len(tops) == 1 else ""  # "" also when some member sits at the root
    if top and name and not deeper and name != top:
        top = ""  # one folder of files under another name: perhaps the archive's one class, kept

    def entries() -> Iterator[Entry]:
        index = 0
        for entry in scan():
            if isinstance(entry, Member):
                replaced = last and last.get(_path_hash(entry.path), index) != index
                index += 1
                if replaced:
                    yield Refused(entry.path, "duplicate-member", "a later member of the same name "
                                  "replaces it, as extraction would")
                    continue
                if top:
                    entry = dataclasses.replace(entry, path=_strip(entry.path, top))
            yield entry

    return top, entries()


def replayable(entries: Iterator[Entry], scratch: Optional[str] = None) -> Callable[[], Iterator[Entry]]:
    """``entries`` as a scan that runs twice (what :func:`streamed_folder_members` needs) reading them once.

    The first run passes them through, writing each to a local temporary
    file in ``scratch`` (about 60 bytes a member), the second reads that file
    back and deletes it. A tar's headers are spread through it, so scanning a
    tar in S3 or GCS downloads it: this keeps that to once, and memory flat.
    """
    spool = tempfile.TemporaryFile(dir=scratch)  # noqa: SIM115 (closed by the second run)
    runs = 0

    def scan() -> Iterator[Entry]:
        nonlocal runs
        runs += 1
        if runs == 1:
            for entry in entries:
                marshal.dump(entry_record(entry), spool)
                yield entry
            return
        assert runs == 2, "a replayable scan runs twice"
        spool.seek(0)
        with spool:
            while True:
                try:
                    record = marshal.load(spool)
                except EOFError:
                    return
                yield entry_from_record(record)

    return scan


def entry_record(entry: Entry) -> tuple:
    """``entry`` as a tuple of plain values, for ``marshal`` (:func:`entry_from_record` reads it back)."""
    if isinstance(entry, Member):  # dataclasses.astuple would cost 25 us a member
        return entry.path, entry.offset, entry.size, entry.length, entry.method, entry.stamp, True
    return entry.path, entry.reason, entry.detail, False


def entry_from_record(record: tuple) -> Entry:
    """The entry :func:`entry_record` wrote."""
    *fields, member = record
    return Member(*fields) if member else Refused(*fields)


def _strip(path: str, top: str) -> str:
    return path[len(top) + 1:] if top and path.startswith(top + "/") else path


def _path_hash(path: str) -> int:
    return int.from_bytes(hashlib.blake2b(path.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def folder_members(entries: Iterator[Entry], name: str = "") -> tuple[list[Member], list[Refused], str]:
    """The members an extraction would leave, as a folder: a later member of a name replaces an earlier one
    (as ``tar -x`` and ``unzip -o`` do; the earlier is refused as ``duplicate-member``).

    When every member sits under one top folder that is named ``name`` (the
    archive's own folder name: what ``zip -r x.zip x/`` makes) or that holds
    folders itself, that folder is the archive's folder: its name is returned,
    stripped from every member's path. One folder of files under another name (``cat.zip``
    holding ``kitten/*.jpg``) is kept: it may be the one class the archive holds.
    Refusals keep the name the archive stores (they have no place in the folder).
    """
    members: dict[str, Member] = {}
    refused: list[Refused] = []
    for entry in entries:
        if isinstance(entry, Refused):
            refused.append(entry)
            continue
        if entry.path in members:
            refused.append(Refused(entry.path, "duplicate-member", "a later member of the same name replaces "
                                   "it, as extraction would"))
        members[entry.path] = entry
    listed = list(members.values())
    tops = {posixpath.dirname(member.path).split("/")[0] for member in listed}
    deeper = any(member.path.count("/") >= 2 for member in listed)
    if len(tops) == 1 and "" not in tops and listed and (not name or deeper or name in tops):
        top = tops.pop()
        cut = len(top) + 1
        listed = [dataclasses.replace(member, path=member.path[cut:]) for member in listed]
        return listed, refused, top
    return listed, refused, ""
