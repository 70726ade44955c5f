"""The plain single-process converter a tutorial shows, as the baseline.

Walk the class folders, open each file with Pillow (decoding it, to get the
size and to catch broken files), and write ``tf.train.Example`` records with
``tf.io.TFRecordWriter``, round-robin over the shards::

    python -m bench.plain_loop SRC OUT --shards 8 [--max-side 256]

Each image is decoded once and, when it must be (not a JPEG, or larger than
``--max-side``), converted to RGB, resized with LANCZOS and encoded once as a
JPEG at quality 95: the same output policy as the converter, done the
straightforward way (a full-size decode, then the resize).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import Optional

import tensorflow as tf
from PIL import Image


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def _reencode(image: Image.Image, max_side: Optional[int]) -> tuple[bytes, int, int]:
    rgb = image.convert("RGB")
    if max_side is not None and max(rgb.size) > max_side:
        scale = max_side / max(rgb.size)
        rgb = rgb.resize((max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale))),
                         Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    rgb.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue(), rgb.height, rgb.width


def convert(src: str, out: str, shards: int, max_side: Optional[int] = None) -> int:
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    os.makedirs(out, exist_ok=True)
    writers = [tf.io.TFRecordWriter(os.path.join(out, f"train-{i:05d}-of-{shards:05d}.tfrecord"))
               for i in range(shards)]
    count = 0
    for label, name in enumerate(classes):
        for root, _, files in os.walk(os.path.join(src, name)):
            for filename in sorted(files):
                path = os.path.join(root, filename)
                with open(path, "rb") as handle:
                    data = handle.read()
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
                    width, height = image.size
                    if image.format != "JPEG" or (max_side is not None and max(width, height) > max_side):
                        data, height, width = _reencode(image, max_side)
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
    parser.add_argument("--max-side", type=int, default=None)
    args = parser.parse_args()
    print(convert(args.src, args.out, args.shards, args.max_side))
    return 0


if __name__ == "__main__":
    sys.exit(main())
