"""The one format of the files that carry per-image records between the conversion's stages.

Per-image metadata never travels through a Beam shuffle (see
:mod:`beam_jobs.transforms`): stages write it to files in the run's work
folder and the next stage reads them. Those files share this small, versioned
binary format, defined here and nowhere else:

    header   MAGIC, format version (u8), kind (u8), number of buckets (u32)
    records  u32 length, then the record's bytes; in key order for sorted kinds
    index    (buckets + 1) u64 byte offsets: where each key bucket starts, then the end
    trailer  u64 offset of the index, END

A *bucket* is a range of the 16-byte key: ``bucket = key[:8] * buckets >> 64``,
so buckets are consecutive key ranges and reading bucket ``b`` of every sorted
file gives every record whose key falls in that range, with one seek per file.

Kinds of record (all big-endian):

* ``LISTED``: an image to read, as listed by the launcher: split code (u8),
  label (u32), relative path, then NUL and its source locator when it has one
  (an archive member), then NUL and its annotation when it has one (its objects,
  :mod:`beam_jobs.annotations`). Unsorted (no buckets).
* ``ACCEPTED``: a validated image, keyed by the keyed hash of its path that
  orders the records: key (16 B), path, NUL, then label, source SHA-256,
  height, width, channels, spill part, offset and length, stored bytes, the file's stamp (16 B, zeros for
  none), whether it has a perceptual hash (u8) and the hash (u64: the shard writer puts it in the records
  table), re-encode reason,
  and NUL and the source locator when there is one, then NUL and the placed annotation
  (:mod:`beam_jobs.placed_codec`: packed binary for objects, which may hold NULs: it is the record's last field).
  Sorting the raw bytes sorts by (key, path): the records' final order.
* ``CONTENT``: one accepted image for the duplicate searches: the first 16 bytes
  of its SHA-256, split code, label, flags (u8: :data:`HASHED`, it has a perceptual hash; :data:`KEPT`, a
  record an update keeps, fed from the latest version's records table: no thumbnail, never dropped) and the
  hash (u64), stored bytes (u64), objects (u32), the 8x8 gray thumbnail that verifies near pairs (64 B, zeros
  for none), path. Sorted by SHA-256 (the exact search's hash ranges).
* ``NEAR``: one band of one image's perceptual hash, for the near search: the band's position (u64:
  the band, then its value, spread over the key space so buckets are ranges of band values), then the
  image's CONTENT record. Each image has one per band (:mod:`beam_jobs.stages.near_duplicates`).
* ``DROPPED``: an evaluation image ``--drop-leaks`` leaves out: its ACCEPTED key (16 B), then its path;
  sorted, bucketed as its split's runs, so the ordering stage skips it.
* ``PATH`` and ``MEMBER``: the launcher's scratch lists while it plans (stage
  1): a listed file's path; an image's split code (u8), class name (u16
  length, then UTF-8) and path. Both end with NUL and the source locator when there is one.

Paths are UTF-8 with lone surrogates kept (``surrogatepass``), so a file whose
name is not UTF-8 round-trips to the same ``str`` the listing produced. About
100 bytes per image plus the path.
"""

from __future__ import annotations

import struct
from typing import BinaryIO, Callable, Generic, Iterable, Iterator, NamedTuple, Optional, TypeVar

import numpy as np
from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs.files import filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.stage_records import Accepted, ImageRef

MAGIC = b"IMGSHARDS-WORK"
END = b"WORK-END"
# 2: source locators (archive members); 3: annotations (an image's objects); 4: perceptual hashes;
# 5: the file's stamp in ACCEPTED records; 6: the thumbnail that verifies near pairs in CONTENT records;
# 7: the perceptual hash in ACCEPTED records (the records table); 8: NEAR positions of band b start at
# ceil(b * 2**64 / bands), so a range of buckets that is a multiple of the bands never straddles two bands;
# 9: ACCEPTED records' placed objects packed (beam_jobs.placed_codec), not JSON
VERSION = 9
LISTED, ACCEPTED, CONTENT, PATH, MEMBER, NEAR, DROPPED = 1, 2, 3, 4, 5, 6, 7

