"""``build_mixture``: the input pipeline over a :class:`reader.Mixture`, for training or evaluation.

Data in: a mixture (``reader/mixture.py``) or its sources. Data out: batches as
``build_dataset`` yields them (the task's), with the mixture's label ids, and on
request each example's source index as a third element. Training, per input
pipeline::

    start step T (an int, a MixturePosition, or a variable read when iteration begins)
    -> the canonical pipelines c this pipeline reads (h*C/H .. (h+1)*C/H - 1)  [mixture_split.Share]
    -> per (c, source k): c's streams of k's order seeded by (seed, k), from c's record split.consumed(T)[c, k]
       [order.host_records_graph, all built by one map over their packed inputs: mixture_sources]
    -> choose_from_datasets by the split table: slice c of batch t = split(t)[c, 0] records of source 0, ...
    -> its slots of those slices (all of them when H divides C; before anything is parsed)
    -> parse, 64 records per call -> the source's ids mapped into the mixture's (a lookup)
    -> crop/decode/flip seeded by (seed, k, key) -> batch

Evaluation reads each source once, in manifest order, source after source.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Optional, Sequence, Union

import numpy as np
import tensorflow as tf

import record_schema
from reader import record_index, tasks
from reader.label_space import LabelSpace
from reader.mixture import Mixture, MixturePosition, mixture
from reader.mixture_sources import source_records as _source_records
from reader.mixture_split import Share, SplitTables
from reader.options import (
    Augmentation,
    BoxAugmentation,
    FeatureKeys,
    ObjectTargets,
    ReadOptions,
    as_int,
    as_options,
    check_flag,
    check_output,
    image_hw,
)
from reader.order import Position
from reader.pipeline import PARSE_BATCH, _check_seed, _check_shards_present, _check_targets, _deliver, _options
from reader.repeat_factor import RepeatFactor
from reader.records import AUTOTUNE, Source, file_order, interleave_records

logger = logging.getLogger(__name__)
_SOURCE_SEED = 0x6D1C  # salts a source's order seed away from the run's seed (two copies of a dataset differ)


def build_mixture(
    sources: Union[Mixture, Sequence[tuple]],
    split: str = "train",
    batch_size: int = 64,
    image_size: Union[int, Sequence[int]] = 224,
    training: bool = True,
    seed: Optional[int] = None,
    deterministic: Optional[bool] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
    *,
    start: Union[None, int, MixturePosition, tf.Variable, tf.Tensor] = None,
    num_steps: Optional[int] = None,
    dtype: tf.DType = tf.float32,
    normalization: Optional[str] = None,
    augment: Union[None, Augmentation, BoxAugmentation] = None,
    crop_fraction: float = 0.875,
    targets: ObjectTargets = ObjectTargets(),
    labels: LabelSpace = LabelSpace(),
    with_source: bool = False,
    repeat_factor: Optional[RepeatFactor] = None,
    options: ReadOptions = ReadOptions(),
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of batches drawn from several converted datasets, each its exact share of every batch.

    Args:
      sources: a :class:`reader.Mixture` (``reader.mixture(...)``), or its
        sources, ``[(data_dir, weight), ...]`` or ``(data_dir, weight, name)``.
      split, batch_size: as ``build_dataset``'s (``batch_size`` is the global
        batch, each source's share of which is exact: floor or ceiling of
        ``batch_size * weight``); with a Mixture, they must be its own.
      training: True: the training preset and the mixture's order (repeats
        without end, or ``num_steps``). False: each source once, in order.
      seed, input_context, start: as ``build_dataset``'s (always deterministic:
        ``deterministic=False`` is refused, since examples overtaking each other
        would move them between batches and break the quotas); a
        ``start`` position is a :class:`reader.MixturePosition`
        (``mixture.position(seed, step)``), refused on another mixture naming
        the difference.
      num_steps: training steps to yield, counted from step 0 (size a run in
        passes over a source with ``mixture.steps_for(passes, name)``).
      image_size, dtype, normalization, augment, crop_fraction, targets: the
        mixture's, as ``build_dataset``'s; the same for every source.
      labels: how the classes unite (:class:`reader.LabelSpace`; with a
        Mixture, its own).
      with_source: also yield each example's source index (int32 ``[B]``,
        into ``mixture.names``): batches are ``(images, targets, sources)``.
      repeat_factor: repeat-factor sampling in training (:class:`reader.RepeatFactor`;
        with a Mixture, its own): images of rare classes repeated, each source's epoch longer.
      options: ``window``, ``private_threads`` and ``prefetch_to_device`` apply.

    Raises:
      ValueError: a bad argument, a source of another task (named with its
        task), a position of another mixture (naming the difference).
    """
    training = check_flag(training, "training")
    with_source = check_flag(with_source, "with_source")
    options = as_options(options, ReadOptions, "options")
    targets = as_options(targets, ObjectTargets, "targets")
    if options.order != "streams" or options.cache is not None or options.service is not None or options.streams:
        raise ValueError("a mixture reads each source in its own streams order: ReadOptions(order=, streams=, "
                         "cache=, service=) do not apply to it (window=, private_threads=, prefetch_to_device= do)")
    plan = sources if isinstance(sources, Mixture) else mixture(
        sources, split, batch_size, labels, targets.contiguous_ids, options.window, repeat_factor if training else None)
    if isinstance(sources, Mixture) and not training:  # evaluation: any split and batch of the same sources
        plan = plan.replanned(plan.sources[0].info.split(split).name, batch_size)
    _check_plan(plan, split, batch_size, labels, targets, repeat_factor if training else None)
    size = image_hw(image_size)
    dtype = check_output(dtype, normalization)
    augment = tasks.default_augment(plan.task, augment)
    splits = [_present(source) for source in plan.sources]
    for source in plan.sources:
        _check_targets(targets, source.info)
    large = any(s.max_side is None or s.max_side >= 2 * min(size) for s in splits)
    images = tasks.ImageChoices(size, augment, {"all_jpeg": all(s.info.all_jpeg for s in plan.sources),
                                                "scaled_decode": large}, dtype, normalization, crop_fraction)
    task = tasks.for_dataset(plan.task, plan.classes, FeatureKeys(), 0,
                             dataclasses.replace(targets, contiguous_ids=False), images)
    remap = _remap(plan)
    pipelines, pipeline_id = (1, 0) if input_context is None else (
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    if not training:
        if input_context is not None or start is not None or num_steps is not None:
            raise ValueError("evaluation over a mixture reads each source once in one pipeline: input_context=, "
                             "start= and num_steps= are for training")
        dataset = _evaluation(plan, splits, task, remap, with_source, batch_size)
        return _deliver(dataset.with_options(_options(True, None, options.private_threads)), options)
    if batch_size % pipelines:
        raise ValueError(f"{pipelines} input pipelines cannot share a global batch of {batch_size} evenly")
    seed = _check_seed(seed)
    seed, start_step = _start(start, seed, plan)
    if deterministic is False:
        raise ValueError("deterministic=False would let examples overtake each other across batches, and a "
                         "mixture's batches hold their exact quotas only in order: leave deterministic unset")
    deterministic = True
    run_seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    if num_steps is not None and (as_int(num_steps) is None or num_steps < 1):
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
    per_pipeline = batch_size // pipelines
    slots = (pipeline_id * per_pipeline, (pipeline_id + 1) * per_pipeline)
    if plan.canonical_pipelines % pipelines:
        logger.warning("%d input pipelines do not divide the mixture's %d canonical pipelines: each reads the "
                        "canonical pipelines its slots fall in and keeps its slots, reading more than it decodes; "
                        "plan the mixture with reader.mixture(..., canonical_pipelines=N), N a multiple of %d "
                        "dividing %d, to read only its share", pipelines, plan.canonical_pipelines, pipelines,
                        batch_size)
    records = _mixed_records(plan, splits, run_seed, start_step, num_steps, slots)
    per_replica = per_pipeline if input_context is None else input_context.get_per_replica_batch_size(batch_size)
    dataset = _train_batches(records, task, remap, _source_seeds(run_seed, len(plan.sources)), deterministic,
                             per_replica)
    if with_source:
        dataset = _with_sources(dataset, _step_sources(plan, start_step, num_steps, slots).unbatch()
                                .batch(per_replica, drop_remainder=True))
    return _deliver(dataset.with_options(_options(deterministic, input_context, options.private_threads)), options)


def _check_plan(plan: Mixture, split: str, batch_size: int, labels: LabelSpace, targets: ObjectTargets,
                repeat_factor: Optional[RepeatFactor]) -> None:
    """A Mixture given whole must be the one the other arguments describe."""
    if plan.batch_size != batch_size:
        raise ValueError(f"the mixture was planned for batch_size={plan.batch_size} and build_mixture got "
                         f"batch_size={batch_size}")
    if plan.split != plan.sources[0].info.split(split).name:
        raise ValueError(f"the mixture was planned for split {plan.split!r} and build_mixture got split={split!r}")
    if targets.contiguous_ids and not plan.contiguous_ids and plan.task == record_schema.TASK_OBJECTS:
        raise ValueError(f"the mixture numbers objects with contiguous_ids={plan.contiguous_ids} and targets has "
                         f"contiguous_ids={targets.contiguous_ids}: plan it with reader.mixture(..., "
                         f"contiguous_ids={targets.contiguous_ids})")
    # A Mixture carries its own label space and repeat factors: other ones given beside it would be ignored.
    if labels != LabelSpace() and labels != plan.space:
        raise ValueError(f"build_mixture got labels={labels!r} and a mixture planned with labels={plan.space!r}: "
                         "plan it with reader.mixture(..., labels=...) instead")
    if repeat_factor is not None and repeat_factor != plan.repeat_factor:
        raise ValueError(f"build_mixture got repeat_factor={repeat_factor!r} and a mixture planned with "
                         f"repeat_factor={plan.repeat_factor!r}: plan it with reader.mixture(..., repeat_factor=...)")


def _present(source):
    """The source's split with every shard present (or an error naming the missing) and usable indexes."""
    split = source.split
    listings = record_index.list_folders([s.path for s in split.shards] + [s.index_path for s in split.shards
                                                                          if s.index_path])
    split = _check_shards_present(split, False, listings)
    return record_index.usable(split, listings)


def _start(start, seed: Optional[int], plan: Mixture):
    """(seed, a function giving the start step as a tensor); ``ValueError`` naming a mismatch."""
    if start is None:
        return seed, lambda: tf.constant(0, tf.int64)
    if isinstance(start, Position):
        raise ValueError(f"start={start.to_json()} is a position of one dataset; a mixture resumes from a "
                         "reader.MixturePosition (mixture.position(seed, step)) or a global step")
    if isinstance(start, MixturePosition):
        mismatch = plan.mismatch(start, seed)
        if mismatch:
            raise ValueError(f"start={start.to_json()} cannot resume this mixture: {mismatch}")
        return start.seed, lambda: tf.constant(start.step, tf.int64)
    if seed is None:
        raise ValueError("start= needs the run's seed: pass seed=..., the same on every restart")
    step = as_int(start)
    if step is not None:
        if step < 0:
            raise ValueError(f"start must be a global step >= 0, got {start!r}")
        return seed, lambda: tf.constant(step, tf.int64)
    variable = getattr(start, "value", start)
    if isinstance(variable, tf.Variable) or tf.is_tensor(variable):
        return seed, lambda: tf.convert_to_tensor(variable)
    raise ValueError(f"start must be None, a global step, a reader.MixturePosition or a variable holding the step, "
                     f"got {type(start).__name__} {start!r}")


def _source_seeds(seed: int, count: int) -> list[int]:
    """Each source's order and augmentation seed: (seed, k) mixed, below 2**63."""
    return [int((seed * 0x9E3779B97F4A7C15 + (k + 1) * 0xBF58476D1CE4E5B9 + _SOURCE_SEED) % (1 << 63))
            for k in range(count)]


def _steps(start_step, num_steps: Optional[int]) -> tf.data.Dataset:
    """The global steps from the start (read when iteration begins) to ``num_steps`` (or without end)."""
    end = num_steps if num_steps is not None else 1 << 62
    first = tf.data.Dataset.from_tensors(0).map(lambda _: tf.cast(start_step(), tf.int64))
    return first.flat_map(lambda step: tf.data.Dataset.range(step, tf.maximum(step, end)))


def _step_sources(plan: Mixture, start_step, num_steps: Optional[int], slots: tuple[int, int]) -> tf.data.Dataset:
    """Per step, this pipeline's slots' source indexes (int32 ``[slots]``): the split table, nothing read."""
    tables = SplitTables.of(plan)
    return _steps(start_step, num_steps).map(lambda step: tables.slot_sources(step)[slots[0]:slots[1]])


def _mixed_records(plan: Mixture, splits, seed: int, start_step, num_steps: Optional[int],
                   slots: tuple[int, int]) -> tf.data.Dataset:
    """``(record, key, source)`` of this pipeline's slots of every global batch from the start step on.

    It reads the canonical pipelines its slots fall in (:class:`mixture_split.Share`): each one's streams of
    each source, chosen slot by slot by the split table; when its pipeline count divides C it keeps all.
    """
    seeds = _source_seeds(seed, len(plan.sources))
    share = Share.of(plan, slots)
    tables = SplitTables.of(plan)
    sources = len(plan.sources)

    @tf.autograph.experimental.do_not_convert  # plain graph code: converting it cost about 1 s of CPU a source
    def from_step(step: tf.Tensor) -> tf.data.Dataset:
        consumed = tables.consumed(step)[share.first:share.last]
        streams = _source_records(plan, splits, seeds, consumed, share.first)
        end = num_steps if num_steps is not None else 1 << 62
        choice = tf.data.Dataset.range(step, tf.maximum(step, end)).map(lambda t: tables.choices(t, share)).unbatch()
        # Each record tagged with its source from the choices themselves: one map, not one a source.
        mixed = tf.data.Dataset.choose_from_datasets(streams, choice)
        return tf.data.Dataset.zip((mixed, choice)).map(
            lambda record_key, pick: (*record_key, tf.cast(pick % sources, tf.int32)))

    first = tf.data.Dataset.from_tensors(0).map(lambda _: tf.cast(start_step(), tf.int64))
    records = first.flat_map(from_step)
    if share.whole:
        return records
    lo, hi = share.keep
    return records.batch(share.count * share.slice_size, drop_remainder=True).map(
        lambda record, key, source: (record[lo:hi], key[lo:hi], source[lo:hi])).unbatch()


def _remap(plan: Mixture):
    """``(parsed, source) -> parsed`` with the source's ids replaced by the mixture's (a table lookup).

    A record id outside its source's classes (a shard that disagrees with its manifest) fails naming the
    source and the id, and ``verify`` names the record: mapped to some class, it would train on a wrong label.
    """
    tables = plan.labels.tables
    offsets = tf.constant(np.cumsum([0] + [len(t) for t in tables[:-1]]), tf.int64)
    sizes = tf.constant([len(t) for t in tables], tf.int64)
    flat = tf.constant(np.concatenate(tables), tf.int64)
    # Text joined, not formatted (format quotes text) and without quotes (Assert's message escapes them).
    names = tf.constant([f"source {k} ({s.name}: {s.info.data_dir}, split {s.split.name})"
                         for k, s in enumerate(plan.sources)])
    folders = tf.constant([s.info.data_dir for s in plan.sources])

    def refuse(ids: tf.Tensor, size: tf.Tensor, source: tf.Tensor) -> tf.Tensor:
        flat_ids = tf.reshape(ids, [-1])  # one id (a class), or several (labels, objects)
        outside = tf.boolean_mask(flat_ids, (flat_ids < 0) | (flat_ids >= size))
        number = tf.strings.as_string
        message = tf.strings.join([
            tf.gather(names, source), ": a record has label id ", number(outside[0]), ", outside the ",
            number(size), " classes its manifest lists (0..", number(size - 1), "); python -m converter verify ",
            tf.gather(folders, source), " names the record"])
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.identity(ids)

    def lookup(ids: tf.Tensor, source: tf.Tensor) -> tf.Tensor:
        ids = tf.cast(ids, tf.int64)
        size = tf.gather(sizes, source)
        inside = tf.reduce_all((ids >= 0) & (ids < size))
        ids = tf.cond(inside, lambda: ids, lambda: refuse(ids, size, source))  # the message only when it fails
        return tf.gather(flat, tf.gather(offsets, source) + ids)

    def remap(parsed: dict, source: tf.Tensor) -> dict:
        parsed = dict(parsed)
        if plan.task == record_schema.TASK_CLASSIFICATION:
            parsed[record_schema.LABEL] = lookup(parsed[record_schema.LABEL], source)
        elif plan.task == record_schema.TASK_MULTILABEL:
            ids = lookup(parsed[record_schema.LABEL], source)
            parsed[record_schema.LABEL] = tf.boolean_mask(ids, ids >= 0)
        elif plan.task == record_schema.TASK_OBJECTS:
            rows = parsed[tasks.OBJECTS_KEY]  # [N, 7]: box, class id, is_crowd, difficult (reader/tasks.py)
            column = tasks.OBJECT_CLASS_COLUMN
            ids = tf.cast(lookup(tf.cast(rows[:, column], tf.int64), source), rows.dtype)
            parsed[tasks.OBJECTS_KEY] = tf.concat([rows[:, :column], ids[:, None], rows[:, column + 1:]], axis=1)
        return parsed

    return remap


def _train_batches(records: tf.data.Dataset, task: tasks.Task, remap, seeds: list[int], deterministic: bool,
                   batch: int) -> tf.data.Dataset:
    """``(record, key, source)`` -> parse (64 per call) -> ids mapped -> example seeded by (source seed, key)."""
    seed_table = tf.constant(seeds, tf.int64)

    def train_example(parsed: dict, key: tf.Tensor, source: tf.Tensor) -> tuple:
        return task.train(remap(parsed, source), tf.stack([tf.gather(seed_table, source), key]))

    parsed = tasks.parsed(records, task, PARSE_BATCH)
    dataset = parsed.map(train_example, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    return task.batch(dataset, batch, True)


def _with_sources(batches: tf.data.Dataset, sources: tf.data.Dataset) -> tf.data.Dataset:
    return tf.data.Dataset.zip((batches, sources)).map(lambda batch, source: (*batch, source))


def _evaluation(plan: Mixture, splits, task: tasks.Task, remap, with_source: bool, batch: int) -> tf.data.Dataset:
    """Each source once, in manifest order, source after source; the final partial batch kept."""
    examples, total = None, 0
    for k, (source, split) in enumerate(zip(plan.sources, splits)):
        counts = [shard.num_examples for shard in split.shards]
        reader_source = Source(source.info, split, FeatureKeys(), 0, False)
        records = interleave_records(file_order(split.files, counts), deterministic=True, s3=reader_source.s3,
                                     read_buffer=reader_source.read_buffer)
        constant = tf.constant(k, tf.int32)
        parsed = tasks.parsed(records, task, PARSE_BATCH)
        one = parsed.map(lambda features, c=constant: task.eval(remap(features, c)),
                         num_parallel_calls=AUTOTUNE, deterministic=True)
        examples = one if examples is None else examples.concatenate(one)
        total += split.num_examples
    dataset = task.batch(examples, batch, False)
    if with_source:  # from the counts: nothing is read twice
        indexes = np.repeat(np.arange(len(splits), dtype=np.int32), [split.num_examples for split in splits])
        dataset = _with_sources(dataset, tf.data.Dataset.from_tensor_slices(indexes).batch(batch))
    return dataset.apply(tf.data.experimental.assert_cardinality(-(-total // batch)))
