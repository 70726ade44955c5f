"""A small training run that can be killed and restarted: ``python -m tests.reader.resumable_training``.

Used by ``test_resume_training.py``. Every step appends "STEP DIGEST" to
``--log``, where DIGEST fingerprints the exact bits of the batch the step
trained on, so the test can compare the batches consumed across a SIGKILL
with an uninterrupted run's.

``--mode keras``: ``model.fit`` with ``keras.callbacks.BackupAndRestore``
(``save_freq`` in steps) and ``reader.ExactResume``, the README's recipe.
``--mode loop``: a custom loop saving the model, the optimizer and the
reader's position with ``tf.train.Checkpoint``, reading with ``--pipelines``
input pipelines (each one a simulated host; their batches are concatenated
into the global batch, as tf.distribute does).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Optional, Sequence

import reader  # first: TensorFlow loads through it, which quiets TensorFlow's C++ INFO lines  # isort: skip
import keras
import tensorflow as tf

SEED, BATCH, SIZE = 3, 8, 16


def _digest(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    data = tf.strings.join([tf.io.serialize_tensor(images), tf.io.serialize_tensor(labels)])
    return tf.strings.to_hash_bucket_fast(data, 1 << 62)


class LoggedModel(keras.Sequential):
    """Logs each step's optimizer iteration and batch digest, then trains on the batch."""

    log_path = ""

    def train_step(self, data):
        images, labels = data
        tf.print(self.optimizer.iterations, _digest(images, labels), output_stream=f"file://{self.log_path}")
        return super().train_step(data)


def _model(cls=keras.Sequential, hidden: int = 0) -> keras.Model:
    """A linear model; ``hidden`` units in between make its backups big enough (MBs) to kill inside a save."""
    layers = [keras.layers.Dense(hidden)] if hidden else []
    model = cls([keras.Input((SIZE, SIZE, 3)), keras.layers.Flatten(), *layers, keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    return model


class Slow(keras.callbacks.Callback):
    """Gives the test time to kill the run mid-epoch."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def train_keras(args) -> None:
    LoggedModel.log_path = args.log
    model = _model(LoggedModel, args.hidden)
    steps = reader.steps_per_epoch(args.data, "train", BATCH)
    dataset = reader.build_dataset(args.data, "train", BATCH, SIZE, seed=SEED, start=model.optimizer.iterations)
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps, verbose=0, shuffle=False, callbacks=[
        # The README's recipe: double_checkpoint keeps the previous backup for a kill inside a save.
        keras.callbacks.BackupAndRestore(args.backup, save_freq=args.save_freq, double_checkpoint=True,
                                         delete_checkpoint=False),
        reader.ExactResume(os.path.join(args.backup, "position.json"), args.data, "train", BATCH, SEED, args.epochs),
        Slow(args.slow),
    ])


def train_loop(args) -> None:
    model = _model()
    optimizer = model.optimizer
    position = tf.Variable("", dtype=tf.string)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, position=position)
    manager = tf.train.CheckpointManager(checkpoint, args.backup, max_to_keep=2)
    manager.restore_or_initialize()
    start = reader.Position.from_json(position.numpy()) if position.numpy() else 0
    iterators = []
    for index in range(args.pipelines):
        context = tf.distribute.InputContext(args.pipelines, index, args.pipelines)
        iterators.append(iter(reader.build_dataset(args.data, "train", BATCH, SIZE, seed=SEED, input_context=context,
                                                   start=start)))
    total = args.epochs * reader.steps_per_epoch(args.data, "train", BATCH)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = int(optimizer.iterations)
    while step < total:
        parts = [next(iterator) for iterator in iterators]
        images = tf.concat([images for images, _ in parts], 0)
        labels = tf.concat([labels for _, labels in parts], 0)
        with open(args.log, "a") as log:
            log.write(f"{step} {int(_digest(images, labels))}\n")
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        step = int(optimizer.iterations)
        if step % 4 == 0:
            position.assign(reader.position(args.data, "train", BATCH, SEED, step).to_json())
            manager.save()
        time.sleep(args.slow)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Also called in the test's process (``argv``), for the uninterrupted run nothing kills."""
    parser = argparse.ArgumentParser()
    for name in ("--data", "--backup", "--log"):
        parser.add_argument(name, required=True)
    parser.add_argument("--mode", choices=("keras", "loop"), required=True)
    parser.add_argument("--pipelines", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--save-freq", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=0)
    args = parser.parse_args(argv)
    (train_keras if args.mode == "keras" else train_loop)(args)


if __name__ == "__main__":
    main()
