"""Reader benchmark: our presets against what users would pick instead, and the decode bound.

All pipelines run in this one process on the same images (the JPEG files, and
the shards converted from them), 224 px, batch 64, alternating in rounds;
throughput is images per second after a few warm-up batches. Once with a
warm page cache and once cold (every file evicted with
``posix_fadvise(DONTNEED)`` before each measurement).

Each measurement also takes the process's CPU time per image (every thread
tf.data runs is in this process): what a pipeline costs, where images/s is
how fast it ran, which on a shared machine also moves with the neighbours.
When every pipeline keeps the cores busy, the first sets the second's ratio.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from typing import Callable

import psutil
import tensorflow as tf

import reader

SIZE = 224
BATCH = 64


def evict(paths: list[str]) -> None:
    """Drop the files from the page cache, so the next read comes from disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def process_cpu_seconds() -> float:
    """User + system CPU time of this process so far, all threads, to the nanosecond (``CLOCK_PROCESS_CPUTIME_ID``:
    psutil's /proc figures tick in 10 ms, and a smoke run's one batch of 8 took less, so its CPU read 0)."""
    return time.process_time()


def throughput(make: Callable[[], object], batches: int, warmup: int = 2) -> tuple[float, float]:
    """(images/s, CPU ms per image) of a fresh iterator over ``batches`` batches after ``warmup`` batches."""
    iterator = iter(make())
    for _ in range(warmup):
        next(iterator)
    images = 0
    cpu_started, started = process_cpu_seconds(), time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        images += int(batch[0].shape[0])
    seconds, cpu_seconds = time.perf_counter() - started, process_cpu_seconds() - cpu_started
    return images / seconds, 1000 * cpu_seconds / images


def pipelines(images_dir: str, shards_dir: str, batch: int = BATCH) -> dict[str, Callable[[], object]]:
    """name -> factory of a fresh dataset/iterator yielding (images, labels) batches of ``batch``."""
    files = sorted(glob.glob(os.path.join(images_dir, "*", "*.jpg")))
    info = reader.dataset_info(shards_dir)

    def ours_train():
        return reader.build_dataset(info, "train", batch, SIZE, training=True)

    def ours_eval():
        return reader.build_dataset(info, "train", batch, SIZE, training=False).repeat()

    def image_dataset_from_directory():
        return tf.keras.utils.image_dataset_from_directory(images_dir, image_size=(SIZE, SIZE), batch_size=batch,
                                                           label_mode="int", verbose=False).repeat()

    def image_data_generator():
        from tf_keras.preprocessing.image import ImageDataGenerator

        generator = ImageDataGenerator(rescale=1 / 255, zoom_range=0.1, rotation_range=45, shear_range=0.1,
                                       horizontal_flip=True, vertical_flip=True)
        return generator.flow_from_directory(images_dir, target_size=(SIZE, SIZE), batch_size=batch,
                                             class_mode="sparse")

    def article_tf_data():
        def load(path):
            image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
            return tf.image.resize(image, (SIZE, SIZE)), tf.strings.split(path, os.sep)[-2]

        dataset = tf.data.Dataset.list_files(os.path.join(images_dir, "*", "*.jpg"))
        return dataset.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE).repeat()

    def decode_bound():
        def decode(data):
            return tf.image.resize(tf.io.decode_jpeg(data, channels=3), (SIZE, SIZE)), 0

        encoded = [open(path, "rb").read() for path in files]
        dataset = tf.data.Dataset.from_tensor_slices(encoded)
        return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE).repeat()

    return {
        "ours_train": ours_train,
        "ours_eval": ours_eval,
        "image_dataset_from_directory": image_dataset_from_directory,
        "image_data_generator": image_data_generator,
        "article_tf_data": article_tf_data,
        "decode_bound_in_memory": decode_bound,
    }


def alternating_rounds(makers: dict, rounds: int, batches: Callable[[str], int],
                       before: Callable[[], None] = lambda: None) -> dict:
    """``{name: {images_per_s (median), min, max, samples, cpu_ms_per_image (median), cpu_samples}}``.

    The order is reversed every other round, so drift favours no pipeline.
    """
    samples: dict = {name: [] for name in makers}
    cpu: dict = {name: [] for name in makers}
    for round_index in range(rounds):
        names = list(makers) if round_index % 2 == 0 else list(reversed(makers))
        for name in names:
            before()
            images_per_s, cpu_ms = throughput(makers[name], batches(name))
            samples[name].append(images_per_s)
            cpu[name].append(cpu_ms)
    return {name: {"images_per_s": statistics.median(values), "min": min(values), "max": max(values),
                   "samples": values, "cpu_ms_per_image": statistics.median(cpu[name]), "cpu_samples": cpu[name]}
            for name, values in samples.items()}


def paired_ratio(measured: dict, name: str, baseline: str) -> float:
    """Median over rounds of ``name``'s images/s over ``baseline``'s in the same round.

    Steadier than the ratio of the two medians when the machine's speed
    drifts between rounds: each round's pair ran minutes apart at most.
    """
    return statistics.median(a / b for a, b in zip(measured[name]["samples"], measured[baseline]["samples"]))


