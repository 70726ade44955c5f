"""The on-disk contract between the converter (writer) and the reader.

Both sides import this module and nothing else of each other, so a change to a
key, a file name or the manifest layout is made here once. It deliberately
imports neither TensorFlow nor Apache Beam: the Beam workers stay light (no
multi-second TensorFlow import per worker) and the reader never pulls in Beam.

Record keys follow the de-facto standard of the tensorflow/models conversion
scripts (``image/encoded``, ``image/class/label``, ...), so existing parsers and
DALI's TFRecord reader work on our shards unchanged.
"""

from __future__ import annotations

import re
from typing import Final

import google_crc32c

# Bump when the manifest or record layout changes incompatibly; readers refuse
# manifests whose version they do not know.
FORMAT_VERSION: Final = 1

# Feature keys of every tf.train.Example we write.
IMAGE_ENCODED: Final = "image/encoded"
IMAGE_FORMAT: Final = "image/format"
LABEL: Final = "image/class/label"
LABEL_TEXT: Final = "image/class/text"
HEIGHT: Final = "image/height"
WIDTH: Final = "image/width"
CHANNELS: Final = "image/channels"
FILENAME: Final = "image/filename"
SHA256: Final = "image/key/sha256"

# key -> proto value kind ("bytes" or "int64"); every key holds exactly one value.
FEATURES: Final[dict[str, str]] = {
    IMAGE_ENCODED: "bytes",
    IMAGE_FORMAT: "bytes",
    LABEL: "int64",
    LABEL_TEXT: "bytes",
    HEIGHT: "int64",
    WIDTH: "int64",
    CHANNELS: "int64",
    FILENAME: "bytes",
    SHA256: "bytes",
}

IMAGE_FORMAT_JPEG: Final = b"jpeg"
CHANNELS_RGB: Final = 3
# Images with a shorter side under this are reported (TF Model Garden's crop fails on 1-3 px images).
SMALL_SIDE: Final = 32
CHANNELS_GRAY: Final = 1  # a grayscale JPEG stored byte for byte; decode with channels=3 for RGB

# Files in a published dataset directory.
MANIFEST_FILE: Final = "manifest.json"
LABELS_FILE: Final = "labels.txt"
REJECTED_FILE: Final = "rejected.jsonl"
# Every group of identical images, one JSON list of {"split", "label", "path"} per line (the manifest lists a few).
DUPLICATES_FILE: Final = "duplicates.jsonl"

# A conversion stopped before it published keeps its finished work for the same command to resume, in a
# staging folder beside a local OUT (.<name>.staging-<run>) or inside an object store's (OUT/.staging-<run>),
# resumable while it holds RESUME_RECORD_PATH (beam_jobs.resume). inspect reports such folders.
STAGING_PREFIX: Final = ".staging-"
RESUME_RECORD_PATH: Final = "_work/resume.json"

# Split names, in the order they are reported. "val" is accepted on input.
SPLITS: Final = ("train", "validation", "test")
SPLIT_ALIASES: Final[dict[str, str]] = {"val": "validation"}

_SHARD_RE: Final = re.compile(r"^(?P<split>[^/]+)-(?P<index>\d{5,})-of-(?P<count>\d{5,})\.tfrecord$")


# TFRecord framing: uint64 length, uint32 masked_crc32c(length), data, uint32 masked_crc32c(data).
_CRC_MASK_DELTA: Final = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data`` (``google-crc32c``, the implementation Beam prefers)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def shard_filename(split: str, index: int, count: int) -> str:
    """Name of shard ``index`` (0-based) of ``count`` shards of ``split``."""
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is outside 0..{count - 1}")
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


# What ``python -m converter tfds-metadata`` adds (reader/tfds_metadata.py): TFDS's own files.
TFDS_NAME: Final = "imgshards"
TFDS_METADATA_FILES: Final = ("dataset_info.json", "features.json", "image-class-label.labels.txt")

# DALI's index of a shard (what its tfrecord2idx writes): "offset size" of every record, one per line.
DALI_INDEX_SUFFIX = ".idx"


_INDEX_LINE: Final = re.compile(rb"^(\d+) (\d+)$")


def index_offset(index: bytes, record: int) -> int | None:
    """The byte offset of ``record`` from a record index's text ("offset size" per line), or None when the
    index does not reach it soundly: every line up to it parses, the first offset is 0, and each offset is
    the previous one plus its size. A reader that gets None reads through the records before it instead.
    """
    lines = index.split(b"\n", record + 1)[:record + 1]
    if len(lines) <= record:
        return None
    expected = 0
    for line in lines:
        match = _INDEX_LINE.match(line)
        if not match or int(match.group(1)) != expected:
            return None
        offset, expected = expected, expected + int(match.group(2))
    return offset


def dali_index_filename(shard: str) -> str:
    return shard + DALI_INDEX_SUFFIX


def parse_shard_filename(name: str) -> tuple[str, int, int] | None:
    """Inverse of :func:`shard_filename`: ``(split, index, count)`` or None."""
    match = _SHARD_RE.match(name)
    if match is None:
        return None
    return match["split"], int(match["index"]), int(match["count"])
