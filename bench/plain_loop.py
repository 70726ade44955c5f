"""The plain single-process converter a tutorial shows, as the baseline.

Walk the class folders, open each file with Pillow (decoding it, to get the
size and to catch broken files), and write ``tf.train.Example`` records with
``tf.io.TFRecordWriter``, round-robin over the shards::

    python -m bench.plain_loop SRC OUT --shards 8
"""

from __future__ import annotations

import argparse
import os
import sys

import tensorflow as tf
from PIL import Image


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def convert(src: str, out: str, shards: int) -> int:
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    os.makedirs(out, exist_ok=True)
    writers = [tf.io.TFRecordWriter(os.path.join(out, f"train-{i:05d}-of-{shards:05d}.tfrecord"))
               for i in range(shards)]
    count = 0
    for label, name in enumerate(classes):
        for root, _, files in os.walk(os.path.join(src, name)):
            for filename in sorted(files):
                path = os.path.join(root, filename)
                with Image.open(path) as image:
                    image.load()
                    width, height = image.size
                with open(path, "rb") as handle:
                    data = handle.read()
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image/encoded": _bytes(data), "image/class/label": _int(label),
                    "image/height": _int(height), "image/width": _int(width),
                }))
                writers[count % shards].write(example.SerializeToString())
                count += 1
    for writer in writers:
        writer.close()
    return count


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    print(convert(args.src, args.out, args.shards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
