"""The batches' last steps, the same for a dataset's pipeline and a mixture's: tf.data options, then the
tf.data service, a device or a prefetch.

Data in: a dataset of batches and :class:`reader.ReadOptions`. Data out: the dataset the trainer iterates.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from reader.options import ReadOptions, as_int
from reader.records import AUTOTUNE


def tf_options(deterministic: bool, input_context, private_threads: Optional[int]) -> tf.data.Options:
    """Determinism, no second sharding under ``tf.distribute`` (we shard by file), a private thread pool."""
    options = tf.data.Options()
    options.deterministic = deterministic
    if input_context is not None:
        # We shard by file ourselves; tf.distribute must not shard again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if private_threads is not None:
        threads = as_int(private_threads)
        if threads is None or threads < 1:
            raise ValueError(f"private_threads must be a positive integer, got {private_threads!r}")
        options.threading.private_threadpool_size = threads
    return options


def deliver(dataset: tf.data.Dataset, options: ReadOptions) -> tf.data.Dataset:
    """The batches as the trainer takes them: through the tf.data service, onto a device, or prefetched."""
    if options.service is not None:
        dataset = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=options.service,
            job_name=options.service_job_name))
    if options.prefetch_to_device:
        return dataset.apply(tf.data.experimental.prefetch_to_device(options.prefetch_to_device))
    return dataset.prefetch(AUTOTUNE)
