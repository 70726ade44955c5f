"""Stages from shard files to parsed features: file order, parallel interleave, parse.

Every shard is read with its record count from the manifest and checked at
its end: a shard that is corrupt or truncated (even at a record boundary,
which TFRecord's own CRCs cannot notice) fails with an error naming the file,
instead of TensorFlow's nameless ``DataLossError: corrupted record at 3145``.
With ``skip_corrupt=True`` the rest of such a shard is skipped instead, with a
warning naming it and the number of records lost.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Optional, Sequence

import tensorflow as tf

from reader import record_index, storage
from reader.info import DatasetInfo, ShardInfo, SplitInfo
from reader.options import FeatureKeys
from reader.order import OffsetTFRecordDataset
from record_files import idx

AUTOTUNE = tf.data.AUTOTUNE
# Read-ahead per open shard on remote file systems (gs://...), as TFDS uses. Local shards keep TensorFlow's
# 256 KiB default: 8 MiB read the same records 1.3x slower from the page cache (310 MB, 6 rounds).
READ_BUFFER_BYTES = 8 << 20
UNKNOWN_COUNT = -1
# Records counted per call of the shard check (see read_shard).
CHECK_BATCH = 256


def file_order(
    files: Sequence[str],
    counts: Optional[Sequence[int]] = None,
    seed: Optional[int] = None,
    epoch: "tf.Tensor | int" = 0,
    num_shards: int = 1,
    shard_index: int = 0,
    extents: Optional[Sequence[ShardInfo]] = None,
) -> tf.data.Dataset:
    """``(path, num_records)`` of the shard files one input pipeline reads in ``epoch``.

    ``extents``: a masked split's extents (``SplitInfo.shards`` when ``SplitInfo.masked``), one per entry of
    ``files``: the elements are then ``(path, num_records, index_path, first, offset)``, each a run of its file
    and its first byte (:func:`reader.record_index.extent_offsets`), which :func:`interleave_records` reads
    with :func:`read_segment` (None: whole files, read with :func:`read_shard`).

    With a seed, files are shuffled by a stateless shuffle keyed on (seed,
    epoch) *before* being sharded across ``num_shards`` input pipelines, so
    every pipeline computes the same permutation: the pipelines' file sets are
    disjoint and together complete, and change every epoch (the TF Model
    Garden scheme; TFDS's shard-then-shuffle gives each worker a fixed subset).
    """
    if counts is None:
        counts = [UNKNOWN_COUNT] * len(files)
    if len(counts) != len(files):
        raise ValueError(f"counts has {len(counts)} entries for {len(files)} files")
    columns = [tf.constant(list(files), tf.string), tf.constant(list(counts), tf.int64)]
    if extents is not None:
        columns += [tf.constant([e.index_path for e in extents], tf.string),
                    tf.constant([e.first for e in extents], tf.int64),
                    tf.constant(record_index.extent_offsets(extents), tf.int64)]
    if seed is not None:
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.random.experimental.stateless_shuffle(tf.range(len(files)), seed=key)
        columns = [tf.gather(column, order) for column in columns]
    dataset = tf.data.Dataset.from_tensor_slices(tuple(columns))
    if num_shards > 1:
        dataset = dataset.shard(num_shards, shard_index)
    return dataset


@dataclasses.dataclass(frozen=True)
class LabelRange:
    """Labels a shard's records must carry: ``0 <= label + offset < num_classes`` (no upper bound if 0).

    Checked while reading shards that the converter did not write, so a
    foreign shard with a stray label fails naming the shard instead of
    training on it (or reaching a loss function as an out-of-range index).
    """

    key: str
    offset: int = 0
    num_classes: int = 0


def read_shard(path: tf.Tensor, num_records: tf.Tensor, skip_corrupt: bool = False,
               labels: Optional[LabelRange] = None, s3: bool = False,
               read_buffer: Optional[int] = None) -> tf.data.Dataset:
    """Serialized records of one shard, checked against its expected record count.

    ``num_records`` < 0 skips the check (files not listed in a manifest).
    ``labels`` also checks every record's label (see :class:`LabelRange`);
    with ``skip_corrupt`` such records are dropped with a warning. ``s3``:
    the shards are ``s3://`` objects, streamed by :mod:`reader.storage`.
    ``read_buffer``: bytes of read-ahead (None: TensorFlow's default; see
    :data:`READ_BUFFER_BYTES`).

    The check costs next to nothing: records are counted in batches of
    :data:`CHECK_BATCH` (a function call per record would cost more than
    reading the record) and an empty batch marks the end of the shard, which
    ``unbatch`` then drops by itself.
    """
    return _checked(_open_records(path, s3, skip_corrupt, read_buffer), path, num_records, skip_corrupt, labels, s3)


def read_segment(path: tf.Tensor, index_path: tf.Tensor, first: tf.Tensor, count: tf.Tensor,
                 skip_corrupt: bool = False, labels: Optional[LabelRange] = None, s3: bool = False,
                 read_buffer: Optional[int] = None, offset: Optional[tf.Tensor] = None) -> tf.data.Dataset:
    """``count`` serialized records of one shard from its record ``first``, checked as :func:`read_shard` checks.

    ``index_path``: the shard's record index, which gives the byte where
    record ``first`` starts; "" when it has none: then the records before
    it are read and dropped. ``offset``: that byte, known (< 0 or None: looked
    up here). Fewer than ``count`` records (a corrupt or truncated shard,
    or an index that does not match it) fail naming the shard.
    """
    if s3:  # the offset is looked up by the stream itself: TensorFlow cannot open s3:// files
        records = storage.s3_records(path, skip_corrupt, index_path=index_path, first=first)
    else:
        if offset is None:
            offset = record_offset(index_path, first)
        else:  # a masked file's runs (~10 a file after 10 updates): no read of the index for each
            known = tf.cast(offset, tf.int64)
            offset = tf.cond(known >= 0, lambda: known, lambda: record_offset(index_path, first))
        records = _open_records(path, False, skip_corrupt, read_buffer, tf.maximum(offset, 0))
        records = records.skip(tf.where(offset < 0, first, tf.constant(0, tf.int64)))
    return _checked(records.take(count), path, count, skip_corrupt, labels, s3, first)


@dataclasses.dataclass(frozen=True)
class SegmentReader:
    """``(path, index_path, first, count) -> records``: :func:`read_segment` with its checks fixed, as the
    training order (``order.host_records``) reads its windows.

    A frozen value, so every split and mixture source read the same way shares one traced order graph.
    ``skip_corrupt``: a corrupt shard's lost records keep their places as empty records, so every window
    has its planned size (the pipeline drops them after the order; later batches shift, documented).
    """

    skip_corrupt: bool = False
    labels: Optional[LabelRange] = None
    s3: bool = False
    read_buffer: Optional[int] = None

    def __call__(self, path: tf.Tensor, index_path: tf.Tensor, first: tf.Tensor, count: tf.Tensor,
                 offset: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        records = read_segment(path, index_path, first, count, self.skip_corrupt, self.labels, self.s3,
                               self.read_buffer, offset)
        if self.skip_corrupt:
            records = records.concatenate(tf.data.Dataset.from_tensors(tf.constant(b"")).repeat()).take(count)
        return records


def record_offset(index_path: tf.Tensor, record: tf.Tensor) -> tf.Tensor:
    """Byte offset of ``record`` in its shard from the shard's ``.idx`` file ("offset size" lines); -1 without one.

    Record 0 starts at byte 0 and needs no index. The index of one shard is
    about 15 bytes per record; it is read only where a stream starts inside a
    shard (C times per epoch, and on a resume).

    Plain graph code (three conds): the training order, its only caller, is traced once a process.
    """
    return _record_offset(tf.convert_to_tensor(index_path, tf.string), tf.cast(record, tf.int64))


def _record_offset(index_path: tf.Tensor, record: tf.Tensor) -> tf.Tensor:
    """:func:`record_offset`'s graph."""

    def lookup() -> tf.Tensor:
        # Checked as record_files.idx.offset_of checks it: a copy's damaged index means reading through.
        lines = tf.strings.split(tf.io.read_file(index_path), "\n")[:record + 1]
        sound = tf.logical_and(tf.size(lines, out_type=tf.int64) > record,
                               tf.reduce_all(tf.strings.regex_full_match(lines, idx.LINE_PATTERN)))
        return tf.cond(sound, lambda: _chained_offset(lines), lambda: tf.constant(-1, tf.int64))

    return tf.cond(tf.equal(record, 0), lambda: tf.constant(0, tf.int64),
                   lambda: tf.cond(tf.equal(index_path, ""), lambda: tf.constant(-1, tf.int64), lookup))


def _chained_offset(lines: tf.Tensor) -> tf.Tensor:
    """The last line's offset if every offset is the one before plus its size, the first 0; else -1."""
    fields = tf.strings.to_number(tf.strings.split(lines, " ").to_tensor(), tf.int64)
    offsets, sizes = fields[:, 0], fields[:, 1]
    starts = tf.concat([[0], tf.cumsum(sizes)[:-1]], axis=0)
    return tf.where(tf.reduce_all(tf.equal(offsets, starts)), offsets[-1], tf.constant(-1, tf.int64))


def _open_records(path: tf.Tensor, s3: bool, skip_corrupt: bool, read_buffer: Optional[int],
                  offset: Optional[tf.Tensor] = None) -> tf.data.Dataset:
    """The records of ``path`` (from byte ``offset``), a corrupt record ending them (the count check reports it)."""
    # ignore_errors must only ever see record errors: a file that cannot be opened makes
    # TFRecordDataset fail on every call, which ignore_errors would retry forever (a hang).
    if s3:
        return storage.s3_records(path, skip_corrupt)  # names a missing object itself
    if offset is None:
        records = tf.data.TFRecordDataset(path, buffer_size=read_buffer).ignore_errors()
    else:
        records = OffsetTFRecordDataset(path, offset, read_buffer).ignore_errors()
    # Opening the file first, outside ignore_errors, makes an unreadable file fail at once with
    # TensorFlow's error, which names it; the probe's byte itself is dropped.
    probe = tf.data.FixedLengthRecordDataset(path, 1).take(1).filter(lambda _: False)
    return probe.concatenate(records)


def _checked(records: tf.data.Dataset, path: tf.Tensor, num_records: tf.Tensor, skip_corrupt: bool,
             labels: Optional[LabelRange], s3: bool, first: Optional[tf.Tensor] = None) -> tf.data.Dataset:
    """``records``, failing (or warning) at their end unless there were ``num_records`` (< 0: any number)."""
    batches = records.batch(CHECK_BATCH)
    end = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))
    step = _check_step(skip_corrupt, first is not None, labels)
    start = tf.constant(0, tf.int64) if first is None else tf.cast(first, tf.int64)
    path, num_records = tf.convert_to_tensor(path, tf.string), tf.cast(num_records, tf.int64)
    checked = batches.concatenate(end).scan(tf.constant(0, tf.int64),
                                            lambda count, batch: step(count, batch, path, num_records, start)).unbatch()
    return checked if s3 else _if_present(path, checked, skip_corrupt)


