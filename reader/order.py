"""The training order: a pure function of (dataset, seed, epoch), so a run resumes exactly from its step.

Data in: a split's shard files with their record counts (and record offsets
where the converter wrote its ``.idx`` files; for a version that masks deleted
records, its extents: runs of files, each from its first record), the global
batch size G, the seed and a :class:`StreamLayout` (C canonical streams,
windows of W records).
Data out: each input pipeline's records of epoch e, as ``(record, key)``
where ``key`` (epoch * N + record id) seeds that record's augmentation.

The order of epoch e, with N records and S = N // G steps::

    shards permuted by index_shuffle(seed, e)      O(#shards), no O(N) array
    -> their records, one sequence, cut into C streams of L = S * G / C records
       (the N - S * G records left at the end wait for another epoch's cut)
    -> each stream in windows of W records, each window permuted by
       index_shuffle(seed, e, stream, window)      memory: about 6 * C * W records
    -> streams read round-robin, G / C records at a time: global batch t is
       block t of stream 0, of stream 1, ..., of stream C - 1

Input pipeline h of H reads streams h*C/H ... (h+1)*C/H - 1 (contiguous: about
1/H of the shards) in the same round-robin, so the concatenation of the H
pipelines' batch t is the one-pipeline batch t, element for element: an
elastic job that goes from 8 hosts to 4 continues the same run.

Resuming at step s of epoch e restarts each stream at the window holding its
record s * G / C: it re-reads at most one window per stream, and it seeks
into the shard with the record's byte offset (``TFRecordDatasetV2``'s
``byte_offsets``) where the shard has an index, else it reads through the
records before it (datasets written before indexes, documented as slower).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional, Sequence

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.framework import dtypes, tensor_spec
from tensorflow.python.ops import gen_dataset_ops

from reader import record_index

MAX_STREAMS = 64  # default C: gcd(G, 64), so every power-of-two host count up to 64 divides it ...
MIN_STREAM_RECORDS = 512  # ... halved (not below 8) while a stream would hold fewer records than this per epoch,
MIN_DEFAULT_STREAMS = 8  # since each stream costs about 5 ms of CPU per epoch to plan and open (bench/resume.py)
# 6 * C * W: what the windows in flight hold (per stream: the row being cut into batches and its copy, the
# interleave's read-ahead, the one being read; about 5.7 measured by bench/resume.py's peak RSS): the memory of
# the default 10,000-record shuffle buffer.
DEFAULT_SHUFFLE_RECORDS = 10_000
WINDOWS_IN_FLIGHT = 6
# Salts keep the shard permutation, the window permutations and the augmentation seeds apart.
_SHARDS, _WINDOWS = 0x5A4D, 0x3117


@dataclasses.dataclass(frozen=True)
class StreamLayout:
    """How one split is cut for one global batch size: the numbers the order depends on.

    Attributes:
      num_records: N, the split's records.
      batch_size: G, the global batch.
      streams: C, canonical streams; divides G, and every input pipeline count H must divide it.
      window: W, records per shuffled window of a stream.
    """

    num_records: int
    batch_size: int
    streams: int
    window: int

    @property
    def steps_per_epoch(self) -> int:
        return self.num_records // self.batch_size

    @property
    def block(self) -> int:
        """Records each stream gives to each global batch (G / C)."""
        return self.batch_size // self.streams

    @property
    def stream_length(self) -> int:
        """Records of one stream per epoch (L)."""
        return self.steps_per_epoch * self.block


def stream_layout(num_records: int, batch_size: int, streams: Optional[int] = None,
                  window: Optional[int] = None, split: str = "train") -> StreamLayout:
    """The layout for a split of ``num_records`` at global batch ``batch_size``.

    Defaults: C = gcd(G, 64), halved while a stream would get fewer than 512
    records per epoch, down to 8 (every power-of-two pipeline count up to 8
    still divides it); W = 10,000 / (6 C) records, so the windows in flight
    (about six per stream) hold what today's default 10,000-record
    shuffle buffer holds.

    Raises:
      ValueError: the split is smaller than one batch, or ``streams`` does not divide G.
    """
    if num_records < batch_size:
        raise ValueError(
            f"split {split!r} has {num_records} examples, fewer than one batch of {batch_size}: an epoch would have "
            "0 steps. Use a smaller batch size (or options=reader.ReadOptions(order='buffer'), which repeats "
            "examples within a batch)")
    if streams is None:
        streams = math.gcd(batch_size, MAX_STREAMS)
        while streams > MIN_DEFAULT_STREAMS and num_records // streams < MIN_STREAM_RECORDS:
            streams //= 2
    if streams < 1 or batch_size % streams:
        raise ValueError(f"ReadOptions(streams={streams}) must divide the global batch size {batch_size}")
    if window is None:
        window = max(1, DEFAULT_SHUFFLE_RECORDS // (WINDOWS_IN_FLIGHT * streams))
    if window < 1:
        raise ValueError(f"ReadOptions(window={window}) must be a positive number of records")
    block = batch_size // streams
    window = -(-window // block) * block  # whole blocks: every stream's windows end at the same batch
    return StreamLayout(num_records, batch_size, streams, window)


def check_pipelines(layout: StreamLayout, pipelines: int) -> None:
    """``pipelines`` input pipelines can share the streams evenly, or a message naming a ``streams`` that works."""
    if layout.streams % pipelines == 0:
        return
    fits = [c for c in range(pipelines, layout.batch_size + 1, pipelines) if layout.batch_size % c == 0]
    hint = f"pass options=reader.ReadOptions(streams={min(fits, key=lambda c: abs(c - MAX_STREAMS))})" if fits \
        else f"use a global batch size divisible by {pipelines}"
    raise ValueError(f"{pipelines} input pipelines cannot share {layout.streams} streams evenly (the global batch "
                     f"{layout.batch_size} gives {layout.streams} by default); {hint}, and keep it for the whole run")


def host_records(
    files: Sequence[str],
    counts: Sequence[int],
    index_files: Sequence[str],
    layout: StreamLayout,
    seed: int,
    start_step: tf.Tensor,
    num_epochs: Optional[int],
    pipelines: int,
    pipeline_id: int,
    read_segment,
    firsts: Optional[Sequence[int]] = None,
) -> tf.data.Dataset:
    """``(record, key)`` of one input pipeline from global step ``start_step`` to the end of epoch ``num_epochs``.

    ``read_segment(path, index_path, first, count)`` reads ``count`` records
    of ``path`` from record ``first``, seeking with the shard's record index
    (``index_path``; "" when it has none: read through the records before it).

    ``files``, ``counts`` and ``index_files`` describe the split's *extents*: runs of records of a file,
    ``counts[i]`` of them from its record ``firsts[i]`` (None: every extent a whole file, from record 0). A
    version that masks deleted records (``live`` in its manifest, docs/update.md) lists several runs of one
    file; the order cuts its sequence over extents as over shards, and never reads a record outside them.

    Each stream runs through the epochs itself and reads its next window
    while its current one is consumed (the interleave reads ahead), so
    neither a window's end nor an epoch's stalls the round-robin.

    The pipeline's graph takes the split, the layout and the seed as tensors:
    for a ``read_segment`` that compares by value (``records.SegmentReader``)
    it is traced once a process and every later call, another split or
    another source of a mixture, builds in a few milliseconds (traced each
    time, it was 0.25 s of CPU a source: issue #50's start-up).
    """
    firsts = list(firsts) if firsts is not None else [0] * len(files)
    arguments = [tf.constant(list(files), tf.string), tf.constant(list(counts), tf.int64),
                 tf.constant(list(index_files), tf.string), tf.constant(firsts, tf.int64),
                 tf.constant([layout.num_records, layout.batch_size, layout.streams, layout.window], tf.int64),
                 tf.constant(seed, tf.int64), tf.cast(start_step, tf.int64),
                 tf.constant(num_epochs if num_epochs is not None else 1 << 62, tf.int64),
                 tf.constant(layout.streams // pipelines, tf.int64), tf.constant(pipeline_id, tf.int64)]
    if not any(firsts):  # whole files: a segment from a shard's record 0 starts at byte 0 (record_offset)
        return host_records_graph(read_segment)(*arguments)
    # A masked version's runs (~10 a file after 10 updates; a window crosses several): each run's first byte
    # read from the file's index once, here, rather than the index read again by every segment that starts one.
    offsets = tf.constant(record_index.run_offsets(index_files, firsts), tf.int64)
    return reading_graph(_RUN_GRAPHS, read_segment, _host_records_graph, _RUN_SIGNATURE)(*arguments, offsets)


def host_records_graph(read_segment) -> Callable[..., tf.data.Dataset]:
    """:func:`host_records` as its graph: ``(files, counts, index_files, firsts, layout, seed, start_step,
    last_epoch, per_pipeline, pipeline_id) -> dataset``, every argument a tensor (``layout``: N, G, C, W; ``last_epoch``
    the epoch to stop before; ``per_pipeline``: streams a pipeline reads), for callers that build several
    orders at one site (``reader.mixtures.pipeline``)."""
    return reading_graph(_HOST_GRAPHS, read_segment, _host_records_graph, _HOST_SIGNATURE)


def reading_graph(cache: dict, read_segment, body: Callable[..., tf.data.Dataset], signature: list):
    """``body(*tensors, read_segment=read_segment)`` as a ``tf.function`` of ``signature``, returning its dataset.

    Traced once a process for a ``read_segment`` that compares by value (a frozen dataclass such as
    ``records.SegmentReader``: kept in ``cache``), else once a call.
    """
    by_value = dataclasses.is_dataclass(read_segment) and getattr(read_segment, "__hash__", None) is not None
    graph = cache.get(read_segment) if by_value else None
    if graph is None:
        graph = tf.function(functools.partial(body, read_segment=read_segment), input_signature=signature,
                            autograph=False)
        if by_value:
            cache[read_segment] = graph
    return graph


_HOST_SIGNATURE = [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64),
                   tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64), tf.TensorSpec([4], tf.int64)] + [tf.TensorSpec([], tf.int64)] * 5
_HOST_GRAPHS: dict = {}  # read_segment -> host_records' traced graph
_RUN_SIGNATURE = _HOST_SIGNATURE + [tf.TensorSpec([None], tf.int64)]  # ... and each extent's first byte
_RUN_GRAPHS: dict = {}  # read_segment -> host_records' traced graph for a masked version's extents


def _host_records_graph(files: tf.Tensor, counts: tf.Tensor, index_files: tf.Tensor, firsts: tf.Tensor,
                        layout: tf.Tensor, seed: tf.Tensor, start_step: tf.Tensor, last_epoch: tf.Tensor, per_pipeline: tf.Tensor,
                        pipeline_id: tf.Tensor, offsets: Optional[tf.Tensor] = None, *,
                        read_segment) -> tf.data.Dataset:
    """:func:`host_records` with every number a tensor (``layout``: N, G, C, W; ``offsets``: each extent's first
    record's byte, -1 unknown, or None: every segment looks its start up)."""
    shards = _Shards(files, counts, index_files, firsts, tf.cumsum(counts, exclusive=True), read_segment, offsets)
    grid = _LayoutTensors(*tf.unstack(layout, num=4))
    first_epoch = start_step // grid.steps_per_epoch

    def stream(index: tf.Tensor) -> tf.data.Dataset:
        epochs = tf.data.Dataset.range(first_epoch, last_epoch)
        return epochs.flat_map(lambda epoch: _stream_windows(shards, grid, seed, start_step, index, epoch))

    # Windows, not records, go through the interleave (a record at a time cost 0.2 ms of CPU each): every
    # stream's windows have the same sizes at the same batches, so a row of them is cut into batches at once.
    mine = tf.data.Dataset.range(pipeline_id * per_pipeline, (pipeline_id + 1) * per_pipeline)
    rows = mine.interleave(stream, cycle_length=per_pipeline, block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=True).batch(per_pipeline)
    return rows.map(lambda records, keys, picks: _row_in_batch_order(records, keys, picks, grid.block)).unbatch()


@dataclasses.dataclass(frozen=True)
class _LayoutTensors:
    """A :class:`StreamLayout` as scalar tensors, in a graph that serves every layout."""

    num_records: tf.Tensor
    batch_size: tf.Tensor
    streams: tf.Tensor
    window: tf.Tensor

    @property
    def steps_per_epoch(self) -> tf.Tensor:
        return self.num_records // self.batch_size

    @property
    def block(self) -> tf.Tensor:
        return self.batch_size // self.streams

    @property
    def stream_length(self) -> tf.Tensor:
        return self.steps_per_epoch * self.block


def _row_in_batch_order(records: tf.Tensor, keys: tf.Tensor, picks: tf.Tensor, block: tf.Tensor) -> tuple:
    """A row of windows as read (``[streams, n]``) -> its records and keys in batch order, in one gather.

    ``picks[i]``: stream i's window order (its permutation, the records before the start dropped). The
    permutation and the round-robin are composed on indexes, so each record's bytes are copied once, where
    a gather, then the round-robin's unstack and stack copied them three times (the same records, in the
    same order; its CPU an image was within the noise of the old form's, ``bench.reader_stages --order``).
    """
    size = tf.shape(records, out_type=tf.int64)[1]
    streams = tf.shape(picks, out_type=tf.int64)[0]
    flat = picks + tf.range(streams, dtype=tf.int64)[:, None] * size  # stream i's window starts at i * n
    order = tf.gather(tf.reshape(flat, [-1]), _round_robin(streams, tf.shape(picks, out_type=tf.int64)[1], block))
    return tf.gather(tf.reshape(records, [-1]), order), tf.gather(tf.reshape(keys, [-1]), order)


@dataclasses.dataclass(frozen=True)
class _Shards:
    """A split's extents as graph tensors (in manifest order), and how to read a run of records of one."""

    paths: tf.Tensor
    sizes: tf.Tensor
    indexes: tf.Tensor
    firsts: tf.Tensor  # each extent's first record in its file (0 for a whole shard)
    bases: tf.Tensor  # first record id of each extent in the split's sequence
    read_segment: Callable[..., tf.data.Dataset]
    offsets: Optional[tf.Tensor] = None  # each extent's first record's byte (-1: unknown); None: looked up


def _stream_windows(shards: _Shards, grid: _LayoutTensors, seed: tf.Tensor, start_step: tf.Tensor, index: tf.Tensor,
                    epoch: tf.Tensor) -> tf.data.Dataset:
    """Stream ``index``'s windows of ``epoch`` as ``(records, keys, order)``: read, and the order they are taken in
    (the window's permutation, the first window's records before the start step dropped)."""
    window = grid.window
    position = tf.where(tf.equal(epoch, start_step // grid.steps_per_epoch),
                        start_step % grid.steps_per_epoch * grid.block, tf.constant(0, tf.int64))
    first_window = position // window
    shard, first, count = stream_segments(shards.sizes, grid.stream_length, seed, epoch, index, first_window * window)

    def segment(shard: tf.Tensor, first: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
        where = (tf.gather(shards.paths, shard), tf.gather(shards.indexes, shard),
                 tf.gather(shards.firsts, shard) + first, count)
        if shards.offsets is None:
            records = shards.read_segment(*where)
        else:  # a segment from its extent's first record starts at a byte known already
            records = shards.read_segment(*where, tf.where(tf.equal(first, 0), tf.gather(shards.offsets, shard), -1))
        key = epoch * grid.num_records + tf.gather(shards.bases, shard) + first
        return tf.data.Dataset.zip((records, tf.data.Dataset.range(key, key + count)))

    def shuffle(number: tf.Tensor, window_records: tuple) -> tuple:
        records, keys = window_records  # left in reading order: the row gathers them (_row_in_batch_order)
        size = tf.shape(keys, out_type=tf.int64)[0]
        permutation = window_permutation(size, seed, epoch, index, number)
        drop = tf.where(tf.equal(number, first_window), position - first_window * window, 0)
        return records, keys, permutation[drop:]

    records = tf.data.Dataset.from_tensor_slices((shard, first, count)).flat_map(segment)
    return records.batch(window).enumerate(start=first_window).map(shuffle)


# The order's pure tensor functions are plain graph code, inlined into the order's graph (traced once a process):
# as tf.functions called from it, each call was a function TensorFlow instantiated and optimized again as the
# iterator started, 0.4-0.6 s of CPU of a process's first batch (issue #50).


def stream_segments(sizes: tf.Tensor, stream_length: tf.Tensor, seed: tf.Tensor, epoch: tf.Tensor,
                    index: tf.Tensor, begin_at: tf.Tensor) -> tuple:
    """``(shard, first record, count)`` runs making stream ``index`` of ``epoch`` from its record ``begin_at``:
    the shards (``sizes``: records each, manifest order) in :func:`shard_order`, cut into streams of
    ``stream_length`` records."""
    return range_segments(sizes, seed, epoch, index * stream_length + begin_at, (index + 1) * stream_length)


def range_segments(sizes: tf.Tensor, seed: tf.Tensor, epoch: tf.Tensor, begin: tf.Tensor, end: tf.Tensor) -> tuple:
    """``(shard, first record, count)`` runs holding records ``begin .. end - 1`` of ``epoch``'s sequence: the
    shards (``sizes``: records each, manifest order) one after another in :func:`shard_order`."""
    order = shard_order(tf.size(sizes, out_type=tf.int64), seed, epoch)
    ordered = tf.gather(sizes, order)
    ends = tf.cumsum(ordered)
    starts = ends - ordered
    hit = tf.where(tf.logical_and(starts < end, ends > begin))[:, 0]
    first = tf.maximum(begin - tf.gather(starts, hit), 0)
    count = tf.minimum(end - tf.gather(starts, hit), tf.gather(ordered, hit)) - first
    return tf.gather(order, hit), first, count


def _round_robin(streams: tf.Tensor, length: tf.Tensor, block: tf.Tensor) -> tf.Tensor:
    """Indexes into a row of windows, one per stream (``[streams, length]`` flattened), in batch order: ``block``
    values of each stream in turn. Arithmetic, not a transpose: the same for every layout, and a transpose of
    int64 logs oneDNN's "supports DT_INT64 only on platforms with AVX-512" as an error line (TensorFlow 2.21)."""
    place = tf.range(streams * length, dtype=tf.int64)
    turn, within = place // block, place % block
    return (turn % streams) * length + (turn // streams) * block + within


def shard_order(num_shards: "int | tf.Tensor", seed: "int | tf.Tensor", epoch: tf.Tensor) -> tf.Tensor:
    """The shards of ``epoch`` in their order: a stateless permutation keyed by (seed, epoch)."""
    num_shards = tf.cast(num_shards, tf.int64)
    key = tf.random.experimental.stateless_fold_in(
        tf.stack([tf.cast(seed, tf.int64), tf.constant(_SHARDS, tf.int64)]), tf.cast(epoch, tf.int64))
    return tf.random.experimental.index_shuffle(tf.range(num_shards, dtype=tf.int64), key, num_shards - 1)


def window_permutation(size: tf.Tensor, seed: "int | tf.Tensor", epoch: tf.Tensor, stream: tf.Tensor,
                       window: tf.Tensor) -> tf.Tensor:
    """The order of a window of ``size`` records, keyed by (seed, epoch, stream, window)."""
    return _window_permutation(tf.cast(size, tf.int64), tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64),
                               tf.cast(stream, tf.int64), tf.cast(window, tf.int64))


def _window_permutation(size: tf.Tensor, seed: tf.Tensor, epoch: tf.Tensor, stream: tf.Tensor,
                        window: tf.Tensor) -> tf.Tensor:
    """:func:`window_permutation`'s graph."""
    key = tf.stack([seed, tf.constant(_WINDOWS, tf.int64)])
    for data in (epoch, stream, window):
        key = tf.random.experimental.stateless_fold_in(key, data)
    return tf.random.experimental.index_shuffle(tf.range(size), key, size - 1)


class OffsetTFRecordDataset(dataset_ops.DatasetSource):
    """The records of one TFRecord file from byte ``offset`` on (TensorFlow's ``TFRecordDatasetV2`` op).

    ``tf.data.TFRecordDataset`` does not expose the op's ``byte_offsets``.
    """

    def __init__(self, path: tf.Tensor, offset: tf.Tensor, buffer_size: Optional[int] = None) -> None:
        self._name = None
        variant = gen_dataset_ops.tf_record_dataset_v2(
            path, compression_type="", buffer_size=tf.constant(buffer_size or 256 << 10, tf.int64),
            byte_offsets=tf.cast(offset, tf.int64), metadata=self._metadata.SerializeToString())
        super().__init__(variant)

    @property
    def element_spec(self):
        return tensor_spec.TensorSpec([], dtypes.string)
