"""Repeat-factor sampling (LVIS): images of rare classes more often, the order still a pure function of (seed, step).

Data in: a split's class ids (its records table's ``classes`` column: N small integers, never the shards; a
dataset converted before records tables has its records' labels read once instead, no image decoded) and
:class:`RepeatFactor`. Data out: each record's repeat factor
``r = max(1, sqrt(t / f(c)))`` of its rarest class (f(c): the fraction of the
split's images holding class c; Detectron2's ``RepeatFactorTrainingSampler``,
t = 0.001 by default), a report of the classes' frequencies before and after,
and :func:`repeated_records`, a source's record sequence with each record
repeated its count of times an epoch.

Counts are a stochastic rounding of r, deterministic per (seed, epoch), by
systematic sampling: with the factors scaled to sum to E (the least multiple
of C at or above sum r) and their running sums ``S_i`` in record order, record i appears
``floor(S_i + u) - floor(S_{i-1} + u)`` times (u uniform, keyed by (seed,
epoch)): the floor or the ceiling of its factor, its factor on average, and
exactly E records every epoch, so where a run is stays O(1) arithmetic. An
epoch reads its shards in a permuted order, as the streams order does; its E
copies in that order are cut into C parts of E / C (:func:`part_copies`: a
mixture's C canonical pipelines, each reading about N / C records, so H hosts
each read 1/H of the source), and each part is read in windows of W records,
each window's records repeated and then shuffled together, so copies of an
image spread over a window. With C = 1 this is the order before canonical
pipelines. Each part costs O(N) work per epoch (the counts, computed in the
graph when its epoch starts) and keeps N / C small integers.

The factors reach the graph from a file (:func:`factors_file`: N float64, named by their content, in the
temporary folder), read as each part's epoch starts: as graph constants they made the graph grow with N
(8 MB a million records; a GraphDef cannot pass 2 GB, about 250M records) and its building slow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

import record_schema
from reader.info import DatasetInfo, SplitInfo, open_records_table
from reader.order import range_segments, reading_graph, shard_order, window_permutation

_COUNTS = 0x4EF5  # salts the rounding's uniform away from the order's keys
LABEL_BATCH = 1024


@dataclasses.dataclass(frozen=True)
class RepeatFactor:
    """Repeat-factor sampling of each source's training images.

    Attributes:
      threshold: t: a class in fewer than this fraction of images is repeated
        (LVIS's 0.001; a class at f(c) = t / 4 doubles its images).
    """

    threshold: float = 0.001

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"RepeatFactor(threshold={self.threshold!r}) must be in (0, 1]")


@dataclasses.dataclass(frozen=True)
class Factors:
    """A split's repeat factors and what they do.

    Attributes:
      factors: float64 ``[N]``, by record id (manifest order).
      epoch_records: E, records an epoch with repeats (``ceil(sum(factors))``).
      report: per class name, images holding it and the fraction of an
        epoch's images holding it before and after (expected).
    """

    factors: np.ndarray
    epoch_records: int
    report: dict

    @property
    def path(self) -> str:
        """The file the graph reads the factors from (:func:`factors_file`)."""
        return factors_file(self.factors)


def factors_file(factors: np.ndarray) -> str:
    """A local file holding ``factors`` (float64, little-endian), named by their SHA-256: written once a machine
    (whole: a temporary name renamed), read by the graph of every pipeline that repeats them."""
    data = np.ascontiguousarray(factors, "<f8").tobytes()
    folder = os.path.join(tempfile.gettempdir(), "imgshards-repeat-factors")
    path = os.path.join(folder, hashlib.sha256(data).hexdigest()[:32] + ".f64")
    if not os.path.exists(path) or os.path.getsize(path) != len(data):
        os.makedirs(folder, exist_ok=True)
        temp = f"{path}.{os.getpid()}.partial"
        with open(temp, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    return path


@dataclasses.dataclass(frozen=True)
class ClassIds:
    """Each record's class ids, in record-id order: record i's are ``values[starts[i]:starts[i + 1]]`` (an object
    record's may repeat an id, one per object)."""

    values: np.ndarray  # int, every record's ids one after another
    starts: np.ndarray  # int64, N + 1

    def __len__(self) -> int:
        return len(self.starts) - 1


def image_classes(info: DatasetInfo, split: SplitInfo) -> ClassIds:
    """Each record's class ids, in record-id order: the split's records table's ``classes`` column (N small
    integers, read in well under a second at 1M records), or, for a dataset converted before records tables,
    one pass over its records reading labels only (no image decoded, about a hundred thousand records a
    second from local disk: it reads every shard whole).
    """
    if info.task == record_schema.TASK_SEGMENTATION:
        raise ValueError(f"{info.data_dir}: repeat-factor sampling needs classes an image; a segmentation "
                         "dataset's classes are in its masks")
    table = open_records_table(split)
    if table is not None:  # a masked version's rows are the records it reads, in its record order
        values, starts = table.class_ids()
        return ClassIds(values, starts)
    if split.masked:  # the pass below reads whole files: the masked records' labels too
        raise ValueError(
            f"{info.data_dir}: repeat factors (Source(repeat_factor=...)) need version {info.version}'s records "
            f"table to read split {split.name!r}, which masks deleted records in "
            f"{', '.join(sorted({os.path.basename(s.path) for s in split.shards if not s.whole}))}; that version "
            "was written before updates wrote tables: run python -m converter --update again once SRC changes "
            "(its version has tables), read the source without repeat factors, or convert SRC again with --overwrite")
    key = record_schema.OBJECT_LABEL if info.task == record_schema.TASK_OBJECTS else record_schema.LABEL
    spec = {key: tf.io.RaggedFeature(tf.int64)}
    records = tf.data.TFRecordDataset(split.files).batch(LABEL_BATCH)
    labels = records.map(lambda batch: tf.io.parse_example(batch, spec)[key], num_parallel_calls=tf.data.AUTOTUNE)
    values, lengths = [], []
    for batch in labels.as_numpy_iterator():
        values.extend(batch)
        lengths.extend(len(row) for row in batch)
    if len(lengths) != split.num_examples:
        raise ValueError(f"{info.data_dir}: split {split.name!r} has {len(lengths)} records and its manifest says "
                         f"{split.num_examples}")
    flat = np.concatenate([np.asarray(row, np.int64) for row in values] + [np.zeros(0, np.int64)])
    return ClassIds(flat, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by a sort: NumPy 2's ``unique`` hashes integers, 20x slower on millions (7 s against
    0.3 s for 3.5M int64 on this machine)."""
    ordered = np.sort(values)
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])] if ordered.size else ordered


def repeat_factors(classes: Union[ClassIds, Sequence[np.ndarray]], names: Sequence[str], threshold: float,
                   parts: int = 1) -> Factors:
    """``max(1, sqrt(t / f(c)))`` of each image's rarest class (1 for an image without classes), and the report.

    ``classes``: each record's ids (:class:`ClassIds`, or one array a record). Vectorized over every record's
    (record, class) pairs: about a second for 1M records of objects. E is the least multiple of ``parts``
    (a mixture's canonical pipelines, each reading E / parts of every epoch) at or above the factors' sum.
    """
    if not isinstance(classes, ClassIds):
        classes = ClassIds(np.concatenate([np.asarray(c, np.int64) for c in classes] + [np.zeros(0, np.int64)]),
                           np.concatenate([[0], np.cumsum([len(c) for c in classes], dtype=np.int64)]))
    count = len(classes)
    values = np.asarray(classes.values, np.int64)
    width = max(len(names), int(values.max()) + 1 if values.size else 0, 1)
    rows = np.repeat(np.arange(count, dtype=np.int64), np.diff(classes.starts))
    pairs = sorted_unique(rows * width + values)  # each (record, class) once, by record then class
    pair_rows, pair_classes = pairs // width, pairs % width
    images = np.bincount(pair_classes, minlength=width).astype(np.float64)
    fraction = images / max(count, 1)
    with np.errstate(divide="ignore"):
        per_class = np.maximum(1.0, np.sqrt(threshold / np.where(fraction > 0, fraction, np.inf)))
    factors = np.ones(count, np.float64)
    if pairs.size:
        first = np.flatnonzero(np.concatenate([[True], pair_rows[1:] != pair_rows[:-1]]))  # each record's first pair
        factors[pair_rows[first]] = np.maximum.reduceat(per_class[pair_classes], first)
    epoch = parts * max(1, math.ceil(factors.sum() / parts - 1e-9))
    scaled = factors * epoch / factors.sum()
    holding = np.bincount(pair_classes, weights=scaled[pair_rows], minlength=width)
    report = {name: {"images": int(images[i]), "before": float(fraction[i]), "after": float(holding[i] / epoch),
                     "factor": float(per_class[i])}
              for i, name in enumerate(names) if name and images[i]}
    return Factors(factors, epoch, report)


def epoch_counts(factors: tf.Tensor, epoch_records: "int | tf.Tensor", seed: "int | tf.Tensor",
                 epoch: tf.Tensor) -> tf.Tensor:
    """int64 ``[N]``: each record's copies in ``epoch`` (systematic sampling; they sum to ``epoch_records``)."""
    epoch_records = tf.cast(epoch_records, tf.int64)
    scaled = factors * (tf.cast(epoch_records, tf.float64) / tf.reduce_sum(factors))
    key = tf.random.experimental.stateless_fold_in(
        tf.stack([tf.cast(seed, tf.int64), tf.constant(_COUNTS, tf.int64)]), tf.cast(epoch, tf.int64))
    u = tf.random.stateless_uniform([], key, dtype=tf.float64)
    ends = tf.floor(tf.cumsum(scaled) + u)
    starts = tf.concat([[tf.floor(u)], ends[:-1]], 0)
    counts = tf.cast(ends - starts, tf.int64)
    # float rounding of the last sum: the total is exact (added at the last record alone, not a one-hot of N)
    return tf.tensor_scatter_nd_add(counts, [[tf.size(counts, out_type=tf.int64) - 1]],
                                    [epoch_records - tf.reduce_sum(counts)])


def repeated_records(files: Sequence[str], counts: Sequence[int], index_files: Sequence[str],
                     factors: Union[np.ndarray, str], epoch_records: int, window: int, seed: int, start: tf.Tensor,
                     read_segment, parts: int = 1, part: int = 0,
                     firsts: Optional[Sequence[int]] = None) -> tf.data.Dataset:
    """``(record, key)`` of part ``part`` of ``parts`` of a source with repeats, from its record ``start`` (of
    E / parts an epoch) on, without end.

    ``factors``: each record's (or the file :func:`factors_file` wrote them to). ``read_segment(path, index_path,
    first, count)`` as ``order.host_records`` takes it (and, as there, a ``records.SegmentReader`` has its graph
    traced once a process). Keys are unique per copy (epoch * E + copy's place in the epoch), so two copies of
    an image are augmented differently. ``parts`` must divide E (``epoch_records``); one part is the whole
    epoch, the order mixtures had before canonical pipelines. ``firsts``: each file's first record the source
    reads (a masked version's extents: ``files`` then names a file once per run; default 0, whole files).
    """
    path = factors if isinstance(factors, str) else factors_file(factors)
    firsts = list(firsts) if firsts is not None else [0] * len(files)
    return repeated_records_graph(read_segment)(tf.constant(list(files), tf.string), tf.constant(list(counts), tf.int64),
                 tf.constant(list(index_files), tf.string), tf.constant(firsts, tf.int64), tf.constant(path, tf.string),
                 tf.constant(epoch_records, tf.int64), tf.constant(window, tf.int64), tf.constant(seed, tf.int64),
                 tf.cast(start, tf.int64), tf.constant(parts, tf.int64), tf.constant(part, tf.int64))


def repeated_records_graph(read_segment) -> Callable[..., tf.data.Dataset]:
    """:func:`repeated_records` as its graph: ``(files, counts, index_files, firsts, factors_path, epoch_records, window,
    seed, start, parts, part) -> dataset``, every argument a tensor, for callers that build several at one site."""
    return reading_graph(_REPEATED_GRAPHS, read_segment, _repeated_graph, _REPEATED_SIGNATURE)


_REPEATED_SIGNATURE = [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64),
                       tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.string)] + \
    [tf.TensorSpec([], tf.int64)] * 6
_REPEATED_GRAPHS: dict = {}  # read_segment -> repeated_records' traced graph


def part_copies(counts: tf.Tensor, sizes: tf.Tensor, order: tf.Tensor, parts: tf.Tensor, part: tf.Tensor) -> tuple:
    """Part ``part`` of ``parts`` of an epoch whose records have ``counts`` copies each (record-id order), read
    shard by shard in ``order`` (``sizes``: each shard's records, manifest order): ``(first record, end record,
    its copies of each record first .. end - 1)``, records counted in reading order.

    The epoch's E copies, one after another in reading order, are cut into ``parts`` runs of E / parts (a
    record whose copies straddle a cut gives some to each part): a part reads about N / parts records. The
    first part starts at record 0 and the last ends at record N, so one part is the whole epoch, as before.
    The cuts are found shard by shard first (their copies from one running sum in record-id order), then
    record by record in the shards holding the part only: O(N / parts) beyond that sum.
    """
    records = tf.reduce_sum(sizes)
    each = tf.reduce_sum(counts) // parts
    low, high = part * each, (part + 1) * each
    bases = tf.cumsum(sizes, exclusive=True)
    by_id = tf.cumsum(counts)  # copies up to and including each record, in record-id order
    before = tf.where(bases > 0, tf.gather(by_id, tf.maximum(bases - 1, 0)), 0)
    totals = tf.where(sizes > 0, tf.gather(by_id, tf.maximum(bases + sizes - 1, 0)) - before, 0)  # a shard's
    shard_ends = tf.cumsum(tf.gather(totals, order))  # copies up to each shard's end, in reading order
    shard_starts = tf.cumsum(tf.gather(sizes, order), exclusive=True)  # its first record, in reading order
    last = tf.size(sizes, out_type=tf.int64) - 1
    low_shard = tf.where(tf.equal(part, 0), tf.constant(0, tf.int64),
                         tf.searchsorted(shard_ends, low[None], side="right", out_type=tf.int64)[0])
    high_shard = tf.where(tf.equal(part, parts - 1), last, tf.minimum(
        tf.searchsorted(shard_ends, high[None], side="left", out_type=tf.int64)[0], last))
    span = order[low_shard:high_shard + 1]
    copies = tf.gather(counts, tf.ragged.range(tf.gather(bases, span), tf.gather(bases + sizes, span)).flat_values)
    placed = shard_ends[low_shard] - tf.gather(totals, order[low_shard]) + tf.cumsum(copies)
    offset = shard_starts[low_shard]
    first = offset + tf.where(tf.equal(part, 0), tf.constant(0, tf.int64),
                              tf.searchsorted(placed, low[None], side="right", out_type=tf.int64)[0])
    end = tf.where(tf.equal(part, parts - 1), records, tf.minimum(
        offset + tf.searchsorted(placed, high[None], side="left", out_type=tf.int64)[0] + 1, records))
    placed, copies = placed[first - offset:end - offset], copies[first - offset:end - offset]
    return first, end, tf.maximum(tf.minimum(placed, high) - tf.maximum(placed - copies, low), 0)


def _repeated_graph(paths: tf.Tensor, sizes: tf.Tensor, indexes: tf.Tensor, firsts: tf.Tensor, factors_path: tf.Tensor,
                    epoch_records: tf.Tensor, window: tf.Tensor, seed: tf.Tensor, start: tf.Tensor,
                    parts: tf.Tensor, part: tf.Tensor, read_segment) -> tf.data.Dataset:
    """:func:`repeated_records` with every number a tensor.

    The factors are read from their file as each epoch starts and dropped once its counts are made: a part
    keeps only its own records' copies (N / parts small integers), so C parts on one host hold about N.
    """
    part_records = epoch_records // parts
    first_epoch = start // part_records

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        begin = tf.where(tf.equal(epoch, first_epoch), start % part_records, tf.constant(0, tf.int64))
        table = tf.io.decode_raw(tf.io.read_file(factors_path), tf.float64, little_endian=True)
        order = shard_order(tf.size(sizes, out_type=tf.int64), seed, epoch)
        counts = epoch_counts(table, epoch_records, seed, epoch)
        first_record, end_record, copies = part_copies(counts, sizes, order, parts, part)
        count = end_record - first_record
        ends = tf.cumsum(tf.math.segment_sum(copies, tf.range(count, dtype=tf.int64) // window))
        first_window = tf.searchsorted(ends, begin[None], side="right", out_type=tf.int64)[0]
        window_start = tf.concat([[0], ends], 0)
        shard, first, number = range_segments(sizes, seed, epoch, first_record + first_window * window, end_record)

        def segment(shard_index, first_record, number):
            return read_segment(tf.gather(paths, shard_index), tf.gather(indexes, shard_index),
                                tf.gather(firsts, shard_index) + first_record, number)

        def expand(number: tf.Tensor, batch: tf.Tensor) -> tuple:
            low = number * window
            repeated = tf.repeat(batch, copies[low:low + tf.size(batch, out_type=tf.int64)])
            size = tf.size(repeated, out_type=tf.int64)
            permutation = window_permutation(size, seed, epoch, part, number)
            offset = window_start[number]
            keys = epoch * epoch_records + part * part_records + offset + permutation
            drop = tf.where(tf.equal(number, first_window), begin - offset, 0)
            return tf.gather(repeated, permutation)[drop:], keys[drop:]

        stream = tf.data.Dataset.from_tensor_slices((shard, first, number)).flat_map(segment)
        return stream.batch(window).enumerate(start=first_window).map(expand).unbatch()

    return tf.data.Dataset.range(first_epoch, 1 << 62).flat_map(one_epoch)