@functools.lru_cache(maxsize=None)
def _check_step(skip_corrupt: bool, segment: bool, labels: Optional[LabelRange]):
    """The count check's scan step ``(count, batch, path, num_records, first) -> (count, batch)``.

    For whole shards, a ``tf.function`` traced once a process for each kind of check and called from every
    shard's scan (traced in each, it cost a third of the check's CPU to build). For segments
    (``segment``: the records are a run from record ``first``, the message says so), plain graph code:
    their only caller, the training order, is traced once a process, and a function called from it is
    instantiated again as each iterator starts (issue #50's first batch).
    """
    if segment:
        template = "shard {} is corrupt or truncated: read {} of the {} records from record {}"
    else:
        template = "shard {} is corrupt or truncated: read {} of its {} records"

    def step(count: tf.Tensor, batch: tf.Tensor, path: tf.Tensor, num_records: tf.Tensor, first: tf.Tensor) -> tuple:
        size = tf.size(batch, out_type=tf.int64)

        def at_end() -> tf.Tensor:
            complete = tf.logical_or(num_records < 0, tf.equal(count, num_records))
            message = tf.strings.format(template, (path, count, num_records, *((first,) if segment else ())))
            if skip_corrupt:
                check = tf.cond(
                    complete,
                    tf.no_op,
                    lambda: tf.print("WARNING: skipping the rest of", message, output_stream=sys.stderr),
                )
            else:
                check = tf.debugging.Assert(complete, [message])
            with tf.control_dependencies([check]):
                return tf.identity(batch)

        if labels is None:
            return count + size, tf.cond(tf.equal(size, 0), at_end, lambda: batch)
        return count + size, tf.cond(tf.equal(size, 0), at_end,
                                     lambda: _check_labels(batch, path, count + first, labels, skip_corrupt))

    if segment:
        return step
    return tf.function(step, input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.string),
                                              tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64),
                                              tf.TensorSpec([], tf.int64)], autograph=False)


