"""``build_dataset``: the whole input pipeline for training or evaluation.

Training (``training=True``), per epoch e and input pipeline::

    shard files, shuffled by (seed, e), then this pipeline's share  [file_order]
    -> parallel interleave of TFRecordDatasets                      [interleave_records]
    -> (cache of the *encoded* records, filled on the first epoch)
  epochs chained indefinitely, then
    -> parse, 64 records per call, then one element per record again [parse_records]
    -> shuffle buffer of encoded images keyed by seed, before decoding
    -> (encoded image, label, per-example seed (seed, position))
    -> map(crop-before-decode + resize + flip, AUTOTUNE)            fused by TF with ...
    -> batch(drop_remainder=True)                                   ... the batch (map_and_batch)
    -> prefetch(AUTOTUNE) [or to a device]

Evaluation: files in manifest order -> interleave (deterministic) -> (cache) ->
parse in batches -> map(centre crop + resize) -> batch keeping the final
partial batch -> prefetch. Exactly one pass over every record.

Parsing 64 records per call, not one per call inside the decode map: measured
on 300-500 px photos, ``parse_single_example`` cost 125 us per record, about 8%
of a decode, and ``parse_example`` on 64 records plus the unbatch 30 us.
"""

from __future__ import annotations

import logging
import os
import random
import re
import tempfile
from typing import Optional, Sequence, Union

import tensorflow as tf

from reader import preprocess, storage
from reader.info import DatasetInfo, SplitInfo, available_memory_bytes, check_foreign_shards, dataset_info
from reader.options import Augmentation, FeatureKeys, as_int, as_options, check_flag, check_output, image_hw
from reader.records import AUTOTUNE, READ_BUFFER_BYTES, LabelRange, file_order, interleave_records, parse_records

logger = logging.getLogger(__name__)

# File order when no seed is given: a constant, so that every input pipeline of
# a run computes the same permutation and their file sets stay disjoint.
UNSEEDED_FILE_SEED = 0x5EED
DEFAULT_SHUFFLE_BUFFER = 10_000  # TF Model Garden's classification default
PARSE_BATCH = 64  # records per parse call (see the module docstring)
# A memory cache must fit in this share of available memory (the rest is training's).
MEMORY_CACHE_FRACTION = 0.8


class CacheTooLargeError(MemoryError):
    """``cache="memory"`` was asked for data that does not fit in memory."""


