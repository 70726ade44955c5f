"""``build_dataset``: the whole input pipeline for training or evaluation.

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

import dataclasses
import logging
import os
import random
from typing import Optional, Sequence, Union

import tensorflow as tf

import record_schema
from reader import record_index, tasks
from reader.buffered import BufferedRead, buffered_batches
from reader.foreign import check_foreign_shards
from reader.info import DatasetInfo, SplitInfo, dataset_info
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
from reader.order import Position, StreamLayout, check_pipelines, host_records, stream_layout
from reader.records import AUTOTUNE, SegmentReader, Source

logger = logging.getLogger(__name__)

PARSE_BATCH = 64  # records per parse call (see the module docstring)


def build_dataset(
    data_dir: str,
    split: str = "train",
    batch_size: int = 64,
    image_size: Union[int, Sequence[int]] = 224,
    training: bool = True,
    seed: Optional[int] = None,
    deterministic: Optional[bool] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
    *,
    start: Union[None, int, Position, tf.Variable, tf.Tensor] = None,
    num_epochs: Optional[int] = None,
    dtype: tf.DType = tf.float32,
    normalization: Optional[str] = None,
    augment: Union[None, Augmentation, BoxAugmentation] = None,
    crop_fraction: float = 0.875,
    targets: ObjectTargets = ObjectTargets(),
    keys: FeatureKeys = FeatureKeys(),
    label_offset: int = 0,
    skip_corrupt: bool = False,
    options: ReadOptions = ReadOptions(),
    info: Optional[DatasetInfo] = None,
    **moved,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches over a converted split.

    Args:
      data_dir: a folder written by the converter (its manifest lists the shards).
      split: "train", "validation" (or "val") or "test".
      batch_size: global batch size; with ``input_context``, each pipeline
        yields ``input_context.get_per_replica_batch_size(batch_size)``.
      image_size: output size, an int or ``(height, width)``.
      training: True for the training preset (random resized crop decoded
        cropped, flip, shuffles, repeats, static batch shape); False for one
        deterministic pass with a centre crop, keeping the final partial batch.
      seed: makes the order and the augmentation reproducible (and resumable).
      deterministic: element order reproducible; default True with a seed,
        False (faster) without. Evaluation is always deterministic.
      input_context: from ``tf.distribute``; each pipeline reads its share of
        the shards. In the default order the H pipelines' batches together
        are the one-pipeline global batch, for any H dividing the streams.
      start: where training starts: a global step (int), a :class:`Position`
        (checked against this dataset, seed and layout; its seed is used when
        ``seed`` is None), or a variable read when iteration starts (Keras'
        ``model.optimizer.iterations``, restored by ``BackupAndRestore``).
        Resuming re-reads at most one window per stream.
      num_epochs: training epochs to yield (counted from epoch 0, so a resumed
        run ends where the uninterrupted one would); None repeats indefinitely.
      dtype: float32, bfloat16, float16, or uint8 (normalise on the accelerator).
      normalization: None (0..255), "mobilenet" ([-1, 1]) or "imagenet" (mean/std).
      augment: the training crop's ranges and the flip.
      crop_fraction: eval centre crop as a fraction of the shorter side.
      keys, label_offset: for shards written by other tools (TFDS: ``FeatureKeys.tfds()``;
        1-based Inception labels: ``label_offset=-1``).
      skip_corrupt: skip the rest of a corrupt shard with a warning instead of failing.
      options: the tuning knobs (:class:`ReadOptions`: order, streams and
        window, shuffle buffer, interleave, cache, tf.data service, threads,
        device prefetch), or a dict of its fields.
      info: a :class:`DatasetInfo` already read (saves re-reading the manifest).

    Raises:
      DatasetNotFoundError: no manifest in ``data_dir``.
      ValueError: an unknown split (the message lists the splits), a bad
        argument, or a ``start`` position saved on another version of the dataset.
      CacheTooLargeError: ``cache="memory"`` and the split does not fit.
    """
    options = as_options(options, ReadOptions, "options")
    _check_moved(moved)
    info = info or dataset_info(data_dir)
    split_info = info.split(split)
    size = image_hw(image_size)
    dtype = check_output(dtype, normalization)
    training = check_flag(training, "training")
    augment = tasks.default_augment(info.task, augment)
    keys = as_options(keys, FeatureKeys, "keys")
    targets = _check_targets(as_options(targets, ObjectTargets, "targets"), info)
    batch_size = _check_positive(batch_size=batch_size)
    _check_arguments(num_epochs, crop_fraction, options, input_context)
    seed = _check_seed(seed)
    if not info.converted:
        check_foreign_shards(split_info, keys)
    listings = record_index.list_folders([shard.path for shard in split_info.shards]
                                         + [shard.index_path for shard in split_info.shards if shard.index_path])
    split_info = _check_shards_present(split_info, skip_corrupt, listings)
    split_info = record_index.usable(split_info, listings)  # a lost or damaged .idx: read through, never fail
    streams = _reads_streams(training, options, split_info, batch_size, start)
    source = Source(info, split_info, keys, label_offset, skip_corrupt)
    pipelines, pipeline_id = (1, 0) if input_context is None else (
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    per_pipeline_batch = batch_size if input_context is None else input_context.get_per_replica_batch_size(batch_size)
    images = tasks.ImageChoices(size, augment, _decode_choices(info, split_info, size), dtype, normalization,
                                crop_fraction)
    task = tasks.for_dataset(info.task, info.classes, keys, label_offset, targets, images)
    if streams:
        layout = stream_layout(split_info.num_examples, batch_size, options.streams, options.window, split_info.name)
        check_pipelines(layout, pipelines)
        seed, start_step = _start(start, seed, info, split_info, layout)
        deterministic = seed is not None if deterministic is None else deterministic
        run_seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
        records = _stream_records(source, layout, run_seed, start_step, num_epochs, pipelines, pipeline_id)
        dataset = _train_batches(records, task, run_seed, deterministic, per_pipeline_batch)
    else:
        read = BufferedRead(training=training, seed=seed, deterministic=deterministic, num_epochs=num_epochs,
                            pipelines=pipelines, pipeline_id=pipeline_id, batch=per_pipeline_batch, task=task,
                            parse_batch=PARSE_BATCH)
        dataset = buffered_batches(source, options, read)
        deterministic = deterministic if deterministic is not None else seed is not None
    dataset = dataset.with_options(_options(deterministic or not training, input_context, options.private_threads))
    return _deliver(dataset, options)


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


def _deliver(dataset: tf.data.Dataset, options: ReadOptions) -> tf.data.Dataset:
    """The batches as the trainer takes them: through the tf.data service, onto a device, or prefetched."""
    if options.service is not None:
        dataset = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=options.service,
            job_name=options.service_job_name))
    if options.prefetch_to_device:
        return dataset.apply(tf.data.experimental.prefetch_to_device(options.prefetch_to_device))
    return dataset.prefetch(AUTOTUNE)


