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
from typing import Optional, Sequence

import tensorflow as tf

from reader import record_index, storage
from reader.info import DatasetInfo, ShardInfo, SplitInfo
from reader.options import FeatureKeys
from reader.order import OffsetTFRecordDataset
from reader.shard_checks import RUNS, LabelRange, checked
from record_files import idx

AUTOTUNE = tf.data.AUTOTUNE
# Read-ahead per open shard on remote file systems (gs://...), as TFDS uses. Local shards keep TensorFlow's
# 256 KiB default: 8 MiB read the same records 1.3x slower from the page cache (310 MB, 6 rounds).
READ_BUFFER_BYTES = 8 << 20
UNKNOWN_COUNT = -1


def file_order(
    files: Sequence[str],
    counts: Optional[Sequence[int]] = None,
    seed: Optional[int] = None,
    epoch: "tf.Tensor | int" = 0,
    num_shards: int = 1,
    shard_index: int = 0,
    extents: Optional[Sequence[ShardInfo]] = None,
    join_runs: bool = False,
) -> tf.data.Dataset:
    """``(path, num_records)`` of the shard files one input pipeline reads in ``epoch``.

    ``extents``: a masked split's extents (``SplitInfo.shards`` when ``SplitInfo.masked``), one per entry of
    ``files``: the elements are then ``(path, num_records, index_path, first, offset)``, each a run of its file
    and its first byte (:func:`reader.record_index.extent_offsets`), which :func:`interleave_records` reads
    with :func:`read_segment` (None: whole files, read with :func:`read_shard`). With ``join_runs`` each
    *file* is one element instead, ``(path, num_records, index_path, firsts, counts, offsets)``: its runs in
    file order (one entry of the last three a run; ``num_records`` their sum), read one after another by
    :func:`read_runs`, as a fresh conversion's file is read whole (evaluation's order; the buffer order and a
    mixture's evaluation keep a run an element). ``seed`` and ``num_shards`` then permute and share files.

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
    if extents is not None and join_runs:
        columns = _runs_of_files(files, counts, extents)
    elif extents is not None:
        columns += [tf.constant([e.index_path for e in extents], tf.string),
                    tf.constant([e.first for e in extents], tf.int64),
                    tf.constant(record_index.extent_offsets(extents), tf.int64)]
    if seed is not None:
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.random.experimental.stateless_shuffle(tf.range(columns[0].shape[0]), seed=key)
        columns = [tf.gather(column, order) for column in columns]
    dataset = tf.data.Dataset.from_tensor_slices(tuple(columns))
    if num_shards > 1:
        dataset = dataset.shard(num_shards, shard_index)
    return dataset


def _runs_of_files(files: Sequence[str], counts: Sequence[int], extents: Sequence[ShardInfo]) -> list:
    """:func:`file_order`'s columns with ``join_runs``: a file a row, its runs' firsts, counts and offsets ragged."""
    groups = record_index.runs_by_file(extents)

    def by_file(values: list) -> tf.RaggedTensor:  # a file's runs are consecutive extents: rows in place
        return tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), [len(group) for group in groups])

    return [tf.constant([files[group.start] for group in groups], tf.string),
            tf.constant([sum(counts[k] for k in group) for group in groups], tf.int64),
            tf.constant([extents[group.start].index_path for group in groups], tf.string),
            by_file([e.first for e in extents]), by_file(list(counts)), by_file(record_index.extent_offsets(extents))]


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
    :data:`reader.shard_checks.CHECK_BATCH` (a function call per record would cost more than
    reading the record) and an empty batch marks the end of the shard, which
    ``unbatch`` then drops by itself.
    """
    return checked(_open_records(path, s3, skip_corrupt, read_buffer), path, num_records, skip_corrupt, labels, s3)


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
    records = _run_records(path, index_path, first, count, skip_corrupt, s3, read_buffer, offset)
    return checked(records, path, count, skip_corrupt, labels, s3, first)


