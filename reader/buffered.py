"""Evaluation, and training in the "buffer" order: shard files interleaved, (cached), shuffled by a buffer, decoded.

Data in: a split's shards (:class:`reader.records.Source`) and the
:class:`ReadOptions`. Data out: ``(images, labels)`` batches. Training, per
epoch e and input pipeline::

    shard files, shuffled by (seed, e), then this pipeline's share  [file_order]
    -> parallel interleave of TFRecordDatasets                      [interleave_records]
    -> (cache of the *encoded* records, filled on the first epoch)
  epochs chained indefinitely, then
    -> parse, 64 records per call -> shuffle buffer of encoded images
    -> crop/decode/flip seeded by (seed, position) -> batch(drop_remainder=True)

This order depends on the number of input pipelines and on the buffer's
state, so it cannot resume; ``cache`` and the tf.data service read in it.
Evaluation: files in manifest order -> interleave (deterministic) -> (cache)
-> parse -> centre crop -> batches keeping the final partial one, with a
known number of batches. A masked version's file is one input of that
interleave, its live records in file order (``file_order(join_runs=True)``).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Optional, Sequence

import tensorflow as tf

from reader.cache import cache_prefix, cached, check_memory_cache
from reader.options import ReadOptions
from reader.records import AUTOTUNE, Source, file_order, interleave_records
from reader.tasks import Task, parsed

logger = logging.getLogger(__name__)

# File order when no seed is given: a constant, so that every input pipeline of
# a run computes the same permutation and their file sets stay disjoint.
UNSEEDED_FILE_SEED = 0x5EED


@dataclasses.dataclass(frozen=True)
class BufferedRead:
    """What one input pipeline reads in the "buffer" order and what each example becomes.

    ``pipelines``/``pipeline_id``: the input pipelines of the run and this one;
    ``batch``: this pipeline's batch; ``task``: what each record becomes
    (``reader/tasks.py``); ``parse_batch``: records parsed per call.
    """

    training: bool
    seed: Optional[int]
    deterministic: Optional[bool]
    num_epochs: Optional[int]
    pipelines: int
    pipeline_id: int
    batch: int
    task: Task
    parse_batch: int


def buffered_batches(source: Source, options: ReadOptions, read: BufferedRead) -> tf.data.Dataset:
    """Evaluation, and training in the "buffer" order (interleave + shuffle buffer; cache and service)."""
    training, seed, deterministic, num_epochs = read.training, read.seed, read.deterministic, read.num_epochs
    pipelines, pipeline_id, batch, task = read.pipelines, read.pipeline_id, read.batch, read.task
    split_info, files, counts = source.split, source.split.files, source.counts
    # The interleave's inputs: evaluation reads a masked file as one (its runs in file order, as a fresh
    # conversion's file); the buffer order reads each run as one, as it always has.
    inputs = counts if training else source.file_counts
    by_file = pipelines <= len(inputs)
    if not by_file:
        logger.warning(
            "%s has %d shard files for %d input pipelines: every pipeline reads all files and keeps 1/%d "
            "of the records. Convert with --shards >= %d to shard by file.",
            split_info.name, len(inputs), pipelines, pipelines, pipelines,
        )
    if training and batch > split_info.num_examples // pipelines:
        logger.warning("split %s has %d examples%s, fewer than one batch of %d: every batch holds repeats of "
                       "the same examples, from several epochs (read in the buffer order, which cannot resume "
                       "from a step)", split_info.name, split_info.num_examples,
                       f" for {pipelines} input pipelines" if pipelines > 1 else "", batch)
    cache = options.cache
    if cache == "memory":
        check_memory_cache(split_info.name, split_info.num_bytes // pipelines)
    elif cache is not None:
        cache = cache_prefix(cache, source.info, split_info.name, pipelines)
    if deterministic is None:
        deterministic = seed is not None
    base_seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    file_seed = seed if seed is not None else UNSEEDED_FILE_SEED

    def records_of_epoch(epoch: "tf.Tensor | int", shuffle: bool, ordered: bool) -> tf.data.Dataset:
        order = file_order(
            files, counts, seed=file_seed if shuffle else None, epoch=epoch,
            num_shards=pipelines if by_file else 1, shard_index=pipeline_id if by_file else 0,
            extents=source.extents, join_runs=not training,  # a masked version's runs (None: whole files)
        )
        records = interleave_records(order, options.cycle_length, options.block_length,
                                     deterministic=ordered or deterministic, skip_corrupt=source.skip_corrupt,
                                     labels=source.labels, s3=source.s3, read_buffer=source.read_buffer)
        return records if by_file or pipelines == 1 else records.shard(pipelines, pipeline_id)

    if training:
        records = _training_records(records_of_epoch, cache, pipeline_id, num_epochs)
        dataset = parsed(records, task, read.parse_batch)
        dataset = dataset.shuffle(options.shuffle_buffer, seed=base_seed, reshuffle_each_iteration=True).enumerate()
        seed_tensor = tf.constant(base_seed, tf.int64)
        dataset = dataset.map(lambda index, features: task.train(features, tf.stack([seed_tensor, index])),
                              num_parallel_calls=AUTOTUNE, deterministic=deterministic)
        return task.batch(dataset, batch, True)
    records = records_of_epoch(0, shuffle=False, ordered=True)
    records = cached(records, cache, pipeline_id)
    dataset = parsed(records, task, read.parse_batch)
    dataset = dataset.map(task.eval, num_parallel_calls=AUTOTUNE, deterministic=True)
    dataset = task.batch(dataset, batch, False)
    if not source.skip_corrupt and options.service is None:
        # Known length: Keras and progress bars see the number of batches, and a short read fails loudly.
        records = _eval_records(inputs, pipelines, pipeline_id, by_file)
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(-(-records // batch)))
    return dataset


def _training_records(records_of_epoch, cache, pipeline_id, num_epochs) -> tf.data.Dataset:
    """The records of the "buffer" order's training epochs, chained; the caller parses and shuffles them.

    Epochs are chained first and then shuffled by one buffer (the faster
    "repeat before shuffle" order of the tf.data guide: no refill stall at
    epoch boundaries, which blur by at most one buffer). Each example's
    augmentation seed is (seed, position in the shuffled stream), so a seeded
    run repeats exactly whatever the map's parallel scheduling.
    """
    if cache is not None:
        first = cached(records_of_epoch(0, shuffle=True, ordered=False), cache, pipeline_id)
        return first.repeat(num_epochs)  # the cache replays the first epoch's records
    epochs = tf.data.Dataset.range(num_epochs) if num_epochs is not None else tf.data.Dataset.range(1 << 62)
    return epochs.flat_map(lambda epoch: records_of_epoch(epoch, shuffle=True, ordered=False))


def _eval_records(counts: Sequence[int], pipelines: int, pipeline_id: int, by_file: bool) -> int:
    """Records one eval pipeline yields: its files' counts, or its share of every record."""
    if by_file:
        return sum(counts[pipeline_id::pipelines])
    total = sum(counts)
    return total // pipelines + (1 if pipeline_id < total % pipelines else 0)
