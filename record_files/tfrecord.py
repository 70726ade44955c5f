"""The TFRecord file format, without TensorFlow: frames written and read, and byte-exact Example records.

The one home of the format: the converter writes shards with
:func:`frame_parts` and :func:`serialize_example`; the reader's ``verify``,
``inspect``, ``reindex``, its S3 stream and its first-record checks read them
with :func:`read_frames`, which checks both CRCs of every frame.

Why not ``tf.train.Example(...).SerializeToString()``: importing TensorFlow
costs seconds and hundreds of MB in every Beam worker, and protobuf serializes
map fields in arbitrary order unless asked to be deterministic. The subset of
protobuf that an Example of scalar features needs is small, and writing it here
makes the byte layout explicit: map entries sorted by key, exactly what
``SerializeToString(deterministic=True)`` produces (pinned by a test against
real TensorFlow).

The TFRecord frame is ``uint64 length, uint32 masked_crc32c(length), data,
uint32 masked_crc32c(data)``, little-endian, as TensorFlow's record writer and
Beam's ``WriteToTFRecord`` write it, and the CRC is CRC32C masked
(``((crc >> 15) | (crc << 17)) + 0xa282ead8``).
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import BinaryIO, Iterator, Mapping, Optional, Sequence, Union

import google_crc32c



class Floats(tuple):
    """A float list feature (``FloatList``, packed float32): boxes, areas."""


class Ints(tuple):
    """An int64 list feature (``Int64List``, packed varints): per-object classes, crowd flags, several labels."""


class ByteStrings(tuple):
    """A bytes list feature of any length (``BytesList``): per-object class texts, instance masks."""


# One value (bytes or int), or a typed list of any length: an empty list's type must still be known.
FeatureValue = Union[bytes, int, Floats, Ints, ByteStrings]

HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_BYTES = 4  # uint32 masked CRC of the data
FRAME_OVERHEAD = HEADER_BYTES + FOOTER_BYTES
_CRC_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data`` (``google-crc32c``, the implementation Beam prefers)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0:
        value += 1 << 64  # int64 is encoded as its two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [bytes([v]) for v in range(0x80)]


def _header(number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field (wire type 2) whose payload is ``length`` bytes."""
    return _TAGS[number] + _varint(length)


_TAGS = {number: bytes([(number << 3) | 2]) for number in (1, 2, 3)}  # the field numbers an Example uses


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field holding ``payload``."""
    return _header(number, len(payload)) + payload


@functools.lru_cache(maxsize=256)
def _key_field(key: str) -> bytes:
    """``MapEntry.key`` of one feature name (the same few keys every record)."""
    return _field(1, key.encode("utf-8"))


def _entry_parts(key: str, value: FeatureValue) -> list[bytes]:
    """One ``Features.feature`` map entry as parts whose concatenation is its encoding.

    Parts, not nested concatenations, so an image's bytes are copied once per
    record rather than once per nesting level (five levels deep).
    """
    if isinstance(value, bytes):
        return [bytes_entry_head(key, len(value)), value]
    if isinstance(value, (Floats, Ints)):
        return [list_entry(key, value)]
    if isinstance(value, int) and not isinstance(value, bool):
        kind, inner = 3, _packed(_varint(value))
    elif isinstance(value, ByteStrings):
        kind, inner = 1, [part for item in value for part in (_header(1, len(item)), item)]
    else:
        raise TypeError(f"feature values must be bytes, int, Floats, Ints or ByteStrings, got {type(value).__name__}")
    feature_length = sum(map(len, inner))
    feature_header = _header(kind, feature_length)
    value_length = len(feature_header) + feature_length
    value_header = _header(2, value_length)
    key = _key_field(key)
    entry_header = _header(1, len(key) + len(value_header) + value_length)
    return [entry_header, key, value_header, feature_header, *inner]


def list_entry(key: str, value: Union[Floats, Ints, ByteStrings]) -> bytes:
    """One map entry of a list feature as one bytes: what ``b"".join(_entry_parts(key, value))`` gives, in a few
    concatenations (a record's per-object lists are small: built whole, not as parts; #57 §6)."""
    if isinstance(value, Floats):  # Feature.float_list { packed value }
        kind, inner = 2, _packed_field(struct.pack(f"<{len(value)}f", *value))
    elif isinstance(value, Ints):  # Feature.int64_list { packed value }; varints of 0..127 are their byte
        small = value and 0 <= min(value) and max(value) < 0x80
        kind, inner = 3, _packed_field(bytes(value) if small else b"".join(_varint(int(v)) for v in value))
    else:  # Feature.bytes_list { value... }
        kind, inner = 1, b"".join(_TAGS[1] + _varint(len(item)) + item for item in value)
    feature = _TAGS[kind] + _varint(len(inner)) + inner
    entry_value = _TAGS[2] + _varint(len(feature)) + feature  # MapEntry.value
    key_field = _key_field(key)
    return _TAGS[1] + _varint(len(key_field) + len(entry_value)) + key_field + entry_value


def _packed_field(payload: bytes) -> bytes:
    """:func:`_packed` as one bytes."""
    return _TAGS[1] + _varint(len(payload)) + payload if payload else b""


def bytes_entry_head(key: str, length: int) -> bytes:
    """Every byte of a one-value bytes map entry before its ``length`` bytes of value: a writer that knows
    the value's length can put the value after it without building the entry (``Feature.bytes_list``)."""
    value_header = _header(1, length)  # BytesList.value
    feature_length = len(value_header) + length
    feature_header = _header(1, feature_length)  # Feature.bytes_list
    entry_value_length = len(feature_header) + feature_length
    entry_value_header = _header(2, entry_value_length)  # MapEntry.value
    key = _key_field(key)
    entry_header = _header(1, len(key) + len(entry_value_header) + entry_value_length)  # Features.feature
    return entry_header + key + entry_value_header + feature_header + value_header


def _packed(payload: bytes) -> list[bytes]:
    """A packed repeated field 1 holding ``payload``; an empty one is left out, as protobuf does."""
    return [_header(1, len(payload)), payload] if payload else []


def serialize_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a ``tf.train.Example`` whose features hold one bytes or int64 value, or a typed list.

    Equal to ``tf.train.Example(...).SerializeToString(deterministic=True)``.
    """
    parts = []
    for key in sorted(features):
        value = features[key]
        if isinstance(value, int):  # bools too: _entry_parts rejects them, as it rejects any other type
            parts.append(repeated_entry(key, value))
        else:
            parts.extend(_entry_parts(key, value))
    return example_of_entries(parts)


def example_of_entries(entries: Sequence[bytes]) -> bytes:
    """The serialized Example whose ``Features.feature`` map entries are ``entries``, already in key order
    (as :func:`serialize_example` sorts them)."""
    return _header(1, sum(map(len, entries))) + b"".join(entries)


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True must not hit the cached entry of 1
def repeated_entry(key: str, value: Union[int, bytes]) -> bytes:
    """One map entry of a feature whose value repeats from record to record (labels, sizes, channels, format,
    class names): cached, so a writer serializes each once a process."""
    return b"".join(_entry_parts(key, value))


def frame_parts(data: bytes) -> tuple[bytes, bytes]:
    """The TFRecord header and footer that frame ``data`` (written around it, saving a copy)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)), struct.pack("<I", masked_crc32c(data))


