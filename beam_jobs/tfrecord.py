"""Byte-exact ``tf.train.Example`` serialization and TFRecord framing, without TensorFlow.

Why not ``tf.train.Example(...).SerializeToString()``: importing TensorFlow
costs seconds and hundreds of MB in every Beam worker, and protobuf serializes
map fields in arbitrary order unless asked to be deterministic. The subset of
protobuf that an Example of scalar features needs is small, and writing it here
makes the byte layout explicit: map entries sorted by key, exactly what
``SerializeToString(deterministic=True)`` produces (pinned by a test against
real TensorFlow).

The TFRecord frame is ``uint64 length, uint32 masked_crc32c(length), data,
uint32 masked_crc32c(data)``, little-endian, as TensorFlow's record writer and
Beam's ``WriteToTFRecord`` write it (the CRC is ``record_schema.masked_crc32c``).
"""

from __future__ import annotations

import functools
import struct
from typing import Mapping, Union

from record_schema import masked_crc32c

FeatureValue = Union[bytes, int]

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


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


@functools.lru_cache(maxsize=256)
def _key_field(key: str) -> bytes:
    """``MapEntry.key`` of one feature name (the same few keys every record)."""
    return _field(1, key.encode("utf-8"))


def _feature(value: FeatureValue) -> bytes:
    if isinstance(value, bytes):
        return _field(1, _field(1, value))  # Feature.bytes_list { value: ... }
    if isinstance(value, int) and not isinstance(value, bool):
        return _field(3, _field(1, _varint(value)))  # Feature.int64_list { packed value }
    raise TypeError(f"feature values must be bytes or int, got {type(value).__name__}")


def serialize_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a ``tf.train.Example`` whose features each hold one bytes or int64 value.

    Equal to ``tf.train.Example(...).SerializeToString(deterministic=True)``.
    """
    entries = b"".join(_field(1, _key_field(key) + _field(2, _feature(features[key]))) for key in sorted(features))
    return _field(1, entries)



def frame_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord record."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))