_HEADER = struct.Struct(">14sBBI")
_TRAILER = struct.Struct(">Q8s")
_LENGTH = struct.Struct(">I")
_LISTED = struct.Struct(">BI")
_ACCEPTED = struct.Struct(">I32sIIBIQIQ16sBQ")
_NO_STAMP = bytes(16)
_CONTENT = struct.Struct(">16sBIBQQI64s")
_NO_THUMBNAIL = bytes(64)
_NEAR = struct.Struct(">Q")
_MEMBER = struct.Struct(">BH")
_NO_SPILL = 0xFFFFFFFF
HASHED, KEPT = 1, 2  # a CONTENT record's flags: it has a perceptual hash; an update's kept record (no thumbnail)
KEY_BYTES = 16
_WRITE_CHUNK = 1 << 20
T = TypeVar("T")


class WorkFileError(RuntimeError):
    """A work file is not in this format or this version (a file from another run or release)."""


def split_code(split: str) -> int:
    return record_schema.SPLITS.index(split)


def _path_bytes(relpath: str) -> bytes:
    data = relpath.encode("utf-8", "surrogatepass")
    if b"\0" in data:
        raise ValueError(f"path {relpath!r} contains a NUL character, which no file name can")
    return data


def _path_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def bucket_of(key: bytes, buckets: int) -> int:
    """The bucket of a 16-byte key among ``buckets`` equal key ranges (monotone in the key)."""
    return (int.from_bytes(key[:8], "big") * buckets) >> 64


# --- records ---------------------------------------------------------------------------------------------------

def _with_source(data: bytes, source: str, annotation: bytes = b"") -> bytes:
    """``data``, then NUL and the source locator, then NUL and the annotation (each only when needed)."""
    if annotation:
        return data + b"\0" + source.encode("utf-8", "surrogatepass") + b"\0" + annotation
    return data + b"\0" + source.encode("utf-8", "surrogatepass") if source else data


def _and_source(data: bytes) -> tuple[str, str]:
    """``(text, source)`` of a field written by :func:`_with_source` (its annotation, if any, left out)."""
    text, source, _ = _and_annotation(data)
    return text, source


def _and_annotation(data: bytes) -> tuple[str, str, bytes]:
    """``(text, source, annotation)`` of a field written by :func:`_with_source`."""
    text, _, rest = data.partition(b"\0")
    source, _, annotation = rest.partition(b"\0")  # a locator holds no NUL; the annotation, last, may
    return _path_text(text), _path_text(source), annotation


def encode_listed(ref: ImageRef) -> bytes:
    return _LISTED.pack(split_code(ref.split), ref.label) + _with_source(_path_bytes(ref.relpath), ref.source,
                                                                         ref.annotation)


def decode_listed(record: bytes) -> ImageRef:
    code, label = _LISTED.unpack_from(record)
    relpath, source, annotation = _and_annotation(record[_LISTED.size:])
    return ImageRef(record_schema.SPLITS[code], relpath, label, source, annotation)


def encode_accepted(key: bytes, item: Accepted) -> bytes:
    """``item`` keyed by ``key`` (its keyed hash): the raw bytes sort in the records' final order."""
    part, offset, length = item.spill if item.spill else (_NO_SPILL, 0, 0)
    hashed = item.perceptual_hash is not None
    fields = _ACCEPTED.pack(item.ref.label, item.source_sha256, item.height, item.width, item.channels,
                            part, offset, length, item.stored_bytes, item.stamp or _NO_STAMP, hashed,
                            item.perceptual_hash if hashed else 0)
    return (key + _path_bytes(item.ref.relpath) + b"\0" + fields
            + _with_source(item.reencoded_because.encode("utf-8"), item.ref.source, item.ref.annotation))


def decode_accepted(record: bytes, split: str) -> Accepted:
    end = record.index(b"\0", KEY_BYTES)
    relpath = _path_text(record[KEY_BYTES:end])
    label, sha, height, width, channels, part, offset, length, stored, stamp, hashed, phash = \
        _ACCEPTED.unpack_from(record, end + 1)
    because, source, annotation = _and_annotation(record[end + 1 + _ACCEPTED.size:])
    spill = () if part == _NO_SPILL else (part, offset, length)
    return Accepted(ImageRef(split, relpath, label, source, annotation), sha, because, height, width, spill, channels,
                    stored, phash if hashed else None, stamp=b"" if stamp == _NO_STAMP else stamp)


