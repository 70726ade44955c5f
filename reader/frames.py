"""A TFRecord file's frames read back with both CRCs checked: its records, their places, and the file's SHA-256.

In:  a shard's path (local, S3 or GCS: :mod:`reader.storage`).
Out: its records (:func:`iter_records`; with their places, :func:`framed_records`; a run of them,
     :func:`extent_records`), each frame's ``(offset, size)`` (:func:`iter_frames`, the record index
     :mod:`reader.record_index` checks and builds), the file's SHA-256 (:func:`file_sha256`).

Here, not in the dataset tools (:mod:`reader.tools.verify`), since the input pipeline's record index needs them
and nothing of the pipeline imports the tools.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Iterator

from reader import storage
from record_files import idx
from record_files.tfrecord import read_frames


def iter_records(path: str) -> Iterator[bytes]:
    """The records of a TFRecord file, checking both CRCs of every frame.

    Raises:
      FrameError: at the first damaged frame, naming the file and the record.
    """
    for _, _, data in framed_records(path):
        yield data


def iter_frames(path: str) -> Iterator[tuple[int, int]]:
    """``(offset, size)`` of every framed record of a TFRecord file (its record index), CRCs checked.

    Raises:
      FrameError: at the first damaged frame.
    """
    for offset, size, _ in framed_records(path):
        yield offset, size


def framed_records(path: str) -> Iterator[tuple[int, int, bytes]]:
    """``(offset, size, record)`` of every frame of a TFRecord file, CRCs checked (FrameError at a damaged one)."""
    with storage.open_read(path) as handle:
        for frame in read_frames(handle, path):
            yield frame.offset, frame.size, frame.data


def extent_records(path: str, index_path: str, first: int, count: int) -> Iterator[bytes]:
    """``count`` records of a TFRecord file from its record ``first`` (CRCs checked), seeking to it with the
    file's record index (``index_path``; "" or an index that does not reach it soundly: the records before it
    are read through). The records outside the run are not read when the index gives the offset: a masked
    version's deleted records (docs/update.md).

    Raises:
      FrameError: at a damaged frame; ValueError when the file ends before the run does (naming both).
    """
    offset = None
    if first and index_path and not storage.is_s3(path) and storage.exists(index_path):  # S3's stream cannot seek
        with storage.open_read(index_path) as handle:
            offset = idx.offset_of(handle.read(), first)
    with storage.open_read(path) as handle:
        if offset is not None:
            handle.seek(offset)
            frames = read_frames(handle, path, first, offset)
        else:
            frames = itertools.islice(read_frames(handle, path), first, None)
        read = 0
        for frame in itertools.islice(frames, count):
            read += 1
            yield frame.data
    if read < count:
        raise ValueError(f"{path} ends after {first + read} records: its run of {count} from record {first} "
                         "is cut (python -m converter verify checks it)")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with storage.open_read(path) as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()