def _check_labels(batch: tf.Tensor, path: tf.Tensor, first: tf.Tensor, labels: LabelRange,
                  skip_corrupt: bool) -> tf.Tensor:
    """``batch`` (records ``first``... of ``path``) if every label is in range; else fail or drop."""
    values = tf.io.parse_example(batch, {labels.key: tf.io.FixedLenFeature([], tf.int64)})[labels.key] + labels.offset
    good = values >= 0
    if labels.num_classes:
        good = tf.logical_and(good, values < labels.num_classes)
    bad = tf.where(tf.logical_not(good))[:, 0]
    index = tf.concat([bad, tf.zeros([1], tf.int64)], 0)[0]  # the first bad record (0 when there is none)
    valid = f"[0, {labels.num_classes})" if labels.num_classes else ">= 0"
    message = tf.strings.format(
        "shard {} record {} has label {} (after label_offset {}), outside " + valid + "; {} such records in this batch",
        (path, first + index, tf.gather(values, index), labels.offset, tf.size(bad)))
    ok = tf.equal(tf.size(bad), 0)
    if skip_corrupt:
        check = tf.cond(ok, tf.no_op, lambda: tf.print("WARNING: skipping records:", message, output_stream=sys.stderr))
        with tf.control_dependencies([check]):
            return tf.boolean_mask(batch, good)
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
        return tf.identity(batch)