def _stream_records(source: Source, layout: StreamLayout, seed: int, start_step: tf.Tensor,
                    num_epochs: Optional[int], pipelines: int, pipeline_id: int) -> tf.data.Dataset:
    """``(record, key)`` of this pipeline in the "streams" order, from global step ``start_step`` on."""
    split = source.split
    segment = SegmentReader(source.skip_corrupt, source.labels, source.s3, source.read_buffer)

    def from_step(step: tf.Tensor) -> tf.data.Dataset:
        return host_records(split.files, source.counts, [shard.index_path for shard in split.shards], layout, seed,
                            step, num_epochs, pipelines, pipeline_id, segment)

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


def position(data_dir: Union[str, DatasetInfo], split: str, batch_size: int, seed: int, step: int,
             options: ReadOptions = ReadOptions()) -> Position:
    """The :class:`Position` of training at global ``step`` (batches since the start of epoch 0).

    Computed, not read from a pipeline: any host can say where the run is,
    and ``build_dataset(..., start=position)`` continues from there.
    """
    info = data_dir if isinstance(data_dir, DatasetInfo) else dataset_info(data_dir)
    split_info = info.split(split)
    options = as_options(options, ReadOptions, "options")
    layout = stream_layout(split_info.num_examples, _check_positive(batch_size=batch_size), options.streams,
                           options.window, split_info.name)
    seed = _check_seed(seed)
    if seed is None:
        raise ValueError("a position needs the run's seed (a run without one has an order nobody can repeat)")
    step = as_int(step)
    if step is None or step < 0:
        raise ValueError(f"step must be a global step >= 0, got {step!r}")
    epoch, within = divmod(step, layout.steps_per_epoch)
    return Position(info.fingerprint, split_info.name, seed, batch_size, layout.streams, layout.window, epoch, within,
                    layout.steps_per_epoch, data_dir=info.data_dir or "")


