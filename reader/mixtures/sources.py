"""The sequences a mixture's input pipeline reads: per canonical pipeline it reads, each source's part of its order.

Data in: a :class:`reader.Mixture`, its sources' splits (shards present), their seeds, and where each
canonical pipeline is in each source. Data out: one ``(record, key)`` dataset per (canonical pipeline,
source), without end, which ``mixture_pipeline`` chooses from by the split table. Sequences read the same
way are built at one site (one ``map`` over their inputs packed as tensors): TensorFlow instantiates a
dataset's functions once per op that builds it (issue #50).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from reader.mixtures.plan import Mixture
from reader.options import FeatureKeys
from reader.order import host_records_graph
from reader.records import SegmentReader, Source
from reader.mixtures.repeat_factor import repeated_records_graph


def source_records(plan: Mixture, splits, seeds: Sequence[int], consumed: tf.Tensor,
                   first_canonical: Optional[int] = None) -> list[tf.data.Dataset]:
    """The ``(record, key)`` sequences of canonical pipelines ``first_canonical ..`` (one a row of ``consumed``,
    ``[n, K]``), each source's from that pipeline's record ``consumed[c, k]`` on, without end: ``n * K``
    datasets, pipeline after pipeline, source 0's first. Without ``first_canonical``, ``consumed`` is ``[K]``
    and each source is read whole, all its streams one sequence (the order of a mixture of C = 1).

    Sequences read the same way (the same ``SegmentReader``, with or without repeat factors) are built at one
    site, by :func:`_at_one_site`, from their splits packed as tensors.
    """
    if first_canonical is None:
        consumed, first_canonical, canonical = tf.reshape(consumed, [1, -1]), 0, 1
    else:
        canonical = plan.canonical_pipelines
    count = int(consumed.shape[0])
    groups: dict = {}
    for k, (source, split) in enumerate(zip(plan.sources, splits)):
        reader_source = Source(source.info, split, FeatureKeys(), 0, False)
        segment = SegmentReader(s3=reader_source.s3, read_buffer=reader_source.read_buffer)
        groups.setdefault((source.factors is not None, segment), []).append(k)
    streams: list = [None] * (count * len(plan.sources))
    for (repeated, segment), members in groups.items():
        sources, shards = [plan.sources[k] for k in members], [splits[k].shards for k in members]
        seed_row = tf.constant([seeds[k] for k in members], tf.int64)
        entries = [(c, k) for c in range(count) for k in members]
        rows = tf.constant([members.index(k) for _, k in entries], tf.int64)
        pipelines = tf.constant([first_canonical + c for c, _ in entries], tf.int64)
        builder = _repeated_builder if repeated else _ordered_builder
        make = builder(sources, shards, seed_row, tf.gather_nd(consumed, entries), segment, rows, pipelines,
                       canonical)
        for (c, k), dataset in zip(entries, _at_one_site(len(entries), make)):
            streams[c * len(plan.sources) + k] = dataset
    return streams


def _ordered_builder(sources, shards, seeds: tf.Tensor, consumed: tf.Tensor, segment: SegmentReader,
                     rows: tf.Tensor, pipelines: tf.Tensor, canonical: int):
    """``i -> `` sequence i: canonical pipeline ``pipelines[i]``'s streams of source ``rows[i]`` (of ``sources``)
    in their streams order (``order.host_records``), from that pipeline's record ``consumed[i]``."""
    graph = host_records_graph(segment)
    files, counts, indexes = _shard_rows(shards)
    firsts = _Rows.of([[s.first for s in row] for row in shards], tf.int64)
    layouts = tf.constant([[s.layout.num_records, s.layout.batch_size, s.layout.streams, s.layout.window]
                           for s in sources], tf.int64)

    def make(i: tf.Tensor) -> tf.data.Dataset:
        row = rows[i]
        layout = layouts[row]  # a source's "batch" is one record a stream: it advances record by record
        each = layout[2] // canonical  # the source's streams a canonical pipeline reads, one record each in turn
        records = graph(files.row(row), counts.row(row), indexes.row(row), firsts.row(row), layout, seeds[row], consumed[i] // each,
                        tf.constant(1 << 62, tf.int64), each, pipelines[i])
        return records.skip(consumed[i] % each)

    return make


def _repeated_builder(sources, shards, seeds: tf.Tensor, consumed: tf.Tensor, segment: SegmentReader,
                      rows: tf.Tensor, pipelines: tf.Tensor, canonical: int):
    """``i -> `` sequence i: canonical pipeline ``pipelines[i]``'s part of source ``rows[i]``'s order with repeats
    (``repeat_factor.repeated_records``, E / C records an epoch), from that part's record ``consumed[i]``."""
    graph = repeated_records_graph(segment)
    files, counts, indexes = _shard_rows(shards)
    firsts = _Rows.of([[s.first for s in row] for row in shards], tf.int64)  # a masked version's runs
    factors = _Rows.of([[s.factors.path] for s in sources], tf.string)  # files: N floats each, never constants
    sizes = tf.constant([[s.factors.epoch_records, s.layout.window] for s in sources], tf.int64)

    def make(i: tf.Tensor) -> tf.data.Dataset:
        row = rows[i]
        return graph(files.row(row), counts.row(row), indexes.row(row), firsts.row(row), factors.row(row)[0], sizes[row][0],
                     sizes[row][1], seeds[row], consumed[i], tf.constant(canonical, tf.int64), pipelines[i])

    return make


def _at_one_site(count: int, make) -> list[tf.data.Dataset]:
    """``[make(0), ..., make(count - 1)]``, every one built by the same dataset function.

    TensorFlow instantiates (and optimizes) the functions of a dataset built inside a dataset function once per
    op that builds it: sources built by K calls of the order's graph paid K instantiations of each of its
    functions, 0.5-0.7 s of CPU a source before the first batch. Built by one ``map``, they share one
    (``bench.read_mixture``: the first batch over 10 sources, see docs/benchmarks.md).
    """
    if count == 1:
        return [make(tf.constant(0, tf.int64))]
    site = tf.data.Dataset.range(count).map(make)
    return [site.skip(k).take(1).get_single_element() for k in range(count)]


@dataclasses.dataclass(frozen=True)
class _Rows:
    """Rows of different lengths as two graph constants (values and row starts), for a row picked by a tensor."""

    values: tf.Tensor
    starts: tf.Tensor

    @classmethod
    def of(cls, rows: Sequence[Sequence], dtype: tf.DType) -> "_Rows":
        flat = [value for row in rows for value in row] if dtype == tf.string else \
            np.concatenate([np.asarray(row, dtype=dtype.as_numpy_dtype) for row in rows])
        return cls(tf.constant(flat, dtype), tf.constant(np.cumsum([0] + [len(row) for row in rows]), tf.int64))

    def row(self, index: tf.Tensor) -> tf.Tensor:
        return self.values[self.starts[index]:self.starts[index + 1]]


def _shard_rows(shards) -> tuple[_Rows, _Rows, _Rows]:
    """Each source's shard paths, record counts and index paths (manifest order) as rows."""
    return (_Rows.of([[s.path for s in row] for row in shards], tf.string),
            _Rows.of([[s.num_examples for s in row] for row in shards], tf.int64),
            _Rows.of([[s.index_path for s in row] for row in shards], tf.string))
