"""One dataset's input pipeline, training or evaluation: what ``reader.build_dataset`` runs for a folder or a DatasetInfo.

Training in the default "streams" order (``reader/order.py``: a pure function
of dataset, seed and epoch, resumable from a step), per input pipeline::

    start step (an int, a Position, or a variable read when iteration begins)
    -> epochs from the start's on, each: this pipeline's streams, read
       round-robin, records seeking to their window   [order.host_records]
    -> (record, key): parse, 64 records per call, one element per record again
    -> map(crop-before-decode + resize + flip seeded by (seed, key), AUTOTUNE)  fused by TF with ...
    -> batch(drop_remainder=True)                                               ... the batch
    -> prefetch(AUTOTUNE) [or to a device]

Evaluation, and training with ``ReadOptions(order="buffer")``, a cache or the
tf.data service: ``reader/buffered.py``.

Parsing 64 records per call, not one per call inside the decode map: measured
on 300-500 px photos, ``parse_single_example`` cost 125 us per record, about 8%
of a decode, and ``parse_example`` on 64 records plus the unbatch 30 us.
"""

from __future__ import annotations

import logging
import random
from typing import Optional

import tensorflow as tf

from reader import tasks
from reader.buffered import BufferedRead, buffered_batches
from reader.delivery import deliver, tf_options
from reader.foreign import check_foreign_shards
from reader.info import DatasetInfo, SplitInfo
from reader.options import ForeignShards, ObjectTargets, ReadOptions, as_options, check_flag, check_output, image_hw
from reader.order import StreamLayout, check_pipelines, host_records, stream_layout
from reader.pipeline_checks import Request, check_positive, check_seed, check_targets, present_split, start_step
from reader.positions import DatasetPosition
from reader.records import AUTOTUNE, SegmentReader, Source
from reader.tasks import PARSE_BATCH  # a global here: bench/reader_stages.py sets it to compare

logger = logging.getLogger(__name__)



