"""Records of a version's shard copied by offset into a new shard, frame by frame: no record parsed, no image read.

In:  OUT (local, or a prefix in S3 or GCS: read through :mod:`beam_jobs.files.store_files`), a shard's manifest
     entry (its file relative to OUT) and the indices of its records to keep; a local target file.
Out: the target shard (the same frames, in order) and its record index (``.idx``, :mod:`record_files.idx`), both
     fsynced; what was written (:class:`CopiedShard`). Used by :mod:`beam_jobs.update.shard_moves`, which
     compacts a shard that lost most of its records and merges small shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from typing import Sequence

from beam_jobs.files import store_files
from beam_jobs.files.version_store import VersionError
from record_files import idx, tfrecord


@dataclasses.dataclass(frozen=True)
class CopiedShard:
    """A shard written by :func:`copy_records`: its size, SHA-256, and its record index's size."""

    num_examples: int
    num_bytes: int
    sha256: str
    index_bytes: int


def copy_records(out: str, shard: dict, records: list[int], target: str) -> CopiedShard:
    """Copy records ``records`` (ascending) of the shard ``shard`` (a manifest entry, its file relative to OUT)
    frame by frame into ``target``, and write its record index: a compacted shard of the same record bytes.

    The frames are found through the shard's ``.idx`` when it is whole, else by reading the shard's frames;
    each frame copied must start with a sound header of the length the index gives.
    """
    path = store_files.path_in(out, shard["file"])
    frames = _frames(out, shard)
    digest, offset, written = hashlib.sha256(), 0, []
    with store_files.open_in(out, shard["file"]) as source, open(target, "wb") as sink:
        for record in records:
            start, size = frames[record]
            source.seek(start)
            data = source.read(size)
            (length,) = struct.unpack("<Q", data[:8]) if len(data) >= 8 else (-1,)
            if len(data) != size or not tfrecord.is_frame_header(data[:tfrecord.HEADER_BYTES]) \
                    or length + tfrecord.FRAME_OVERHEAD != size:
                raise VersionError(f"{path} record {record}: not the frame its record index says; run "
                                   f"python -m converter verify on {out}")
            sink.write(data)
            digest.update(data)
            written.append((offset, size))
            offset += size
        sink.flush()
        os.fsync(sink.fileno())
    return CopiedShard(len(records), offset, digest.hexdigest(), write_index(target, written))


def write_index(shard_path: str, frames: Sequence[tuple[int, int]]) -> int:
    """The record index of the local shard ``shard_path`` (its frames' ``(offset, size)``) written whole and
    fsynced beside it; its size in bytes."""
    text = idx.index_text(frames).encode("ascii")
    with open(idx.index_filename(shard_path), "wb") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return len(text)


def _frames(out: str, shard: dict) -> list[tuple[int, int]]:
    """``(offset, size)`` of every frame of OUT's shard ``shard``: from its index when it is whole."""
    index = store_files.read_in(out, idx.index_filename(shard["file"])) or b""
    if idx.is_complete(index, shard.get("file_records", shard["num_examples"]), shard["num_bytes"]):
        return [tuple(map(int, line.split())) for line in index.split(b"\n") if line]
    with store_files.open_in(out, shard["file"]) as handle:
        frames = tfrecord.read_frames(handle, store_files.path_in(out, shard["file"]))
        return [(frame.offset, frame.size) for frame in frames]