class Content(NamedTuple):
    """An accepted image as the duplicate searches see it."""

    sha: bytes  # the first 16 bytes of the source file's SHA-256: plenty to tell files apart
    split: str
    label: int
    relpath: str
    perceptual_hash: Optional[int] = None
    stored_bytes: int = 0  # what leaving it out (--drop-leaks) takes off its split's counts
    objects: int = 0
    thumbnail: bytes = _NO_THUMBNAIL  # 8x8 gray, which verifies a near pair (zeros: none taken)
    kept: bool = False  # a record an update keeps (the latest version's), searched against, never dropped


def encode_kept_content(sha: bytes, split: str, label: int, perceptual_hash: Optional[int], stored_bytes: int,
                        objects: int, relpath: str) -> bytes:
    """A CONTENT record of a record an update keeps, from its row of the latest version's records table (no
    thumbnail: none was kept; the near search judges its pairs by the hash alone)."""
    hashed = perceptual_hash is not None
    return _CONTENT.pack(sha[:KEY_BYTES], split_code(split), label, KEPT | (HASHED if hashed else 0),
                         perceptual_hash if hashed else 0, stored_bytes, objects, _NO_THUMBNAIL) + _path_bytes(relpath)


def encode_content(item: Accepted, objects: int = 0) -> bytes:
    """``item`` for the duplicate searches; ``objects``: how many its record holds."""
    ref = item.ref
    hashed = item.perceptual_hash is not None
    return _CONTENT.pack(item.source_sha256[:KEY_BYTES], split_code(ref.split), ref.label, hashed,
                         item.perceptual_hash if hashed else 0, item.stored_bytes, objects,
                         item.thumbnail or _NO_THUMBNAIL) + _path_bytes(ref.relpath)


def decode_content(record: bytes) -> Content:
    sha, code, label, hashed, phash, stored, objects, thumbnail = _CONTENT.unpack_from(record)
    return Content(sha, record_schema.SPLITS[code], label, _path_text(record[_CONTENT.size:]),
                   phash if hashed & HASHED else None, stored, objects, thumbnail, bool(hashed & KEPT))


def encode_near(position: int, content: bytes) -> bytes:
    """A NEAR record: a band's ``position`` (u64, the key its file is sorted and bucketed by), then a CONTENT record."""
    return _NEAR.pack(position) + content


_NEAR_HEAD = struct.Struct(">Q16sBIBQ")
# The same heads as numpy reads them for every record of a part or a range at once (the searches' inner loops):
# a CONTENT record's SHA-256 prefix, split, label, whether hashed, hash; a NEAR record's position, then those.
CONTENT_HEAD = np.dtype([("sha", "V16"), ("split", "u1"), ("label", ">u4"), ("hashed", "u1"), ("phash", ">u8")])
NEAR_HEAD = np.dtype([("position", ">u8"), ("sha", "V16"), ("split", "u1"), ("label", ">u4"), ("hashed", "u1"),
                      ("phash", ">u8")])


def near_head(record: bytes) -> tuple[int, bytes, int]:
    """``(position, sha, perceptual hash)`` of a NEAR record, without decoding the rest (the search's inner loop)."""
    position, sha, _, _, _, phash = _NEAR_HEAD.unpack_from(record)
    return position, sha, phash


_NEAR_THUMBNAIL = _NEAR.size + _CONTENT.size - len(_NO_THUMBNAIL)  # where a NEAR record's thumbnail starts


def near_thumbnails(records: Iterable[bytes]) -> bytes:
    """The thumbnails of NEAR records, 64 bytes each, joined (for numpy to read at once)."""
    return b"".join(record[_NEAR_THUMBNAIL:_NEAR_THUMBNAIL + len(_NO_THUMBNAIL)] for record in records)