def frame_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord record."""
    header, footer = frame_parts(data)
    return header + data + footer


class FrameError(ValueError):
    """A TFRecord frame is damaged: ``args`` are (what, record number, file)."""

    def __init__(self, message: str, index: int, path: str = "") -> None:
        super().__init__(message, index, path)

    @property
    def record(self) -> int:
        return self.args[1]

    def __str__(self) -> str:
        message, index, path = self.args
        return f"{path} record {index}: {message}" if path else f"record {index}: {message}"


@dataclasses.dataclass(frozen=True)
class Frame:
    """One record of a TFRecord file: where its frame starts, the frame's size, and the record's bytes."""

    offset: int
    size: int
    data: bytes


def is_frame_header(header: bytes) -> bool:
    """``header`` (the first 12 bytes of a frame) holds a length whose CRC matches."""
    return len(header) == HEADER_BYTES and \
        struct.unpack("<I", header[8:])[0] == masked_crc32c(header[:8])


def read_frames(handle: BinaryIO, path: str = "", first_record: int = 0, offset: int = 0) -> Iterator[Frame]:
    """Every frame of a TFRecord file read from ``handle`` (at byte ``offset``, record ``first_record``).

    Both CRCs of every frame are checked. ``path`` only names the file in errors.

    Raises:
      FrameError: at the first damaged or cut frame, naming the file and the record.
    """
    index = first_record
    while True:
        header = _read_exactly(handle, HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise FrameError("truncated record header", index, path)
        if not is_frame_header(header):
            raise FrameError("length CRC mismatch", index, path)
        (length,) = struct.unpack("<Q", header[:8])
        data = _read_exactly(handle, length)
        footer = _read_exactly(handle, FOOTER_BYTES)
        if len(data) < length or len(footer) < FOOTER_BYTES:
            raise FrameError("truncated record data", index, path)
        if struct.unpack("<I", footer)[0] != masked_crc32c(data):
            raise FrameError("data CRC mismatch", index, path)
        yield Frame(offset, FRAME_OVERHEAD + length, data)
        index, offset = index + 1, offset + FRAME_OVERHEAD + length


def first_record(handle: BinaryIO, path: str = "") -> Optional[bytes]:
    """The first record of a TFRecord file, None when it has none (``FrameError`` when it is damaged)."""
    return next((frame.data for frame in read_frames(handle, path)), None)


def _read_exactly(handle: BinaryIO, size: int) -> bytes:
    """``size`` bytes, fewer only at the end: a network stream's ``read(n)`` may return less than it has."""
    data = handle.read(size)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = handle.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