def read_runs(path: tf.Tensor, index_path: tf.Tensor, firsts: tf.Tensor, counts: tf.Tensor, offsets: tf.Tensor,
              skip_corrupt: bool = False, labels: Optional[LabelRange] = None, s3: bool = False,
              read_buffer: Optional[int] = None) -> tf.data.Dataset:
    """A masked file's live records: its runs (``counts[k]`` records from record ``firsts[k]``, at byte
    ``offsets[k]``, < 0: looked up as :func:`read_segment` looks it up) one after another, in file order.

    Checked as a whole file is: the file opened once before its records (the probe), its presence once, and
    one count check against the sum of ``counts`` at its end, naming the file (a run cut short, or an index
    that does not match the file, leaves it short). The masked records between runs are sought over by their
    offsets, never read. Read as runs instead, each an input of evaluation's interleave with its checks,
    a masked file of ~11 runs cost ~9% more CPU an image than a fresh conversion's file (docs/update.md).
    """
    runs = tf.data.Dataset.from_tensor_slices((firsts, counts, offsets))
    records = runs.flat_map(lambda first, count, offset: _run_records(
        path, index_path, first, count, skip_corrupt, s3, read_buffer, offset, probe=False))
    if not s3:  # s3: each stream names a missing object itself
        records = _probe(path).concatenate(records)
    return checked(records, path, tf.reduce_sum(counts), skip_corrupt, labels, s3, kind=RUNS)


def _run_records(path: tf.Tensor, index_path: tf.Tensor, first: tf.Tensor, count: tf.Tensor, skip_corrupt: bool,
                 s3: bool, read_buffer: Optional[int], offset: Optional[tf.Tensor],
                 probe: bool = True) -> tf.data.Dataset:
    """At most ``count`` records of ``path`` from record ``first`` (:func:`read_segment`'s, unchecked)."""
    if s3:  # the offset is looked up by the stream itself: TensorFlow cannot open s3:// files
        records = storage.s3_records(path, skip_corrupt, index_path=index_path, first=first)
    else:
        if offset is None:
            offset = record_offset(index_path, first)
        else:  # a masked file's runs (~10 a file after 10 updates): no read of the index for each
            known = tf.cast(offset, tf.int64)
            offset = tf.cond(known >= 0, lambda: known, lambda: record_offset(index_path, first))
        records = _open_records(path, False, skip_corrupt, read_buffer, tf.maximum(offset, 0), probe)
        records = records.skip(tf.where(offset < 0, first, tf.constant(0, tf.int64)))
    return records.take(count)


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
                  offset: Optional[tf.Tensor] = None, probe: bool = True) -> tf.data.Dataset:
    """The records of ``path`` (from byte ``offset``), a corrupt record ending them (the count check reports it).

    ``probe``: the file opened first (:func:`_probe`); False where the caller probes it once for several reads.
    """
    # ignore_errors must only ever see record errors: a file that cannot be opened makes
    # TFRecordDataset fail on every call, which ignore_errors would retry forever (a hang).
    if s3:
        return storage.s3_records(path, skip_corrupt)  # names a missing object itself
    if offset is None:
        records = tf.data.TFRecordDataset(path, buffer_size=read_buffer).ignore_errors()
    else:
        records = OffsetTFRecordDataset(path, offset, read_buffer).ignore_errors()
    return _probe(path).concatenate(records) if probe else records


def _probe(path: tf.Tensor) -> tf.data.Dataset:
    """No records: the file opened outside ``ignore_errors``, so an unreadable file fails at once with
    TensorFlow's error, which names it (the probe's byte itself is dropped)."""
    return tf.data.FixedLengthRecordDataset(path, 1).take(1).filter(lambda _: False)


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
    extents or its files' joined runs as :func:`file_order` gives them, each element an input of the cycle).

    Today's form of the deprecated ``parallel_interleave``: ``cycle_length``
    shards are open at once, read on ``num_parallel_calls=AUTOTUNE`` threads;
    ``deterministic=False`` lets a slow shard be overtaken.
    """
    def read(path: tf.Tensor, count: tf.Tensor, *extent: tf.Tensor) -> tf.data.Dataset:
        if not extent:
            return read_shard(path, count, skip_corrupt, labels, s3, read_buffer)
        if len(extent) == 4:  # a masked file, its runs joined: (index_path, firsts, counts, offsets)
            return read_runs(path, *extent, skip_corrupt, labels, s3, read_buffer)
        index_path, first, *offset = extent
        return read_segment(path, index_path, first, count, skip_corrupt, labels, s3, read_buffer, *offset)

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
    def file_counts(self) -> list[int]:
        """Records read from each file: a masked file's runs summed (evaluation reads a file as one input)."""
        if not self.split.masked:
            return self.counts
        return [sum(self.counts[k] for k in group) for group in record_index.runs_by_file(self.split.shards)]

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