def decode_near(record: bytes) -> tuple[int, Content]:
    """``(position, content)`` of a NEAR record."""
    return _NEAR.unpack_from(record)[0], decode_content(record[_NEAR.size:])


def encode_dropped(key: bytes, relpath: str) -> bytes:
    """A DROPPED record: the image's ACCEPTED key and path, which its ACCEPTED record starts with (then NUL)."""
    return key + _path_bytes(relpath)


def accepted_prefix(record: bytes) -> bytes:
    """The key and path an ACCEPTED record starts with: what a DROPPED record holds."""
    return record[:record.index(b"\0", KEY_BYTES)]


def encode_path(relpath: str, source: str = "") -> bytes:
    return _with_source(_path_bytes(relpath), source)


def decode_path(record: bytes) -> str:
    """The path alone of a PATH record (its source, if any, left out)."""
    return _and_source(record)[0]


def decode_entry(record: bytes) -> tuple[str, str]:
    """``(path, source)`` of a PATH record."""
    return _and_source(record)


def encode_member(split: str, name: str, relpath: str, source: str = "") -> bytes:
    data = name.encode("utf-8", "surrogatepass")
    return _MEMBER.pack(split_code(split), len(data)) + data + _with_source(_path_bytes(relpath), source)


def decode_member(record: bytes) -> tuple[str, str, str, str]:
    """``(split, class name, path, source)``."""
    code, size = _MEMBER.unpack_from(record)
    start = _MEMBER.size
    return (record_schema.SPLITS[code], record[start:start + size].decode("utf-8", "surrogatepass"),
            *_and_source(record[start + size:]))


# --- files -----------------------------------------------------------------------------------------------------

def write_file(path: str, kind: int, records: Iterable[bytes], buckets: int = 0) -> list[int]:
    """Write ``records`` (already in key order when ``buckets``) to ``path``; return the count per bucket.

    Written whole (:func:`beam_jobs.files.filesystems.whole_file`): a reader, or a
    resumed run, never sees half a file; a retried task rewrites the same bytes.
    """
    counts = [0] * buckets
    offsets = [0] * (buckets + 1)
    with filesystems.whole_file(path) as handle:
        handle.write(_HEADER.pack(MAGIC, VERSION, kind, buckets))
        position = _HEADER.size
        bucket = 0
        pending: list[bytes] = []  # written a chunk at a time: two writes per record cost more than the records
        flushed = position + _WRITE_CHUNK
        pack = _LENGTH.pack
        for record in records:
            if buckets:
                current = bucket_of(record, buckets)
                while bucket < current:  # buckets before this record's end here
                    bucket += 1
                    offsets[bucket] = position
                counts[current] += 1
            pending.append(pack(len(record)))
            pending.append(record)
            position += _LENGTH.size + len(record)
            if position >= flushed:
                handle.write(b"".join(pending))
                pending.clear()
                flushed = position + _WRITE_CHUNK
        handle.write(b"".join(pending))
        while bucket < buckets:
            bucket += 1
            offsets[bucket] = position
        if buckets:
            offsets[0] = _HEADER.size
        index = position
        handle.write(struct.pack(f">{buckets + 1}Q", *offsets) if buckets else struct.pack(">Q", position))
        handle.write(_TRAILER.pack(index, END))
    return counts


def _open(path: str) -> BinaryIO:
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _check_header(data: bytes, path: str, kind: int) -> int:
    if len(data) < _HEADER.size:
        raise WorkFileError(f"{path} is truncated")
    magic, version, found, buckets = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or found != kind:
        raise WorkFileError(f"{path} is not a version-{VERSION} work file of kind {kind} "
                            f"(found {magic!r} v{version} kind {found}); it was written by another release")
    return buckets


def read_all(path: str, kind: int) -> list[bytes]:
    """Every record of ``path``, in file order."""
    with _open(path) as handle:
        data = handle.read()
    _check_header(data, path, kind)
    index, end = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    if end != END:
        raise WorkFileError(f"{path} is truncated (no trailer)")
    return whole_records(data[_HEADER.size:index])[0]  # records end where the index starts