def _start(start, seed: Optional[int], info: DatasetInfo, split_info: SplitInfo, layout: StreamLayout):
    """(seed, a function giving the start step as a tensor) from ``start``; ``ValueError`` naming a mismatch."""
    if start is None:
        return seed, lambda: tf.constant(0, tf.int64)
    if isinstance(start, Position):
        mismatch = _position_mismatch(start, seed, info, split_info, layout)
        if mismatch:
            raise ValueError(f"start={start.to_json()} cannot resume this pipeline: {mismatch}")
        return start.seed, lambda: tf.constant(start.global_step, tf.int64)
    if seed is None:
        raise ValueError("start= needs the run's seed: pass seed=..., the same on every restart (a run without "
                         "one has an order nobody can repeat)")
    step = as_int(start)
    if step is not None:
        if step < 0:
            raise ValueError(f"start must be a global step >= 0, got {start!r}")
        return seed, lambda: tf.constant(step, tf.int64)
    variable = getattr(start, "value", start)  # a Keras variable holds a tf.Variable
    if isinstance(variable, tf.Variable) or tf.is_tensor(variable):
        return seed, lambda: tf.convert_to_tensor(variable)
    raise ValueError(f"start must be None, a global step, a reader.Position or a variable holding the step, "
                     f"got {type(start).__name__} {start!r}")


def _position_mismatch(position: Position, seed, info: DatasetInfo, split_info: SplitInfo,
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


def _check_targets(targets: ObjectTargets, info: DatasetInfo) -> ObjectTargets:
    """``targets`` set only for a dataset of objects (elsewhere they would be silently ignored)."""
    where = info.data_dir or "this dataset"
    if targets != ObjectTargets() and info.task != record_schema.TASK_OBJECTS:
        raise ValueError(f"targets={targets!r} shapes detection targets, and {where} holds task {info.task!r}")
    features = info.manifest.get("features", {})
    if targets.mask_size and record_schema.OBJECT_MASK not in features:
        raise ValueError(f"ObjectTargets(mask_size={targets.mask_size}) needs instance masks, and {where}'s records "
                         "have none: convert COCO with --masks")
    if targets.class_mask and record_schema.SEGMENTATION_ENCODED not in features:
        raise ValueError(f"ObjectTargets(class_mask=True) needs a class mask an image, and {where}'s records have "
                         "none: convert Pascal VOC with --masks")
    return targets


def _decode_choices(info: DatasetInfo, split_info: SplitInfo, size: tuple[int, int]) -> dict:
    """What the decode step may skip, decided once from the manifest rather than per record.

    A converted dataset holds only JPEGs (no format check), and a split whose
    largest image is under twice the output size never gains from a
    reduced-scale decode (no choice of scale).
    """
    large = split_info.max_side is None or split_info.max_side >= 2 * min(size)
    return {"all_jpeg": info.all_jpeg, "scaled_decode": large}


def _options(deterministic: bool, input_context, private_threads: Optional[int]) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = deterministic
    if input_context is not None:
        # We shard by file ourselves; tf.distribute must not shard again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if private_threads is not None:
        _check_positive(private_threads=private_threads)
        options.threading.private_threadpool_size = private_threads
    return options


def _check_arguments(num_epochs, crop_fraction, options: ReadOptions, input_context) -> None:
    """``ValueError`` naming the first bad argument of :func:`build_dataset`."""
    if input_context is not None and not isinstance(input_context, tf.distribute.InputContext):
        raise ValueError(
            f"input_context must be the tf.distribute.InputContext that distribute_datasets_from_function passes "
            f"to its function, got {type(input_context).__name__}; to read under a strategy, use "
            "reader.distributed_dataset(strategy, data_dir, ...)")
    if num_epochs is not None:
        _check_positive(num_epochs=num_epochs)
    if not 0 < crop_fraction <= 1:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}")
    if options.service is not None and (input_context is not None or options.cache is not None):
        raise ValueError("service distributes the work itself: do not combine it with input_context or cache")


