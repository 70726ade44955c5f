"""Shards another tool wrote (TFDS, the Inception scripts, anyone's ``tf.io.TFRecordWriter``): no manifest.

In:  each split's shard files (a list, or one glob pattern), and the feature keys a pipeline will read.
Out: a :class:`~reader.info.DatasetInfo` that stands in for a manifest (each file's records counted once),
     and checks that name the shard and the fix where TensorFlow's own errors would name neither
     (compressed files, missing keys, text labels).
"""

from __future__ import annotations

import os
from typing import Sequence, Union

import tensorflow as tf

from reader import storage
from reader.info import DatasetInfo, ShardInfo, SplitInfo
from record_files import tfrecord


def foreign_dataset_info(split_files: dict[str, Union[str, Sequence[str]]], classes: Sequence[str] = ()) -> DatasetInfo:
    """A :class:`DatasetInfo` for shards written by another tool (no manifest).

    ``split_files`` maps each split to its shard files: a list of paths, or
    one glob pattern (``"data/train-*.tfrecord"``, expanded in sorted order).
    Counts each file's records once (a sequential read of the file), so the
    pipelines can check every shard and ``steps_per_epoch(info, ...)`` works.

    Raises:
      ValueError: a split with no files (or a pattern matching none), a
        GZIP-compressed or unreadable shard (named).
      FileNotFoundError: a listed file that does not exist.
    """
    splits = {}
    for name, files in split_files.items():
        if isinstance(files, (str, bytes, os.PathLike)):
            pattern = os.fsdecode(files)
            files = sorted(tf.io.gfile.glob(pattern))
            if not files:
                raise ValueError(f"split {name!r}: the pattern {pattern!r} matches no files")
        if not files:
            raise ValueError(f"split {name!r} lists no files")
        shards = []
        for path in files:
            if not tf.io.gfile.exists(path):
                raise FileNotFoundError(f"shard file {path} does not exist")
            _check_not_compressed(path)
            try:
                count = int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
            except tf.errors.DataLossError as err:
                raise ValueError(f"shard file {path} is not a readable TFRecord file: {err.message}") from None
            shards.append(ShardInfo(path, count, tf.io.gfile.stat(path).length, ""))
        splits[name] = SplitInfo(name, sum(s.num_examples for s in shards), sum(s.num_bytes for s in shards),
                                 tuple(shards), ())
    return DatasetInfo("", tuple(classes), splits, {})


_GZIP_MAGIC = b"\x1f\x8b"
_ZLIB_FIRST = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")


def _check_not_compressed(path: str) -> None:
    """A GZIP or ZLIB TFRecord file is named as such (TensorFlow says only "corrupted record at 0")."""
    with storage.open_read(path) as handle:
        head = handle.read(tfrecord.HEADER_BYTES)
    if tfrecord.is_frame_header(head):
        return  # a valid first frame (its length bytes may look like a magic number by chance)
    kind = "GZIP" if head[:2] == _GZIP_MAGIC else "ZLIB" if head[:2] in _ZLIB_FIRST else None
    if kind:
        raise ValueError(f"shard file {path} is {kind}-compressed; this reader reads uncompressed TFRecord files "
                         f"(as the converter writes them). Decompress it first, e.g. by reading it with "
                         f"tf.data.TFRecordDataset(path, compression_type={kind!r}) and writing it with "
                         "tf.io.TFRecordWriter")


def check_foreign_shards(split_info: SplitInfo, keys) -> None:
    """The first record of a foreign split has ``keys``' image bytes and integer label, or a message naming them.

    TensorFlow's own error for a missing key or a string label comes from
    inside the pipeline and names neither the shard nor ``keys=``.

    Raises:
      ValueError: naming the shard, the keys its records have, and the fix.
    """
    path = split_info.files[0]
    _check_not_compressed(path)
    try:
        with storage.open_read(path) as handle:
            data = tfrecord.first_record(handle, path)
    except tfrecord.FrameError as err:
        raise ValueError(f"shard {path} is not a readable TFRecord file: {err}") from None
    if data is None:
        return  # an empty shard: nothing to check
    try:
        features = tf.train.Example.FromString(data).features.feature
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ValueError(f"shard {path}: its first record is not a tf.train.Example ({err})") from None
    found = {name: feature.WhichOneof("kind") for name, feature in features.items()}
    listed = ", ".join(f"{name} ({kind})" for name, kind in sorted(found.items()))
    hint = ("pass keys=reader.FeatureKeys(image=..., label=...) naming them in foreign=reader.ForeignShards(...) "
            "(TFDS: reader.FeatureKeys.tfds())")
    if found.get(keys.image) != "bytes_list":
        raise ValueError(f"shard {path}: its records have no image bytes under {keys.image!r}; they hold "
                         f"{listed}; {hint}")
    if keys.label not in found:
        raise ValueError(f"shard {path}: its records have no label under {keys.label!r}; they hold {listed}; {hint}")
    if found[keys.label] != "int64_list":
        raise ValueError(f"shard {path}: the label {keys.label!r} is {found[keys.label]}, not an integer; this "
                         "reader needs integer class ids (map the names to ids when writing the shards)")