def _index_offset(handle: BinaryIO, path: str) -> int:
    """Where the file's index starts (its records end), from the trailer."""
    handle.seek(0, 2)
    handle.seek(handle.tell() - _TRAILER.size)
    index, end = _TRAILER.unpack(handle.read(_TRAILER.size))
    if end != END:
        raise WorkFileError(f"{path} is truncated (no trailer)")
    return index


def iter_file(path: str, kind: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """Every record of ``path`` in order, reading ``chunk_bytes`` at a time (bounded memory)."""
    with _open(path) as handle:
        _check_header(handle.read(_HEADER.size), path, kind)
        index = _index_offset(handle, path)
        handle.seek(_HEADER.size)
        yield from _stream(handle, index - _HEADER.size, chunk_bytes)


def _stream(handle: BinaryIO, remaining: int, chunk_bytes: int) -> Iterator[bytes]:
    tail = b""
    while remaining > 0:
        data = handle.read(min(chunk_bytes, remaining))
        if not data:
            raise WorkFileError("a work file is shorter than its index says")
        remaining -= len(data)
        data = tail + data
        records, used = whole_records(data)
        tail = data[used:]
        yield from records
    if tail:
        raise WorkFileError("a work file ends inside a record")


def read_bucket(path: str, kind: int, bucket: int) -> list[bytes]:
    """The records of one key bucket of a sorted file: a seek and two reads, whatever the file's size."""
    with _open(path) as handle:
        start, stop = _bucket_span(handle, path, kind, bucket)
        handle.seek(start)
        return whole_records(handle.read(stop - start))[0]


def bucket_span(path: str, kind: int, bucket: int) -> tuple[int, int]:
    """``(start, stop)``: the byte offsets of bucket ``bucket``'s records in a sorted file (for
    :func:`read_span`, which reads them a piece at a time)."""
    with _open(path) as handle:
        return _bucket_span(handle, path, kind, bucket)


def _bucket_span(handle: BinaryIO, path: str, kind: int, bucket: int) -> tuple[int, int]:
    buckets = _check_header(handle.read(_HEADER.size), path, kind)
    if not 0 <= bucket < buckets:
        raise WorkFileError(f"{path} has {buckets} buckets; bucket {bucket} was asked for")
    handle.seek(_index_offset(handle, path) + 8 * bucket)
    return struct.unpack(">2Q", handle.read(16))


def read_span(path: str, start: int, size: int) -> bytes:
    """``size`` bytes of ``path`` from ``start`` (a piece of a bucket :func:`bucket_span` located)."""
    with _open(path) as handle:
        handle.seek(start)
        data = handle.read(size)
    if len(data) != size:
        raise WorkFileError(f"{path} is shorter than its index says")
    return data


def whole_records(data: bytes) -> tuple[list[bytes], int]:
    """The records that ``data`` (a piece of a file's records) holds whole, and the bytes they take: the rest
    is the start of the next record."""
    records, position = [], 0
    while position + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, position)
        if position + _LENGTH.size + length > len(data):
            break
        records.append(data[position + _LENGTH.size:position + _LENGTH.size + length])
        position += _LENGTH.size + length
    return records, position


class Spilled(Generic[T]):
    """A re-iterable sequence kept in a local scratch file, decoded as it is read: O(1) memory at any length.

    The launcher's lists while it plans (every listed path, every image's
    class) are these, so it holds counters, not images.
    """

    def __init__(self, path: str, kind: int, decode: Callable[[bytes], T], count: int) -> None:
        self.path, self._kind, self._decode, self._count = path, kind, decode, count

    def __iter__(self) -> Iterator[T]:
        return map(self._decode, iter_file(self.path, self._kind))

    def __len__(self) -> int:
        return self._count


def spill(path: str, kind: int, items: Iterable[T], encode: Callable[[T], bytes],
          decode: Callable[[bytes], T]) -> Spilled:
    """Write ``items`` to ``path`` as they come; return them as a re-iterable :class:`Spilled`."""
    count = 0

    def encoded() -> Iterator[bytes]:
        nonlocal count
        for item in items:
            count += 1
            yield encode(item)

    write_file(path, kind, encoded())
    return Spilled(path, kind, decode, count)
