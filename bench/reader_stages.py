"""``python -m bench.reader_stages``: where the reader's time goes, stage by stage, against the decode bound.

Every variant yields the same float32 (64, 224, 224, 3) batches from the same
JPEG bytes, in this one process, alternating in rounds (order reversed every
other round) with enough batches per measurement (default 60, about 5 s) that
a round is not one scheduler hiccup. Each is reported in images/s (median,
ratio of medians and median of per-round ratios to the bound) and in process
CPU time per image (what it costs, apart from how fast the machine ran). Each
variant adds or removes one stage:

- ``bound``: in-memory JPEG bytes -> full decode + resize (the benchmark's bound).
- ``memory_eval_fn`` / ``memory_train_fn``: the same bytes through our eval / train map
  functions, no files: what our decode and augmentation cost by themselves.
- ``shards_bound``: our shards read and parsed, then the bound's decode: what reading costs.
- ``shards_plain_eval``: shards through a plain interleave (no count check), our eval map.
- ``ours_eval`` / ``ours_train``: ``reader.build_dataset``, as users call it.
- ``ours_*_parse_each``: the same with one parse call per record instead of 64.
- ``plain_read_constant`` / ``order_read_constant``: a constant image for every record, so only reading is
  left: the shards through a plain interleave, and through the training order (``order.host_records``:
  streams, windows, the checked segment reads), both parsed 64 records per call. Their difference is
  what the order costs an image (issue #49 §4). Run with ``--order`` (or named in ``--only``)::

    python -m bench.reader_stages --images 640 --rounds 8 --order --only plain_read_constant order_read_constant

    python -m bench.reader_stages --images 2000 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

import tensorflow as tf

import reader
from bench import convert_bench, data, read_bench
from reader import pipeline as reader_pipeline
from reader import preprocess, tasks
from reader import records as reader_records
from reader.options import Augmentation, FeatureKeys, ObjectTargets
from reader.order import stream_layout
from reader.records import parse_record

SIZE, BATCH = read_bench.SIZE, read_bench.BATCH
AUTOTUNE = tf.data.AUTOTUNE
# The names variants() returns, known before any data is made (so --only is checked at once).
VARIANTS = ("bound", "memory_eval_fn", "memory_train_fn", "shards_bound", "shards_plain_eval", "ours_eval", "ours_train",
            "ours_eval_parse_each", "ours_train_parse_each")
# Run only when asked (--order, or by name in --only): what the training order costs over a plain read.
ORDER_VARIANTS = ("plain_read_constant", "order_read_constant")


def variants(shards: str, batch: int = BATCH) -> dict:
    """name -> factory of a fresh dataset of (images, labels) batches of ``batch``, repeated indefinitely."""
    info = reader.dataset_info(shards)
    split = info.split("train")
    encoded = [bytes(r) for r in _records(split.files)]
    decode = {"all_jpeg": info.all_jpeg, "scaled_decode": split.max_side is None or split.max_side >= 2 * SIZE}

    def in_memory():
        return tf.data.Dataset.from_tensor_slices(encoded)

    def full_decode(image):
        return tf.image.resize(tf.io.decode_jpeg(image, channels=3), (SIZE, SIZE))

    def batched(dataset, fn, deterministic=True):
        return (dataset.map(fn, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
                .batch(batch).prefetch(AUTOTUNE).repeat())

    def eval_fn(image):
        return preprocess.eval_image(image, (SIZE, SIZE), 0.875, **decode)

    def train_fn(index, image):
        seed = tf.stack([tf.constant(7, tf.int64), index])
        return preprocess.train_image(image, seed, (SIZE, SIZE), Augmentation(), **decode)

    def plain_records():
        files = tf.data.Dataset.from_tensor_slices(split.files)
        return files.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
                                num_parallel_calls=AUTOTUNE, deterministic=True)

    def image_of(record):
        return parse_record(record)[0]

    constant = tasks.Task(tasks.for_dataset(info.task, info.classes, FeatureKeys(), 0, ObjectTargets(), None).parse,
                          lambda parsed, seed: (tf.zeros([SIZE, SIZE, 3]), parsed[FeatureKeys().label]),
                          None, tasks.plain_batch)

    def order_read_constant():
        source = reader_records.Source(info, split, FeatureKeys(), 0, False)
        layout = stream_layout(split.num_examples, batch)
        records = reader_pipeline._stream_records(source, layout, 0, lambda: tf.constant(0, tf.int64), None, 1, 0)
        return reader_pipeline._train_batches(records, constant, 0, True, batch).prefetch(AUTOTUNE)

    def plain_read_constant():
        records = plain_records().repeat().map(lambda record: (record, tf.constant(0, tf.int64)))
        return reader_pipeline._train_batches(records, constant, 0, True, batch).prefetch(AUTOTUNE)

    return {
        "bound": lambda: batched(in_memory(), lambda b: (full_decode(b), 0)),
        "memory_eval_fn": lambda: batched(in_memory(), lambda b: (eval_fn(b), 0)),
        "memory_train_fn": lambda: batched(in_memory().enumerate(), lambda i, b: (train_fn(i, b), 0), False),
        "shards_bound": lambda: batched(plain_records(), lambda r: (full_decode(image_of(r)), 0)),
        "shards_plain_eval": lambda: batched(plain_records(), lambda r: (eval_fn(image_of(r)), 0)),
        "ours_eval": lambda: reader.build_dataset(info, "train", batch, SIZE, training=False).repeat(),
        "ours_train": lambda: reader.build_dataset(info, "train", batch, SIZE, training=True),
        "ours_eval_parse_each": lambda: _parsing_each(lambda: reader.build_dataset(
            info, "train", batch, SIZE, training=False).repeat()),
        "ours_train_parse_each": lambda: _parsing_each(lambda: reader.build_dataset(
            info, "train", batch, SIZE, training=True)),
        "plain_read_constant": plain_read_constant,
        "order_read_constant": order_read_constant,
    }


def _parsing_each(build):
    """``build()`` with one parse call per record (``reader.pipeline.PARSE_BATCH`` = 0), as before batching."""
    saved, reader_pipeline.PARSE_BATCH = reader_pipeline.PARSE_BATCH, 0
    try:
        return build()
    finally:
        reader_pipeline.PARSE_BATCH = saved


def _records(files: list[str]) -> list:
    return [r.numpy() for r in tf.data.TFRecordDataset(files).map(lambda r: parse_record(r)[0])]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reader_stages", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--batch", type=int, default=BATCH, help="images a batch (default: %(default)s; the smoke "
                        "run reads batches of 8: each measurement decodes 3 batches, 2 of them warm-up)")
    parser.add_argument("--only", nargs="*", choices=VARIANTS + ORDER_VARIANTS, metavar="VARIANT",
                        help=f"variants to run (default: all but the --order ones): "
                             f"{', '.join(VARIANTS + ORDER_VARIANTS)}")
    parser.add_argument("--order", action="store_true",
                        help=f"also run {' and '.join(ORDER_VARIANTS)}: what the training order costs an image")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--convert-in-process", action="store_true",
                        help="convert the photos in this process, in memory (set-up, not measured; for a smoke run)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="reader-stages-") as work:
        images, shards = os.path.join(work, "images"), os.path.join(work, "shards")
        data.make_photo_dataset(images, args.images, seed=2)
        convert_bench.prepare(images, shards, 16, args.convert_in_process)
        makers = variants(shards, args.batch)
        chosen = args.only or [*VARIANTS, *(ORDER_VARIANTS if args.order else ())]
        makers = {name: makers[name] for name in chosen}
        measured = read_bench.alternating_rounds(makers, args.rounds, lambda _: args.batches)
    bound = measured.get("bound")
    print(f"{'variant':<22} {'images/s':>8} {'min':>6} {'max':>6}  over bound  paired  CPU ms/image  "
          "bound's CPU over it  (per-round ratios)")
    for name, result in measured.items():
        line = (f"{name:<22} {result['images_per_s']:8.0f} {result['min']:6.0f} {result['max']:6.0f}  ")
        if bound:
            rounds = " ".join(f"{a / b:.2f}" for a, b in zip(result["samples"], bound["samples"]))
            # A few small batches can all be ready (prefetched) before the clock starts: no CPU measured, "inf".
            cpu_over = bound["cpu_ms_per_image"] / result["cpu_ms_per_image"] if result["cpu_ms_per_image"] else math.inf
            line += (f"{result['images_per_s'] / bound['images_per_s']:10.3f}  "
                     f"{read_bench.paired_ratio(measured, name, 'bound'):6.3f}  {result['cpu_ms_per_image']:12.3f}  "
                     f"{cpu_over:19.3f}  ({rounds})")
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(measured, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
