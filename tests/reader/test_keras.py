"""Keras end to end: labels and pixels arrive intact, on one device and mirrored over two."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import reader
from tests.conftest import REPO
from tests.reader import forked


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> str:
    """The demo dataset at 120 images per class, converted with a 20% validation split."""
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run
    from converter.demo import write_demo

    root = tmp_path_factory.mktemp("keras")
    write_demo(str(root / "shapes"), per_class=120, seed=11)
    out = str(root / "shapes-tfrecords")
    run(ConvertOptions(src=str(root / "shapes"), out=out, shards=8, val_fraction=0.2),
        ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show_progress=False)
    return out


@pytest.mark.slow
def test_a_small_cnn_learns_the_shapes_far_above_chance(shapes):
    tf.keras.utils.set_random_seed(0)
    size = 64
    # Milder crops than the ImageNet preset: a crop of 8% of the image can cut the shape out.
    augment = reader.Augmentation(area_range=(0.6, 1.0), aspect_ratio_range=(0.9, 1.1))
    train = reader.build_dataset(shapes, "train", batch_size=32, image_size=size, seed=0, augment=augment)
    validation = reader.build_dataset(shapes, "validation", batch_size=32, image_size=size, training=False,
                                      crop_fraction=1.0)
    model = tf.keras.Sequential([
        tf.keras.Input((size, size, 3)),
        tf.keras.layers.Rescaling(1 / 255),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, activation="relu"),
        tf.keras.layers.GlobalMaxPooling2D(),
        tf.keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    # At most 20 epochs, ended by the first above 0.8: the epochs after it cannot change the outcome (the best
    # epoch's accuracy is asserted), and they were most of the test's time.
    above = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: setattr(model, "stop_training", logs["val_accuracy"] > 0.8))
    history = model.fit(train, epochs=20, steps_per_epoch=reader.steps_per_epoch(shapes, "train", 32),
                        validation_data=validation, verbose=0, callbacks=[above])
    assert max(history.history["val_accuracy"]) > 0.8  # chance is 1/3


def _example(*args: str) -> subprocess.CompletedProcess:
    """``python examples/train_classifier.py ARGS`` in a process of its own, forked from one that imported
    TensorFlow once (tests/reader/forked.py: its logical devices are the run's own, set before its runtime starts)."""
    return forked.run([sys.executable, os.path.join(REPO, "examples", "train_classifier.py"), *args,
                       "--epochs", "1", "--steps-per-epoch", "1", "--image-size", "32"], timeout=600)


@pytest.mark.e2e
def test_mobilenet_example_trains_under_mirrored_strategy_on_two_logical_cpus_and_validates_a_batch_one_leaves_empty(
        demo_dataset, tmp_path):
    """One run for both (the example's start-up under MirroredStrategy is most of either's time): MobileNetV2 on
    two logical CPUs; and the demo's 18 validation images in one batch of 64, split over two replicas of 32 as 18
    and 0, which failed in Keras."""
    metrics = tmp_path / "metrics.json"
    proc = _example("--data", demo_dataset, "--model", "mobilenet", "--mirrored", "--cpu-replicas", "2",
                    "--batch-size", "64", "--seed", "1", "--metrics-json", str(metrics))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(metrics.read_text())
    assert result["replicas"] == 2
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(result)
    assert '"val_accuracy"' in proc.stdout
    for noise in ("INFO:tensorflow", "auto_shard", "shuffle=True", "Traceback"):
        assert noise not in proc.stderr


@pytest.mark.e2e
def test_the_example_trains_without_a_validation_split_and_says_how_to_carve_one(tmp_path, demo_src):
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run

    out = str(tmp_path / "train-only")
    run(ConvertOptions(src=demo_src, out=out, shards=2), ["--direct_running_mode=in_memory"], show_progress=False)
    proc = _example("--data", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has no validation split, so this trains for --epochs without measuring accuracy; convert with " \
           "--val-fraction 0.2 to carve one" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_distributed_dataset_gives_each_replica_its_share_of_the_global_batch(shapes):
    code = f"""
import tensorflow as tf, reader
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
ds = reader.distributed_dataset(strategy, {shapes!r}, "validation", batch_size=8, image_size=16, training=False)
sizes = []
for images, labels in ds:
    sizes.append([int(t.shape[0]) for t in strategy.experimental_local_results(labels)])
print(sizes)
"""
    proc = forked.run([sys.executable, "-c", code], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sizes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(len(replicas) == 2 for replicas in sizes)
    assert sum(map(sum, sizes)) == 72  # every validation record once, split across the replicas
    assert max(max(r) for r in sizes) == 4  # per-replica batch = global 8 / 2
