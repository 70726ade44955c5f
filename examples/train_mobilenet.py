"""Transfer learning with MobileNetV2 on a converted dataset, fed by ``reader``.

The run from the article this project grew from (MobileNetV2 base, global
average pooling, softmax head, stop once validation accuracy reaches a
target), on our input pipeline instead of ``ImageDataGenerator``::

    python -m converter.demo demo/shapes && python -m converter --src demo/shapes --val-fraction 0.2
    python examples/train_mobilenet.py --data demo/shapes-tfrecords --epochs 5

``--weights PATH`` loads local ImageNet weights (no download; the default is a
randomly initialised base). ``--mirrored`` trains under ``MirroredStrategy``
on every GPU, or on ``--cpu-replicas N`` logical CPUs where there is none.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

import tensorflow as tf

import reader


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a converted dataset with train and validation splits")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--weights", default=None, help="local ImageNet weights file for the base (default: none)")
    parser.add_argument("--target-accuracy", type=float, default=0.95)
    parser.add_argument("--mirrored", action="store_true", help="train under MirroredStrategy")
    parser.add_argument("--cpu-replicas", type=int, default=2, help="logical CPUs to mirror over without a GPU")
    parser.add_argument("--steps-per-epoch", type=int, default=None, help="default: one pass over train")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--metrics-json", default=None, help="write the final metrics here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)

    strategy = _strategy(args.mirrored, args.cpu_replicas)
    info = reader.dataset_info(args.data)
    common = dict(image_size=args.image_size, normalization="mobilenet", info=info, seed=args.seed)
    steps = args.steps_per_epoch or max(1, reader.steps_per_epoch(args.data, "train", args.batch_size))
    if args.mirrored:
        train = reader.distributed_dataset(strategy, args.data, "train", args.batch_size, **common)
    else:
        train = reader.build_dataset(args.data, "train", args.batch_size, **common)
    validation = reader.build_dataset(args.data, "validation", args.batch_size, training=False, **common)
    with strategy.scope():
        model = build_model(info.num_classes, args.image_size, args.weights)
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=steps, validation_data=validation,
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