def _if_present(path: tf.Tensor, records: tf.data.Dataset, skip_corrupt: bool) -> tf.data.Dataset:
    """``records``, or for a missing file an error naming it (with ``skip_corrupt``, a warning and nothing)."""
    found = tf.size(tf.io.matching_files(_glob_escape(path))) > 0
    message = tf.strings.format("shard {} is listed in the manifest but does not exist", path)
    if skip_corrupt:
        warn = tf.cond(found, tf.no_op,
                       lambda: tf.print("WARNING: skipping", message, "(all its records)", output_stream=sys.stderr))
        with tf.control_dependencies([warn]):
            found = tf.identity(found)
        return records.take(tf.where(found, tf.constant(-1, tf.int64), 0))
    with tf.control_dependencies([tf.debugging.Assert(found, [message])]):
        found = tf.identity(found)
    return records.take(tf.where(found, tf.constant(-1, tf.int64), 0))


def _glob_escape(path: tf.Tensor) -> tf.Tensor:
    """``path`` as a pattern that matches only itself (``matching_files`` globs ``*?[`` and ``\\``)."""
    return tf.strings.regex_replace(path, r"([*?\[\]\\])", r"\\\1")


def interleave_records(
    files: tf.data.Dataset,
    cycle_length: Optional[int] = None,
    block_length: int = 1,
    deterministic: Optional[bool] = None,
    skip_corrupt: bool = False,
    labels: Optional[LabelRange] = None,
    s3: bool = False,
    read_buffer: Optional[int] = None,
) -> tf.data.Dataset:
    """Parallel interleave of the shards in ``files`` (``(path, num_records)`` elements; a masked split's
    extents as :func:`file_order` gives them, each an input of the cycle: the order masks were read in).

    Today's form of the deprecated ``parallel_interleave``: ``cycle_length``
    shards are open at once, read on ``num_parallel_calls=AUTOTUNE`` threads;
    ``deterministic=False`` lets a slow shard be overtaken.
    """
    def read(path: tf.Tensor, count: tf.Tensor, index_path: Optional[tf.Tensor] = None,
             first: Optional[tf.Tensor] = None, offset: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        if first is None:
            return read_shard(path, count, skip_corrupt, labels, s3, read_buffer)
        return read_segment(path, index_path, first, count, skip_corrupt, labels, s3, read_buffer, offset)

    return files.interleave(
        read,
        cycle_length=cycle_length if cycle_length is not None else AUTOTUNE,
        block_length=block_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )


def feature_spec(keys: FeatureKeys) -> dict:
    """The ``tf.io`` parse spec of the two features the pipelines need."""
    return {
        keys.image: tf.io.FixedLenFeature([], tf.string),
        keys.label: tf.io.FixedLenFeature([], tf.int64),
    }


def parse_record(record: tf.Tensor, keys: FeatureKeys = FeatureKeys(), label_offset: int = 0) -> tuple:
    """One serialized Example -> ``(encoded_image, label)``; ``label_offset`` is added to the label."""
    parsed = tf.io.parse_single_example(record, feature_spec(keys))
    return parsed[keys.image], parsed[keys.label] + label_offset


def parse_records(
    records: tf.data.Dataset, keys: FeatureKeys = FeatureKeys(), label_offset: int = 0, batch: int = 0
) -> tf.data.Dataset:
    """Serialized Examples -> ``(encoded_image, label)`` elements.

    ``batch`` > 0 parses ``batch`` records per call with ``tf.io.parse_example``
    (vectorized, as the tf.data guide suggests for cheap map functions) and
    unbatches again; 0 parses one record per call.
    """
    if batch <= 0:
        return records.map(lambda r: parse_record(r, keys, label_offset), num_parallel_calls=AUTOTUNE)

    def parse_many(serialized: tf.Tensor) -> tuple:
        parsed = tf.io.parse_example(serialized, feature_spec(keys))
        return parsed[keys.image], parsed[keys.label] + label_offset

    return records.batch(batch).map(parse_many, num_parallel_calls=AUTOTUNE).unbatch()


@dataclasses.dataclass(frozen=True)
class Source:
    """What every stage needs to know of the split's shards and how to read them."""

    info: DatasetInfo
    split: SplitInfo
    keys: FeatureKeys
    label_offset: int
    skip_corrupt: bool

    @property
    def counts(self) -> list[int]:
        return [shard.num_examples for shard in self.split.shards]

    @property
    def extents(self) -> Optional[tuple[ShardInfo, ...]]:
        """The split's extents for :func:`file_order` when it is masked; None (whole files) otherwise."""
        return self.split.shards if self.split.masked else None

    @property
    def s3(self) -> bool:
        return any(storage.is_s3(path) for path in self.split.files)

    @property
    def read_buffer(self) -> Optional[int]:
        remote = any("://" in path and not path.startswith("file://") for path in self.split.files)
        return READ_BUFFER_BYTES if remote and not self.s3 else None

    @property
    def labels(self) -> Optional[LabelRange]:
        if self.info.converted and self.label_offset == 0 and self.keys == FeatureKeys():
            return None
        return LabelRange(self.keys.label, self.label_offset, self.info.num_classes)
