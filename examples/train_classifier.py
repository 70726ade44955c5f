"""Train an image classifier on a converted dataset, fed by ``reader``.

Two models. The default, ``--model small``, is a small convolutional network
that learns the demo's three shapes from scratch on a CPU in about a minute
(validation accuracy >= 0.9): it shows the pipeline feeding a model that
learns, with nothing to download::

    python -m converter.demo demo/shapes && python -m converter --src demo/shapes --val-fraction 0.2 --overwrite
    python examples/train_classifier.py --data demo/shapes-tfrecords

``--model mobilenet`` is the transfer-learning run of the article this project
grew from (MobileNetV2 base, global average pooling, softmax head, stop once
validation accuracy reaches a target), on our input pipeline instead of
``ImageDataGenerator``. It needs ImageNet weights to be useful (``--weights
PATH``, a local file: nothing is downloaded); from random weights on a few
hundred images it stays near chance. ``--mirrored`` trains under
``MirroredStrategy`` on every GPU, or on ``--cpu-replicas N`` logical CPUs
where there is none.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

import reader  # first: TensorFlow then loads without its start-up lines (reader.quiet_start)  # isort: skip
import tensorflow as tf


class StopAtAccuracy(tf.keras.callbacks.Callback):
    """Stop training once validation accuracy reaches ``target``."""

    def __init__(self, target: float) -> None:
        super().__init__()
        self.target = target

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        accuracy = (logs or {}).get("val_accuracy")
        if accuracy is not None and accuracy >= self.target:
            print(f"validation accuracy {accuracy:.3f} reached {self.target}: stopping")
            self.model.stop_training = True


def build_small_model(num_classes: int, image_size: int) -> tf.keras.Model:
    """Three conv blocks + global max pooling + softmax head (inputs in [-1, 1]).

    Max pooling keeps the strongest response of each filter wherever the
    shape sits in the frame. No batch norm: with a few steps per epoch its
    moving statistics lag, and validation sat at chance while training learned.
    """
    layers = [tf.keras.Input((image_size, image_size, 3))]
    for filters in (32, 64, 128):
        layers += [tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu"), tf.keras.layers.MaxPooling2D()]
    layers += [tf.keras.layers.GlobalMaxPooling2D(), tf.keras.layers.Dense(num_classes, activation="softmax")]
    model = tf.keras.Sequential(layers)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def build_model(num_classes: int, image_size: int, weights: Optional[str]) -> tf.keras.Model:
    """MobileNetV2 base (inputs in [-1, 1]) + global average pooling + softmax head."""
    base = tf.keras.applications.MobileNetV2(
        input_shape=(image_size, image_size, 3), include_top=False, weights=weights
    )
    base.trainable = weights is None  # fine-tune everything from scratch; freeze pretrained features
    inputs = tf.keras.Input((image_size, image_size, 3))
    features = tf.keras.layers.GlobalAveragePooling2D()(base(inputs))
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax")(features)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def _strategy(mirrored: bool, cpu_replicas: int) -> tf.distribute.Strategy:
    if not mirrored:
        return tf.distribute.get_strategy()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_replicas)
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())


def _validation(args: argparse.Namespace, info: reader.DatasetInfo, replicas: int,
                common: dict) -> Optional[tf.data.Dataset]:
    """The validation batches, or None (with a note) when the dataset has no validation split.

    Under MirroredStrategy Keras splits each batch among the replicas by
    filling them in turn, and a step fails when a replica gets no images (a
    final partial batch no larger than one replica's share), so there the
    batches are full ones and the few images past the last full batch are left out.
    """
    if "validation" not in info.splits:
        print(f"note: {args.data} has no validation split, so this trains for --epochs without measuring "
              "accuracy; convert with --val-fraction 0.2 to carve one", file=sys.stderr)
        return None
    dataset = reader.build_dataset(info, "validation", args.batch_size, training=False, **common)
    if replicas == 1:
        return dataset
    count = info.split("validation").num_examples
    batch = min(args.batch_size, count // replicas * replicas)
    if batch == 0:
        print(f"note: the validation split has {count} images, fewer than the {replicas} replicas: not "
              "validating", file=sys.stderr)
        return None
    if count % batch:
        print(f"note: validating on {count - count % batch} of {count} images (full batches of {batch} for "
              f"{replicas} replicas)", file=sys.stderr)
    full = dataset.unbatch().batch(batch, drop_remainder=True)
    full = full.apply(tf.data.experimental.assert_cardinality(count // batch))  # Keras sees the number of steps
    options = tf.data.Options()
    # One machine: nothing to shard across workers (Keras would try, and warn that it cannot).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return full.with_options(options)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a converted dataset with train and validation splits")
    parser.add_argument("--model", choices=("small", "mobilenet"), default="small",
                        help="small: a small CNN trained from scratch; mobilenet: MobileNetV2 (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=30, help="at most this many epochs (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=64, help="(default: %(default)s; 160+ for mobilenet)")
    parser.add_argument("--weights", default=None, help="local ImageNet weights file for the base (default: none)")
    parser.add_argument("--target-accuracy", type=float, default=0.95,
                        help="stop once validation accuracy reaches this (default: %(default)s)")
    parser.add_argument("--min-crop-area", type=float, default=0.5,
                        help="smallest training crop, as a fraction of the image (default: %(default)s)")
    parser.add_argument("--mirrored", action="store_true", help="train under MirroredStrategy")
    parser.add_argument("--cpu-replicas", type=int, default=2, help="logical CPUs to mirror over without a GPU")
    parser.add_argument("--steps-per-epoch", type=int, default=None, help="default: one pass over train")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--metrics-json", default=None, help="write the final metrics here")
    args = parser.parse_args(argv)
    # The reader's warnings; not TensorFlow's INFO lines (MirroredStrategy logs every reduction at INFO).
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        info = reader.dataset_info(args.data)
    except (reader.DatasetNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if "train" not in info.splits:
        print(f"error: {args.data} has no train split (its splits: {sorted(info.splits)})", file=sys.stderr)
        return 1

    strategy = _strategy(args.mirrored, args.cpu_replicas)
    common = dict(image_size=args.image_size, normalization="mobilenet", seed=args.seed)  # info: read once
    # Crops of at least --min-crop-area of the image: ImageNet's 8% can cut a small object out of the frame.
    augment = reader.Augmentation(area_range=(args.min_crop_area, 1.0))
    steps = args.steps_per_epoch or max(1, reader.steps_per_epoch(args.data, "train", args.batch_size))
    if args.mirrored:
        train = reader.distributed_dataset(strategy, info, "train", args.batch_size, augment=augment, **common)
    else:
        train = reader.build_dataset(info, "train", args.batch_size, augment=augment, **common)
    validation = _validation(args, info, strategy.num_replicas_in_sync, common)
    with strategy.scope():
        if args.model == "small":
            model = build_small_model(info.num_classes, args.image_size)
        else:
            model = build_model(info.num_classes, args.image_size, args.weights)
    # shuffle=False: the reader shuffles; Keras's default True only warns that it ignores itself.
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=steps, validation_data=validation, shuffle=False,
                        callbacks=[StopAtAccuracy(args.target_accuracy)], verbose=2)
    final = {name: float(values[-1]) for name, values in history.history.items()}
    final["replicas"] = strategy.num_replicas_in_sync
    print(json.dumps(final))
    if args.metrics_json:
        with open(args.metrics_json, "w", encoding="utf-8") as handle:
            json.dump(final, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