def bench_reader(images_dir: str, shards_dir: str, rounds: int, batches: int, slow_batches: int,
                 batch: int = BATCH) -> dict:
    """Throughput of every pipeline, warm and cold, alternating in rounds."""
    makers = pipelines(images_dir, shards_dir, batch)
    all_files = glob.glob(os.path.join(images_dir, "*", "*.jpg")) + glob.glob(os.path.join(shards_dir, "*"))
    results: dict = {"batch": batch, "image_size": SIZE, "rounds": rounds, "pipelines": {}}

    def count(name: str) -> int:
        return slow_batches if name == "image_data_generator" else batches

    for cache_state, before in (("warm", lambda: None), ("cold", lambda: evict(all_files))):
        for name, numbers in alternating_rounds(makers, rounds, count, before).items():
            results["pipelines"].setdefault(name, {})[cache_state] = numbers
    measured = {name: r["warm"] for name, r in results["pipelines"].items()}
    warm = {name: r["images_per_s"] for name, r in measured.items()}
    results["ratios_warm"] = {
        "train_over_image_dataset_from_directory": warm["ours_train"] / warm["image_dataset_from_directory"],
        "train_over_image_data_generator": warm["ours_train"] / warm["image_data_generator"],
        "eval_over_decode_bound": warm["ours_eval"] / warm["decode_bound_in_memory"],
        "train_over_decode_bound": warm["ours_train"] / warm["decode_bound_in_memory"],
        "train_over_article_tf_data": warm["ours_train"] / warm["article_tf_data"],
    }
    bound_cpu = measured["decode_bound_in_memory"]["cpu_ms_per_image"]
    # Context for the two bound targets: the same comparison per round, and in CPU time per image
    # (bound's over ours: above 1 means the preset spends less CPU per image than the bound).
    results["bound_context_warm"] = {
        "train_over_decode_bound_paired": paired_ratio(measured, "ours_train", "decode_bound_in_memory"),
        "eval_over_decode_bound_paired": paired_ratio(measured, "ours_eval", "decode_bound_in_memory"),
        "train_cpu_efficiency_over_decode_bound": bound_cpu / measured["ours_train"]["cpu_ms_per_image"],
        "eval_cpu_efficiency_over_decode_bound": bound_cpu / measured["ours_eval"]["cpu_ms_per_image"],
    }
    results["caches"] = bench_caches(shards_dir, batch)
    return results


LARGE_PIPELINES = ("ours_train", "ours_eval", "image_dataset_from_directory")


def bench_large_photos(images_dir: str, shards_dir: str, rounds: int, batches: int, batch: int = BATCH) -> dict:
    """The presets against ``image_dataset_from_directory`` on large photos (warm page cache).

    Where photos are several times the output size, crop-before-decode and
    reduced-scale decoding have room to work; on 300-500 px photos they do not.
    """
    makers = pipelines(images_dir, shards_dir, batch)
    measured = alternating_rounds({name: makers[name] for name in LARGE_PIPELINES}, rounds, lambda _: batches)
    idfd = measured["image_dataset_from_directory"]["images_per_s"]
    return {
        "pipelines": measured,
        "ratios": {"train_over_image_dataset_from_directory": measured["ours_train"]["images_per_s"] / idfd,
                   "eval_over_image_dataset_from_directory": measured["ours_eval"]["images_per_s"] / idfd},
    }


def bench_caches(shards_dir: str, batch: int = BATCH) -> dict:
    """File-cache bytes and memory-cache resident growth, over the shards' bytes."""
    import tempfile

    shard_bytes = reader.dataset_info(shards_dir).split("train").num_bytes
    with tempfile.TemporaryDirectory() as folder:
        prefix = os.path.join(folder, "cache")
        dataset = reader.build_dataset(shards_dir, "train", batch, 64, training=False, options={"cache": prefix})
        for _ in dataset:
            pass
        file_bytes = sum(os.path.getsize(p) for p in glob.glob(prefix + "*"))
    process = psutil.Process()
    for _ in reader.build_dataset(shards_dir, "train", batch, 64, training=False):
        pass  # the same pipeline uncached first, so its own allocations are not counted
    dataset = reader.build_dataset(shards_dir, "train", batch, 64, training=False, options={"cache": "memory"})
    iterator = iter(dataset.repeat(2))
    before = process.memory_info().rss
    for _ in iterator:
        pass
    grown = process.memory_info().rss - before
    return {
        "shard_bytes": shard_bytes,
        "file_cache_bytes": file_bytes,
        "file_cache_over_shards": file_bytes / shard_bytes,
        "memory_cache_rss_growth_bytes": grown,
        "memory_cache_over_shards": grown / shard_bytes,
    }


def bench_downsize_workflow(images_dir: str, downsized_dir: str, convert_seconds: float, rounds: int,
                            batches: int, batch: int = BATCH) -> dict:
    """Convert once with ``--max-side 256``, then train from the small shards, against the originals.

    ``image_dataset_from_directory`` decodes every large photo in full every
    epoch; the training preset over the downsized shards decodes a fraction of
    the pixels. The conversion pays for itself after
    ``convert_seconds / (epoch time of the one - epoch time of the other)`` epochs.
    """
    images = len(glob.glob(os.path.join(images_dir, "*", "*.jpg")))
    makers = pipelines(images_dir, downsized_dir, batch)
    measured = alternating_rounds({name: makers[name] for name in ("ours_train", "image_dataset_from_directory")},
                                  rounds, lambda _: batches)
    ours = measured["ours_train"]["images_per_s"]
    theirs = measured["image_dataset_from_directory"]["images_per_s"]
    saved_per_epoch = images / theirs - images / ours
    return {
        "images": images,
        "pipelines": measured,
        "convert_seconds": convert_seconds,
        "train_over_image_dataset_from_directory": ours / theirs,
        "epoch_seconds": {"ours_train_downsized": images / ours, "image_dataset_from_directory": images / theirs},
        "break_even_epochs": convert_seconds / saved_per_epoch if saved_per_epoch > 0 else float("inf"),
    }