def _check_moved(moved: dict) -> None:
    """A keyword of earlier versions that is now a :class:`ReadOptions` field is named, with where it went."""
    if not moved:
        return
    name = sorted(moved)[0]
    fields = [f.name for f in dataclasses.fields(ReadOptions)]
    if name in fields:
        raise TypeError(f"build_dataset({name}=...) moved into the tuning options: pass "
                        f"options=reader.ReadOptions({name}={moved[name]!r})")
    raise TypeError(f"build_dataset() got an unexpected keyword argument {name!r}")


def _check_seed(seed: object) -> Optional[int]:
    """``seed`` as a Python int (NumPy integers too), or None."""
    if seed is None:
        return None
    value = as_int(seed)
    if value is None or not 0 <= value < 1 << 63:
        raise ValueError(f"seed must be None or an integer in [0, 2**63), got {seed!r}")
    return value


def _check_shards_present(split_info: SplitInfo, skip_corrupt: bool, listings: dict) -> SplitInfo:
    """Every shard the manifest lists is there (``listings``: one listing per folder), or fail naming the missing;
    with ``skip_corrupt``, the split without them, and one warning (not one per epoch that would have read them).

    The read itself checks again (a file can vanish later); this fails at
    once, before any thread starts.
    """
    missing = [path for path in split_info.files
               if os.path.basename(path) not in listings.get(os.path.dirname(path), {})]
    if not missing:
        return split_info
    names = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    if skip_corrupt:
        logger.warning("split %s: %d listed shards are missing and will be skipped: %s",
                       split_info.name, len(missing), names)
        kept = tuple(shard for shard in split_info.shards if shard.path not in set(missing))
        return dataclasses.replace(split_info, shards=kept, num_examples=sum(s.num_examples for s in kept),
                                   num_bytes=sum(s.num_bytes for s in kept))
    raise FileNotFoundError(
        f"split {split_info.name!r}: {len(missing)} of its {len(split_info.files)} shards are listed in the "
        f"manifest but missing: {names}. The dataset is incomplete: restore them, reconvert, or pass "
        "skip_corrupt=True to read the rest"
    )


def _check_positive(**values: int) -> int:
    """Each value is a positive integer (NumPy integers too); returns the last as a Python int."""
    result = 0
    for name, value in values.items():
        result = as_int(value)
        if result is None or result < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return result


def distributed_dataset(
    strategy: tf.distribute.Strategy, data_dir: str, split: str = "train", batch_size: int = 64, **kwargs
) -> tf.distribute.DistributedDataset:
    """``build_dataset`` per input pipeline through ``strategy.distribute_datasets_from_function``.

    ``batch_size`` is the global batch; each replica gets its share, and each
    input pipeline reads a disjoint set of shard files.
    """
    info = kwargs.pop("info", None) or dataset_info(data_dir)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return build_dataset(data_dir, split, batch_size, input_context=context, info=info, **kwargs)

    return strategy.distribute_datasets_from_function(dataset_fn)