# Plain graph code (its conditionals are tf.cond or on Python values), as the mixtures' (mixture_pipeline): every
# map built here is traced without AutoGraph's conversion, which changes no op and was a third of a build's CPU
# (a small dataset's training pipeline and first batch 1.9 -> 1.3 s, an evaluation one 0.6 -> 0.2 s).
@tf.autograph.experimental.do_not_convert
def dataset_batches(info: DatasetInfo, request: Request) -> tf.data.Dataset:
    """The batches of one dataset (a folder's manifest, or a :class:`DatasetInfo`) for ``request``.

    ``reader.build_dataset`` (``reader/builder.py``) documents every argument and calls this for a dataset.
    """
    r = request
    options = as_options(r.options, ReadOptions, "options")
    split_info = info.split(r.split)
    size = image_hw(r.image_size)
    dtype = check_output(r.dtype, r.normalization)
    training = check_flag(r.training, "training")
    with_source = check_flag(r.with_source, "with_source")
    augment = tasks.default_augment(info.task, r.augment)
    foreign = as_options(r.foreign, ForeignShards, "foreign")
    keys, label_offset = foreign.keys, foreign.label_offset
    targets = check_targets(as_options(r.targets, ObjectTargets, "targets"), info)
    batch_size = check_positive(batch_size=r.batch_size)
    _check_arguments(r.num_epochs, r.num_steps, r.crop_fraction, options, r.input_context)
    seed = check_seed(r.seed)
    if not info.converted:
        check_foreign_shards(split_info, keys)
    split_info = present_split(split_info, r.skip_corrupt)
    streams = _reads_streams(training, options, split_info, batch_size, r.start)
    source = Source(info, split_info, keys, label_offset, r.skip_corrupt)
    input_context = r.input_context
    pipelines, pipeline_id = (1, 0) if input_context is None else (
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    per_pipeline_batch = batch_size if input_context is None else input_context.get_per_replica_batch_size(batch_size)
    images = tasks.ImageChoices(size, augment, _decode_choices(info, split_info, size), dtype, r.normalization,
                                r.crop_fraction)
    task = tasks.for_dataset(info.task, info.classes, keys, label_offset, targets, images)
    deterministic = r.deterministic
    if streams:
        layout = stream_layout(split_info.num_examples, batch_size, options.streams, options.window, split_info.name)
        check_pipelines(layout, pipelines)
        seed, start = start_step(r.start, seed, DatasetPosition,
                                 lambda saved: _position_mismatch(saved, seed, info, split_info, layout),
                                 "this pipeline")
        deterministic = seed is not None if deterministic is None else deterministic
        run_seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
        records = _stream_records(source, layout, run_seed, start, r.num_epochs, pipelines, pipeline_id)
        dataset = _train_batches(records, task, run_seed, deterministic, per_pipeline_batch)
    else:
        read = BufferedRead(training=training, seed=seed, deterministic=deterministic, num_epochs=r.num_epochs,
                            pipelines=pipelines, pipeline_id=pipeline_id, batch=per_pipeline_batch, task=task,
                            parse_batch=PARSE_BATCH)
        dataset = buffered_batches(source, options, read)
        deterministic = deterministic if deterministic is not None else seed is not None
    if with_source:  # one source, index 0: a mixture's batches of one source
        dataset = dataset.map(lambda images, *rest: (images, *rest, tf.zeros(tf.shape(images)[:1], tf.int32)))
    dataset = dataset.with_options(tf_options(deterministic or not training, input_context, options.private_threads))
    return deliver(dataset, options)


def _reads_streams(training: bool, options: ReadOptions, split_info: SplitInfo, batch_size: int, start) -> bool:
    """Whether this pipeline reads in the streams order; ``ValueError`` for a ``start`` it cannot honour."""
    streams = training and options.order == "streams" and options.cache is None and options.service is None
    if streams and split_info.num_examples < batch_size and start is None:
        # No whole batch per epoch: the buffer order's batches hold examples of several epochs (it warns).
        streams = False
    if start is not None and not streams:
        raise ValueError("start= resumes the training order; it needs training=True and options.order='streams' "
                         "without cache or service (their order depends on the pipeline count)")
    return streams


def _stream_records(source: Source, layout: StreamLayout, seed: int, start_step: tf.Tensor,
                    num_epochs: Optional[int], pipelines: int, pipeline_id: int) -> tf.data.Dataset:
    """``(record, key)`` of this pipeline in the "streams" order, from global step ``start_step`` on."""
    split = source.split
    segment = SegmentReader(source.skip_corrupt, source.labels, source.s3, source.read_buffer)

    def from_step(step: tf.Tensor) -> tf.data.Dataset:
        return host_records(split.files, source.counts, [shard.index_path for shard in split.shards], layout, seed,
                            step, num_epochs, pipelines, pipeline_id, segment, [shard.first for shard in split.shards])

    # The start is read when iteration begins, so a variable restored after this call (Keras'
    # BackupAndRestore restores the optimizer's step in on_train_begin) is the one that counts.
    records = tf.data.Dataset.from_tensors(0).map(lambda _: tf.cast(start_step(), tf.int64)).flat_map(from_step)
    if source.skip_corrupt:  # the places of skipped records are dropped: later batches shift (documented)
        records = records.filter(lambda record, key: tf.strings.length(record) > 0)
    return records


def _train_batches(records: tf.data.Dataset, task: tasks.Task, seed: int, deterministic: bool,
                   batch: int) -> tf.data.Dataset:
    """``(record, key)`` -> parse (64 per call) -> the task's example seeded by (seed, key) -> batches."""
    seed_tensor = tf.constant(seed, tf.int64)

    def train_example(parsed: dict, key: tf.Tensor) -> tuple:
        return task.train(parsed, tf.stack([seed_tensor, key]))

    parsed = tasks.parsed(records, task, PARSE_BATCH)
    dataset = parsed.map(train_example, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    return task.batch(dataset, batch, True)


def _position_mismatch(position: DatasetPosition, seed, info: DatasetInfo, split_info: SplitInfo,
                       layout: StreamLayout) -> str:
    """Why ``position`` does not belong to this pipeline, or ""."""
    if not info.is_version(position.fingerprint):
        return (f"it was saved on {position.dataset()} and {info.data_dir or 'this dataset'} is version "
                f"{info.fingerprint} (another dataset, or reconverted or changed since); restart the epoch, or read "
                "the version it was saved on")
    pairs = [("split", position.split, split_info.name), ("seed", position.seed, position.seed if seed is None else seed),
             ("batch_size", position.batch_size, layout.batch_size), ("streams", position.streams, layout.streams),
             ("window", position.window, layout.window)]
    for name, saved, now in pairs:
        if saved != now:
            return f"it was saved with {name}={saved!r} and this pipeline has {name}={now!r}"
    return ""


def _decode_choices(info: DatasetInfo, split_info: SplitInfo, size: tuple[int, int]) -> dict:
    """What the decode step may skip, decided once from the manifest rather than per record.

    A converted dataset holds only JPEGs (no format check), and a split whose
    largest image is under twice the output size never gains from a
    reduced-scale decode (no choice of scale).
    """
    large = split_info.max_side is None or split_info.max_side >= 2 * min(size)
    return {"all_jpeg": info.all_jpeg, "scaled_decode": large}


def _check_arguments(num_epochs, num_steps, crop_fraction, options: ReadOptions, input_context) -> None:
    """``ValueError`` naming the first bad argument of ``build_dataset`` over one dataset."""
    if input_context is not None and not isinstance(input_context, tf.distribute.InputContext):
        raise ValueError(
            f"input_context must be the tf.distribute.InputContext that distribute_datasets_from_function passes "
            f"to its function, got {type(input_context).__name__}; to read under a strategy, use "
            "reader.distributed_dataset(strategy, data_dir, ...)")
    if num_epochs is not None:
        check_positive(num_epochs=num_epochs)
    if num_steps is not None:
        raise ValueError("num_steps= sizes a run over a mixture (it has no epochs of its own); over one dataset, "
                         "size it with num_epochs= (or take(steps) from the batches)")
    if not 0 < crop_fraction <= 1:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}")
    if options.service is not None and (input_context is not None or options.cache is not None):
        raise ValueError("service distributes the work itself: do not combine it with input_context or cache")
