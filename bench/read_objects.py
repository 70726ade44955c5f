"""``python -m bench.read_objects``: the detection pipeline against the decode bound and the classification preset.

    python -m bench.read_objects                               # 640 photos, 5 rounds
    python -m bench.read_objects --images 64 --rounds 1 --batches 2 --json /tmp/r.json   # a smoke run

Issue #41's targets, on the same photos (300-500 px, as ``python -m bench`` makes them) converted twice:
as class folders (classification) and as a COCO tree with 1-8 boxes an image (objects):

* the detection training pipeline reaches at least **0.9x the decode bound** (every JPEG decoded whole from
  memory and resized, the bound the classification preset is measured against);
* boxes cost at most **10%** over the classification training preset on the same images
  (detection's images/s over classification's >= 1 / 1.1).

A fourth pipeline, ``detection_images_only``, is the detection pipeline with its targets left empty: the
same records, geometry and decode. Detection over it is what the boxes themselves cost; it over the
classification preset is what decoding the whole image (detection) instead of a random crop (about half
the image on average, classification) costs.

All pipelines run in this one process, 224 px, batch 64, alternating in rounds (``read_bench``), warm page
cache; ratios of medians, and the paired per-round ratios beside them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "read_objects.json")
TARGETS = {"detection_over_decode_bound": 0.9, "detection_over_classification": round(1 / 1.1, 3)}


def write_coco_of(photos: list[str], root: str, seed: int = 0) -> int:
    """A COCO tree (``train2017/`` of links to ``photos``, and its instances JSON with 1-8 random boxes an
    image); returns the number of objects."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "train2017"))
    os.makedirs(os.path.join(root, "annotations"))
    images, annotations = [], []
    for index, path in enumerate(photos, start=1):
        name = f"{index:012d}.jpg"
        os.link(path, os.path.join(root, "train2017", name))
        width, height = Image.open(path).size
        images.append({"id": index, "file_name": name, "width": width, "height": height})
        for _ in range(int(rng.integers(1, 9))):
            w, h = rng.uniform(0.1, 0.6) * width, rng.uniform(0.1, 0.6) * height
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            annotations.append({"id": len(annotations) + 1, "image_id": index, "category_id": int(rng.integers(1, 4)),
                                "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
                                "area": round(w * h, 2), "iscrowd": 0})
    categories = [{"id": i, "name": name} for i, name in enumerate(("cat", "dog", "bird"), start=1)]
    with open(os.path.join(root, "annotations", "instances_train2017.json"), "w") as handle:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, handle)
    return len(annotations)


def images_only(dataset_dir: str, batch: int, size: int):
    """The detection training pipeline with empty targets: what the image path costs without the boxes."""
    import tensorflow as tf

    import reader
    from reader import tasks

    boxes = tasks.objects

    def without_boxes(targets, images, classes=()):
        task = boxes(targets, images, classes)

        def train(parsed: dict, seed):
            image, raw = task.train(parsed, seed)
            none = tf.size(raw["labels"]) * 0  # a dynamic 0: the rows keep their unknown length
            return image, {name: value[:none] if name in ("boxes", "labels", "crowd", "difficult") else value
                           for name, value in raw.items()}

        return tasks.Task(task.parse, train, task.eval, task.batch)

    tasks.objects = without_boxes  # read when build_dataset picks the task; put back at once
    try:
        return reader.build_dataset(dataset_dir, "train", batch, size, seed=0)
    finally:
        tasks.objects = boxes


def measure(images: int, rounds: int, batches: int, work: str) -> dict:
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run
    from bench import data, read_bench

    import reader

    folders = os.path.join(work, "photos")
    data.make_photo_dataset(folders, images)
    photos = sorted(glob.glob(os.path.join(folders, "*", "*.jpg")))
    objects = write_coco_of(photos, os.path.join(work, "coco"))
    converted = {}
    for name, src in (("classification", folders), ("objects", os.path.join(work, "coco"))):
        converted[name] = os.path.join(work, f"{name}-tfrecords")
        run(ConvertOptions(src=src, out=converted[name], shards=8), ["--direct_running_mode=multi_processing"],
            show_progress=False)
    size, batch = read_bench.SIZE, read_bench.BATCH
    bound = read_bench.pipelines(folders, converted["classification"])["decode_bound_in_memory"]
    makers = {
        "detection_train": lambda: reader.build_dataset(converted["objects"], "train", batch, size, seed=0),
        "classification_train": lambda: reader.build_dataset(converted["classification"], "train", batch, size,
                                                             seed=0),
        "detection_images_only": lambda: images_only(converted["objects"], batch, size),
        "decode_bound_in_memory": bound,
    }
    measured = read_bench.alternating_rounds(makers, rounds, lambda name: batches)
    speed = {name: round(row["images_per_s"], 1) for name, row in measured.items()}
    return {
        "images": images, "objects": objects, "rounds": rounds, "batches": batches, "image_size": size,
        "batch": batch, "images_per_s": speed,
        "cpu_ms_per_image": {name: round(row["cpu_ms_per_image"], 2) for name, row in measured.items()},
        "detection_over_decode_bound": round(speed["detection_train"] / speed["decode_bound_in_memory"], 3),
        "detection_over_classification": round(speed["detection_train"] / speed["classification_train"], 3),
        "boxes_cost": round(speed["detection_images_only"] / speed["detection_train"] - 1, 3),
        "paired": {
            "detection_over_decode_bound": round(read_bench.paired_ratio(measured, "detection_train",
                                                                         "decode_bound_in_memory"), 3),
            "detection_over_classification": round(read_bench.paired_ratio(measured, "detection_train",
                                                                           "classification_train"), 3),
        },
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.read_objects", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=640, help="photos (300-500 px) converted both ways")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=30, help="timed batches of 64 per measurement")
    parser.add_argument("--json", default=RESULTS, help="where to write the results")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-read-objects-")
    try:
        result = measure(args.images, args.rounds, args.batches, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["targets"] = TARGETS
    print(f"detection training: {result['detection_over_decode_bound']}x the decode bound (target >= "
          f"{TARGETS['detection_over_decode_bound']}), {result['detection_over_classification']}x the classification "
          f"preset (target >= {TARGETS['detection_over_classification']}); the boxes themselves cost "
          f"{result['boxes_cost']:+.1%}; images/s {result['images_per_s']}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
