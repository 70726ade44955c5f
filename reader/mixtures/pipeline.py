"""A mixture's input pipeline, training or evaluation: what ``reader.build_dataset`` runs for a :class:`reader.Mixture`.

Data in: a mixture (``reader/mixtures/plan.py``) or its sources. Data out: batches as
one dataset's pipeline yields them (the task's), with the mixture's label ids, and on
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
from typing import Optional

import numpy as np
import tensorflow as tf

import record_schema
from reader import tasks
from reader.delivery import deliver, tf_options
from reader.info import SplitInfo
from reader.mixtures.plan import Mixture
from reader.mixtures.sources import source_records as _source_records
from reader.mixtures.split import Share, SplitTables
from reader.options import (
    FeatureKeys,
    ForeignShards,
    ObjectTargets,
    ReadOptions,
    as_int,
    as_options,
    check_flag,
    check_output,
    image_hw,
)
from reader.pipeline_checks import Request, check_mixture_targets, check_seed, present_split, start_step
from reader.positions import MixturePosition
from reader.records import AUTOTUNE, Source, file_order, interleave_records
from reader.tasks import PARSE_BATCH

logger = logging.getLogger(__name__)
_SOURCE_SEED = 0x6D1C  # salts a source's order seed away from the run's seed (two copies of a dataset differ)


def mixture_batches(plan: Mixture, request: Request) -> tf.data.Dataset:
    """The batches of ``plan`` for ``request``; ``reader.build_dataset`` documents every argument.

    Training reads the plan's split at its batch size (another is refused, naming both); evaluation
    reads any split at any batch size of the same sources (the plan is re-planned for it).
    """
    r = request
    training = check_flag(r.training, "training")
    with_source = check_flag(r.with_source, "with_source")
    options = check_mixture_options(r.options)
    targets = as_options(r.targets, ObjectTargets, "targets")
    _check_unused(r)
    batch_size = r.batch_size
    if not training:  # evaluation: any split and batch of the same sources
        plan = plan.replanned(plan.sources[0].info.split(r.split).name, batch_size)
    check_plan(plan, r.split, batch_size, targets)
    size = image_hw(r.image_size)
    dtype = check_output(r.dtype, r.normalization)
    augment = tasks.default_augment(plan.task, r.augment)
    splits = [_present(source) for source in plan.sources]
    targets = check_mixture_targets(targets, [source.info for source in plan.sources])  # keypoints="auto": K
    large = any(s.max_side is None or s.max_side >= 2 * min(size) for s in splits)
    images = tasks.ImageChoices(size, augment, {"all_jpeg": all(s.info.all_jpeg for s in plan.sources),
                                                "scaled_decode": large}, dtype, r.normalization, r.crop_fraction)
    task = tasks.for_dataset(plan.task, plan.classes, FeatureKeys(), 0,
                             dataclasses.replace(targets, contiguous_ids=False), images)
    remap = _remap(plan)
    if not training:
        if r.input_context is not None or r.start is not None or r.num_steps is not None:
            raise ValueError("evaluation over a mixture reads each source once in one pipeline: input_context=, "
                             "start= and num_steps= are for training")
        dataset = _evaluation(plan, splits, task, remap, with_source, batch_size)
        return deliver(dataset.with_options(tf_options(True, None, options.private_threads)), options)
    dataset = _training(plan, splits, task, remap, r)
    return deliver(dataset.with_options(tf_options(True, r.input_context, options.private_threads)), options)


def _training(plan: Mixture, splits: list, task: tasks.Task, remap, r: Request) -> tf.data.Dataset:
    """This input pipeline's training batches: its slots of every global batch from the start step on."""
    batch_size, input_context = r.batch_size, r.input_context
    pipelines, pipeline_id = (1, 0) if input_context is None else (
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    if batch_size % pipelines:
        raise ValueError(f"{pipelines} input pipelines cannot share a global batch of {batch_size} evenly")
    seed = check_seed(r.seed)
    seed, start = start_step(r.start, seed, MixturePosition, lambda saved: plan.mismatch(saved, seed),
                             "this mixture")
    if r.deterministic is False:
        raise ValueError("deterministic=False would let examples overtake each other across batches, and a "
                         "mixture's batches hold their exact quotas only in order: leave deterministic unset")
    run_seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    num_steps = r.num_steps
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
    records = _mixed_records(plan, splits, run_seed, start, num_steps, slots)
    per_replica = per_pipeline if input_context is None else input_context.get_per_replica_batch_size(batch_size)
    dataset = _train_batches(records, task, remap, _source_seeds(run_seed, len(plan.sources)), True, per_replica)
    if r.with_source:
        dataset = _with_sources(dataset, _step_sources(plan, start, num_steps, slots).unbatch()
                                .batch(per_replica, drop_remainder=True))
    return dataset


def check_mixture_options(options: object) -> ReadOptions:
    """The tuning options a mixture takes: each source reads in its own streams order."""
    options = as_options(options, ReadOptions, "options")
    if options.order != "streams" or options.cache is not None or options.service is not None or options.streams:
        raise ValueError("a mixture reads each source in its own streams order: ReadOptions(order=, streams=, "
                         "cache=, service=) do not apply to it (window=, private_threads=, prefetch_to_device= do)")
    return options


def _check_unused(request: Request) -> None:
    """Arguments of one dataset that a mixture has no use for are refused, not ignored."""
    if request.foreign != ForeignShards():
        raise ValueError("foreign= reads shards written by other tools; a mixture's sources are the converter's "
                         "(it unites their classes by name from their manifests)")
    if request.skip_corrupt is not False:
        raise ValueError("skip_corrupt=True would shift a mixture's exact quotas: verify the sources "
                         "(python -m converter verify DIR) and read them whole")
    if request.num_epochs is not None:
        raise ValueError("num_epochs= counts one dataset's epochs; a mixture's sources pass at their own rates: "
                         "size the run with num_steps= (mixture.steps_for(passes, source))")


def check_plan(plan: Mixture, split: str, batch_size: int, targets: ObjectTargets) -> None:
    """A Mixture's own split and batch are the ones the other arguments name (they need not be said again)."""
    if plan.batch_size != batch_size:
        raise ValueError(f"the mixture was planned for batch_size={plan.batch_size} and build_dataset got "
                         f"batch_size={batch_size}: leave batch_size unset to read the plan's, or plan another "
                         "with reader.mixture(..., batch_size=...)")
    if plan.split != plan.sources[0].info.split(split).name:
        raise ValueError(f"the mixture was planned for split {plan.split!r} and build_dataset got split={split!r}: "
                         "leave split unset to read the plan's, or plan another with reader.mixture(..., split=...)")
    if targets.contiguous_ids and not plan.contiguous_ids and plan.task == record_schema.TASK_OBJECTS:
        raise ValueError(f"the mixture numbers objects with contiguous_ids={plan.contiguous_ids} and targets has "
                         f"contiguous_ids={targets.contiguous_ids}: plan it with reader.mixture(..., "
                         f"contiguous_ids={targets.contiguous_ids})")


def _present(source) -> "SplitInfo":
    """The source's split with every shard present (or an error naming the missing) and usable indexes."""
    return present_split(source.split)


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


# Plain graph code (its conditionals are tf.cond or on Python values): the maps it builds, the task's parse,
# example and batch functions with them, are traced without AutoGraph's conversion, which was most of a
# mixture's build (5.4 s of CPU of objects, bench.repeat_factor_build) and changes no op.
@tf.autograph.experimental.do_not_convert
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


@tf.autograph.experimental.do_not_convert  # plain graph code, as _train_batches
def _evaluation(plan: Mixture, splits, task: tasks.Task, remap, with_source: bool, batch: int) -> tf.data.Dataset:
    """Each source once, in manifest order, source after source; the final partial batch kept."""
    examples, total = None, 0
    for k, (source, split) in enumerate(zip(plan.sources, splits)):
        counts = [shard.num_examples for shard in split.shards]
        reader_source = Source(source.info, split, FeatureKeys(), 0, False)
        records = interleave_records(file_order(split.files, counts, extents=reader_source.extents),
                                     deterministic=True, s3=reader_source.s3,
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