def build_dataset(
    data_dir: str,
    split: str = "train",
    batch_size: int = 64,
    image_size: Union[int, Sequence[int]] = 224,
    training: bool = True,
    seed: Optional[int] = None,
    deterministic: Optional[bool] = None,
    cache: Optional[str] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
    *,
    dtype: tf.DType = tf.float32,
    normalization: Optional[str] = None,
    augment: Augmentation = Augmentation(),
    crop_fraction: float = 0.875,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    cycle_length: Optional[int] = None,
    block_length: int = 1,
    num_epochs: Optional[int] = None,
    keys: FeatureKeys = FeatureKeys(),
    label_offset: int = 0,
    skip_corrupt: bool = False,
    prefetch_to_device: Optional[str] = None,
    private_threads: Optional[int] = None,
    service: Optional[str] = None,
    service_job_name: Optional[str] = None,
    info: Optional[DatasetInfo] = None,
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
      seed: makes file order, record shuffle and augmentation reproducible.
      deterministic: element order reproducible; default True with a seed,
        False (faster) without. Evaluation is always deterministic.
      cache: None, "memory" (checked against available memory first) or a
        file path prefix; caches encoded records, never decoded images.
      input_context: from ``tf.distribute``; each pipeline reads a disjoint
        share of the shard files (records when there are fewer files than pipelines).
      dtype: float32, bfloat16, float16, or uint8 (normalise on the accelerator).
      normalization: None (0..255), "mobilenet" ([-1, 1]) or "imagenet" (mean/std).
      augment: the training crop's ranges and the flip.
      crop_fraction: eval centre crop as a fraction of the shorter side.
      shuffle_buffer: records in the training shuffle buffer (encoded bytes,
        so 10,000 ImageNet-sized records are about 1.1 GB).
      cycle_length, block_length: interleave settings; cycle_length None = AUTOTUNE.
      num_epochs: training epochs to yield; None repeats indefinitely.
      keys, label_offset: for shards written by other tools (TFDS: ``FeatureKeys.tfds()``;
        1-based Inception labels: ``label_offset=-1``).
      skip_corrupt: skip the rest of a corrupt shard with a warning instead of failing.
      prefetch_to_device: e.g. "/gpu:0", to prefetch batches into device memory.
      private_threads: size of a private thread pool for this pipeline.
      service: address of a tf.data service dispatcher (``grpc://host:port``):
        reading, decoding and batching run on its workers in the
        ``distributed_epoch`` processing mode, which deals shard files (in
        evaluation) or whole epochs (in training) out to the workers, so every
        record is processed exactly once per epoch. Batches are formed on the
        workers, so in evaluation each worker's last batch may be partial.
      service_job_name: consumers that name the same job share its stream
        (e.g. every replica of one trainer); default: each pipeline its own job.
      info: a :class:`DatasetInfo` already read (saves re-reading the manifest).

    Raises:
      DatasetNotFoundError: no manifest in ``data_dir``.
      ValueError: an unknown split (the message lists the splits) or a bad argument.
      CacheTooLargeError: ``cache="memory"`` and the split does not fit.
    """
    info = info or dataset_info(data_dir)
    split_info = info.split(split)
    size = image_hw(image_size)
    dtype = check_output(dtype, normalization)
    training = check_flag(training, "training")
    augment = as_options(augment, Augmentation, "augment")
    keys = as_options(keys, FeatureKeys, "keys")
    batch_size = _check_positive(batch_size=batch_size)
    _check_arguments(shuffle_buffer, block_length, cycle_length, num_epochs, crop_fraction, cache, service,
                     input_context)
    seed = _check_seed(seed)
    if not info.converted:
        check_foreign_shards(split_info, keys)
    _check_shards_present(split_info, skip_corrupt)
    s3 = any(storage.is_s3(path) for path in split_info.files)
    remote = any("://" in path and not path.startswith("file://") for path in split_info.files)
    read_buffer = READ_BUFFER_BYTES if remote and not s3 else None
    label_range = None if info.converted and label_offset == 0 and keys == FeatureKeys() else (
        LabelRange(keys.label, label_offset, info.num_classes))

    pipelines, pipeline_id = (1, 0) if input_context is None else (
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    per_pipeline_batch = batch_size if input_context is None else input_context.get_per_replica_batch_size(batch_size)
    files = split_info.files
    counts = [shard.num_examples for shard in split_info.shards]
    by_file = pipelines <= len(files)
    if not by_file:
        logger.warning(
            "%s has %d shard files for %d input pipelines: every pipeline reads all files and keeps 1/%d "
            "of the records. Convert with --shards >= %d to shard by file.",
            split_info.name, len(files), pipelines, pipelines, pipelines,
        )
    if training and per_pipeline_batch > split_info.num_examples // pipelines:
        logger.warning("split %s has %d examples%s, fewer than one batch of %d: every batch holds repeats of "
                       "the same examples, from several epochs", split_info.name, split_info.num_examples,
                       f" for {pipelines} input pipelines" if pipelines > 1 else "", per_pipeline_batch)
    cache_bytes = split_info.num_bytes // pipelines
    if cache == "memory":
        _check_memory_cache(split_info.name, cache_bytes)
    elif cache is not None:
        cache = _cache_prefix(cache, info, split_info.name, pipelines)

    decode = _decode_choices(info, split_info, size)
    if deterministic is None:
        deterministic = seed is not None
    base_seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    file_seed = seed if seed is not None else UNSEEDED_FILE_SEED

    def records_of_epoch(epoch: "tf.Tensor | int", shuffle: bool, ordered: bool) -> tf.data.Dataset:
        order = file_order(
            files, counts, seed=file_seed if shuffle else None, epoch=epoch,
            num_shards=pipelines if by_file else 1, shard_index=pipeline_id if by_file else 0,
        )
        records = interleave_records(order, cycle_length, block_length, deterministic=ordered or deterministic,
                                     skip_corrupt=skip_corrupt, labels=label_range, s3=s3,
                                     read_buffer=read_buffer)
        return records if by_file or pipelines == 1 else records.shard(pipelines, pipeline_id)

    if training:
        records = _training_records(records_of_epoch, cache, pipeline_id, num_epochs)
        dataset = parse_records(records, keys, label_offset, batch=PARSE_BATCH)
        dataset = dataset.shuffle(shuffle_buffer, seed=base_seed, reshuffle_each_iteration=True).enumerate()
        seed_tensor = tf.constant(base_seed, tf.int64)

        def train_example(index: tf.Tensor, example: tuple) -> tuple:
            data, label = example
            image = preprocess.train_image(data, tf.stack([seed_tensor, index]), size, augment, **decode)
            return preprocess.finish(image, dtype, normalization), label

        dataset = dataset.map(train_example, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
        dataset = dataset.batch(per_pipeline_batch, drop_remainder=True)
    else:
        records = records_of_epoch(0, shuffle=False, ordered=True)
        records = _cached(records, cache, pipeline_id)

        def eval_example(data: tf.Tensor, label: tf.Tensor) -> tuple:
            image = preprocess.eval_image(data, size, crop_fraction, **decode)
            return preprocess.finish(image, dtype, normalization), label

        dataset = parse_records(records, keys, label_offset, batch=PARSE_BATCH)
        dataset = dataset.map(eval_example, num_parallel_calls=AUTOTUNE, deterministic=True)
        dataset = dataset.batch(per_pipeline_batch, drop_remainder=False)
        if not skip_corrupt and service is None:
            # Known length: Keras and progress bars see the number of batches, and a short read fails loudly.
            records = _eval_records(counts, pipelines, pipeline_id, by_file)
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(-(-records // per_pipeline_batch)))

    dataset = dataset.with_options(_options(deterministic or not training, input_context, private_threads))
    if service is not None:
        dataset = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=service,
            job_name=service_job_name))
    if prefetch_to_device:
        return dataset.apply(tf.data.experimental.prefetch_to_device(prefetch_to_device))
    return dataset.prefetch(AUTOTUNE)


def _training_records(records_of_epoch, cache, pipeline_id, num_epochs) -> tf.data.Dataset:
    """The records of the training epochs, chained; the caller parses and shuffles them before decoding.

    Epochs are chained first and then shuffled by one buffer (the faster
    "repeat before shuffle" order of the tf.data guide: no refill stall at
    epoch boundaries, which blur by at most one buffer). Each example's
    augmentation seed is (seed, position in the shuffled stream), so a seeded
    run repeats exactly whatever the map's parallel scheduling.
    """
    if cache is not None:
        cached = _cached(records_of_epoch(0, shuffle=True, ordered=False), cache, pipeline_id)
        stream = cached.repeat(num_epochs)  # the cache replays the first epoch's records
    else:
        epochs = tf.data.Dataset.range(num_epochs) if num_epochs is not None else tf.data.Dataset.range(1 << 62)
        stream = epochs.flat_map(lambda epoch: records_of_epoch(epoch, shuffle=True, ordered=False))
    return stream


def _decode_choices(info: DatasetInfo, split_info: SplitInfo, size: tuple[int, int]) -> dict:
    """What the decode step may skip, decided once from the manifest rather than per record.

    A converted dataset holds only JPEGs (no format check), and a split whose
    largest image is under twice the output size never gains from a
    reduced-scale decode (no choice of scale).
    """
    large = split_info.max_side is None or split_info.max_side >= 2 * min(size)
    return {"all_jpeg": info.all_jpeg, "scaled_decode": large}


def _eval_records(counts: Sequence[int], pipelines: int, pipeline_id: int, by_file: bool) -> int:
    """Records one eval pipeline yields: its files' counts, or its share of every record."""
    if by_file:
        return sum(counts[pipeline_id::pipelines])
    total = sum(counts)
    return total // pipelines + (1 if pipeline_id < total % pipelines else 0)


def _cached(records: tf.data.Dataset, cache: Optional[str], pipeline_id: int) -> tf.data.Dataset:
    if cache is None:
        return records
    if cache == "memory":
        return records.cache()
    return records.cache(f"{cache}-{pipeline_id}")


def _cache_prefix(cache: str, info: DatasetInfo, split: str, pipelines: int) -> str:
    """File prefix of a file cache of ``split``: ``PATH-<split>-<fingerprint>-of<pipelines>``.

    The dataset's fingerprint in the name means a cache is never served for
    another version of the dataset (a reconversion with ``--overwrite``
    changes it): a new version writes a new cache. Files of other versions are
    named in a warning, for the user to delete.

    Raises:
      ValueError: the cache's folder does not exist or is not writable.
    """
    path = os.path.join(cache, "records") if tf.io.gfile.isdir(cache) else cache
    folder = os.path.dirname(path) or "."
    if not tf.io.gfile.isdir(folder):
        raise ValueError(f"cache={cache!r}: the folder {folder!r} does not exist; create it or pass another path")
    if "://" not in folder:
        try:  # a real write: access() says yes to root on read-only mounts
            handle, probe = tempfile.mkstemp(prefix=".cache-probe-", dir=folder)
            os.close(handle)
            os.unlink(probe)
        except OSError as err:
            raise ValueError(f"cache={cache!r}: the folder {folder!r} is not writable ({err.strerror})") from err
    prefix = f"{path}-{split}-{info.fingerprint}-of{pipelines}"
    stale = sorted(name for name in tf.io.gfile.glob(f"{path}-{split}-*")
                   if not name.startswith(prefix) and _CACHE_NAME.match(name[len(path):]))
    if stale:
        logger.warning("cache %s: %d files belong to other versions of this dataset (%s...) and are never read "
                       "again; delete them to free their space", path, len(stale), stale[0])
    return prefix


_CACHE_NAME = re.compile(r"^-[a-z]+-[0-9a-f]{12}-of\d+-\d+[._]")


def _check_memory_cache(split: str, needed: int) -> None:
    available = available_memory_bytes()
    if available is not None and needed > MEMORY_CACHE_FRACTION * available:
        raise CacheTooLargeError(
            f'cache="memory" needs {needed:,} bytes for split {split!r} but only {available:,} bytes of memory '
            f"are available ({MEMORY_CACHE_FRACTION:.0%} may be used); pass cache=PATH to cache on disk instead"
        )


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


def _check_arguments(shuffle_buffer, block_length, cycle_length, num_epochs, crop_fraction, cache, service,
                     input_context) -> None:
    """``ValueError`` naming the first bad argument of :func:`build_dataset`."""
    _check_positive(shuffle_buffer=shuffle_buffer, block_length=block_length)
    if input_context is not None and not isinstance(input_context, tf.distribute.InputContext):
        raise ValueError(
            f"input_context must be the tf.distribute.InputContext that distribute_datasets_from_function passes "
            f"to its function, got {type(input_context).__name__}; to read under a strategy, use "
            "reader.distributed_dataset(strategy, data_dir, ...)")
    if cycle_length is not None:
        _check_positive(cycle_length=cycle_length)
    if num_epochs is not None:
        _check_positive(num_epochs=num_epochs)
    if not 0 < crop_fraction <= 1:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}")
    if cache is not None and not isinstance(cache, str):
        raise ValueError(f'cache must be None, "memory" or a file path, got {cache!r}')
    if isinstance(cache, str) and cache != "memory" and cache.strip().lower() in ("memory", "mem", "ram", ""):
        raise ValueError(f'cache={cache!r}: did you mean cache="memory"? A file cache takes a path such as '
                         '"/tmp/cache/train"')
    if service is not None and (input_context is not None or cache is not None):
        raise ValueError("service distributes the work itself: do not combine it with input_context or cache")


def _check_seed(seed: object) -> Optional[int]:
    """``seed`` as a Python int (NumPy integers too), or None."""
    if seed is None:
        return None
    value = as_int(seed)
    if value is None or not 0 <= value < 1 << 63:
        raise ValueError(f"seed must be None or an integer in [0, 2**63), got {seed!r}")
    return value


def _check_shards_present(split_info: SplitInfo, skip_corrupt: bool) -> None:
    """Every shard the manifest lists is there (one listing per folder), or fail naming the missing ones.

    The read itself checks again (a file can vanish later); this fails at
    once, before any thread starts.
    """
    missing = []
    by_folder: dict[str, list[str]] = {}
    for path in split_info.files:
        by_folder.setdefault(os.path.dirname(path), []).append(path)
    for folder, paths in by_folder.items():
        try:
            present = set(storage.listdir(folder))
        except tf.errors.NotFoundError:
            present = set()
        missing += [path for path in paths if os.path.basename(path) not in present]
    if not missing:
        return
    names = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    if skip_corrupt:
        logger.warning("split %s: %d listed shards are missing and will be skipped: %s",
                       split_info.name, len(missing), names)
        return
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
