"""``python -m bench.read_objects``: the detection pipeline against the decode bound and the classification preset.

    python -m bench.read_objects                               # 640 photos, 5 rounds
    python -m bench.read_objects --images 32 --rounds 1 --batches 1 --batch 8 --configs 224 --json /tmp/r.json \
        --direct-running-mode in_memory                        # a smoke run (tests/bench/test_smoke.py)

Issue #41's targets, on the same photos converted twice: as class folders (classification) and as a COCO
tree with 1-8 boxes an image (objects); in two configurations (``--configs``), 224 px on 300-500 px photos
(as ``python -m bench`` makes them) and 384 px on 480-640 px photos (issue #49 §4):

* the detection training pipeline reaches at least **0.9x the decode bound** (every JPEG decoded whole from
  memory and resized, the bound the classification preset is measured against);
* boxes cost at most **10%** over the classification training preset on the same images
  (detection's images/s over classification's >= 1 / 1.1).

A fourth pipeline, ``detection_images_only``, is the detection pipeline with its targets left empty: the
same records, geometry and decode. Detection over it is what the boxes themselves cost; it over the
classification preset is what decoding the whole image (detection) instead of a random crop (about half
the image on average, classification) costs.

All pipelines run in this one process, batch 64, alternating in rounds (``read_bench``), warm page
cache; ratios of medians, and the paired per-round ratios beside them.

``--stages`` adds, in the same rounds, the detection pipeline with one stage taken away at a time (the
profile issue #49 §4 asked for before any change; ``stages`` in the JSON, CPU ms an image):

* ``no_flip``: the flip turned off (``BoxAugmentation(flip=False)``, which leaves no conditional in the
  map): what the flip costs;
* ``resized_to_output``: the window resized straight to the output size (no aspect kept, so no padding,
  and no flip): what padding and the flip cost together, the larger resize included;
* ``zero_image``: the image path replaced by a constant (no decode, resize, flip or padding): records read,
  parsed, the draw and placement, the objects carried and their targets made;
* ``zero_image_no_objects``: the same without the objects and their targets: reading and parsing alone;
* ``bound_on_shards``: the bound's decode (whole JPEG, resized) on our records read from the shards:
  what reading the shards costs over the bound's bytes in memory;
* ``padded_batch``: not a stage taken away but the batched-padding alternative (issue #49 §4): each image
  left unpadded and its objects dense, ``padded_batch`` padding both as it copies them into the batch (a
  pass fewer over each image, but the map no longer fuses with the batch). Its cost over the pipeline's
  pad-then-batch is ``padded_batch_over_pad_and_batch`` (positive: the alternative is the slower).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
from types import SimpleNamespace
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
            none = tf.size(raw["objects"].flat_values) * 0  # a dynamic 0: the rows keep their unknown length
            return image, {name: tasks._one_row(value.values[:none]) if name == "objects" else value
                           for name, value in raw.items()}

        return tasks.Task(task.parse, train, task.eval, task.batch)

    tasks.objects = without_boxes  # read when build_dataset picks the task; put back at once
    try:
        return reader.build_dataset(dataset_dir, "train", batch, size, seed=0)
    finally:
        tasks.objects = boxes


def stage_variants(dataset_dir: str, batch: int, size: int) -> dict:
    """name -> factory of the detection training pipeline with one stage taken away (``--stages``)."""
    import tensorflow as tf

    import reader
    from reader import object_targets, tasks
    from record_schema import IMAGE_ENCODED as IMAGE

    boxes, placed = tasks.objects, tasks._placed_image

    def placement(parsed, geometry, images):
        return tasks.box_ops.place(tasks._stored_hw(parsed), images.size, geometry.scale, geometry.offset)

    def zero_image(parsed, geometry, images):  # a constant: batched like an image, never computed
        return tf.zeros([size, size, 3]), placement(parsed, geometry, images)

    def straight(parsed, geometry, images):
        where = placement(parsed, geometry, images)
        decoded = tasks.preprocess.crop_and_decode(parsed[IMAGE], lambda shape: where.window, True, None)
        return images.finish(tf.image.resize(decoded, images.size)), where

    def no_objects(targets, images, classes=()):
        task = boxes(targets, images, classes)
        # the record still parsed: its image's length is the label
        return tasks.Task(task.parse, lambda parsed, seed: (tf.zeros([size, size, 3]),
                                                            tf.strings.length(parsed[IMAGE])),
                          task.eval, tasks.plain_batch)

    def patched(objects=boxes, image=placed, **kwargs):
        def make():
            tasks.objects, tasks._placed_image = objects, image  # read while the pipeline is built; put back at once
            try:
                return reader.build_dataset(dataset_dir, "train", batch, size, seed=0, **kwargs)
            finally:
                tasks.objects, tasks._placed_image = boxes, placed
        return make

    def padded_batch(targets, images, classes=()):
        # the batched-padding alternative: each image left unpadded and its objects dense; padded_batch pads
        # both as it copies them into the batch (one pass fewer over each image, but no map-and-batch fusion)
        task = boxes(targets, images, classes)

        def train(parsed, seed):
            image, raw = task.train(parsed, seed)
            rows = raw["objects"].values  # [N, 7]; N goes beside the placement
            return image, {"rows": rows, "where": tf.concat([raw["where"], tf.shape(rows)[:1]], 0)}

        def batch(dataset, size_, drop_remainder):
            shapes = ([size, size, 3], {"rows": [None, 7], "where": [10]})

            def targets_of(batch_images, raw):
                objects = SimpleNamespace(values=tf.RaggedTensor.from_tensor(raw["rows"], lengths=raw["where"][:, 9]))
                return batch_images, object_targets.batch_targets(
                    {"objects": objects, "where": raw["where"][:, :9]}, targets, images.size,
                    images.augment.min_visible)

            return (dataset.padded_batch(size_, shapes, drop_remainder=drop_remainder)
                    .map(targets_of, num_parallel_calls=tf.data.AUTOTUNE))

        return tasks.Task(task.parse, train, task.eval, batch)

    def unpadded_and_batched():
        padding = tasks._pad
        tasks._pad = lambda image, size_, value=0: image  # read while the pipeline is built; put back at once
        try:
            return patched(objects=padded_batch)()
        finally:
            tasks._pad = padding

    info = reader.dataset_info(dataset_dir)

    def bound_on_shards():
        spec = {IMAGE: tf.io.FixedLenFeature([], tf.string)}

        def decode(record):
            encoded = tf.io.parse_single_example(record, spec)[IMAGE]
            return tf.image.resize(tf.io.decode_jpeg(encoded, channels=3), (size, size)), 0

        files = tf.data.Dataset.from_tensor_slices(info.split("train").files)
        records = files.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)
        return (records.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)
                .repeat())

    return {
        "no_flip": patched(augment=reader.BoxAugmentation(flip=False)),
        "resized_to_output": patched(image=straight),
        "zero_image": patched(image=zero_image),
        "zero_image_no_objects": patched(objects=no_objects),
        "bound_on_shards": bound_on_shards,
        "padded_batch": unpadded_and_batched,
    }


# (output px, photos' longer side): today's 224 px on 300-500 px photos, and issue #49's 384 px on 480-640 px
CONFIGS = {"224": (224, (300, 500)), "384": (384, (480, 640))}


def decode_bound(photos: list[str], size: int, batch: int):
    """Every JPEG decoded whole from memory and resized to ``size`` (``read_bench``'s bound at any size)."""
    import tensorflow as tf

    encoded = [open(path, "rb").read() for path in photos]

    def decode(data):
        return tf.image.resize(tf.io.decode_jpeg(data, channels=3), (size, size)), 0

    return (tf.data.Dataset.from_tensor_slices(encoded).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch).prefetch(tf.data.AUTOTUNE).repeat())


def measure(images: int, rounds: int, batches: int, work: str, size: int = 224,
            sides: tuple[int, int] = (300, 500), stages: bool = False, batch: Optional[int] = None,
            running_mode: str = "multi_processing") -> dict:
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run
    from bench import data, read_bench

    import reader

    folders = os.path.join(work, "photos")
    data.make_photo_dataset(folders, images, sides=sides)
    photos = sorted(glob.glob(os.path.join(folders, "*", "*.jpg")))
    objects = write_coco_of(photos, os.path.join(work, "coco"))
    converted = {}
    for name, src in (("classification", folders), ("objects", os.path.join(work, "coco"))):
        converted[name] = os.path.join(work, f"{name}-tfrecords")
        run(ConvertOptions(src=src, out=converted[name], shards=8), [f"--direct_running_mode={running_mode}"],
            show_progress=False)
    batch = batch or read_bench.BATCH
    makers = {
        "detection_train": lambda: reader.build_dataset(converted["objects"], "train", batch, size, seed=0),
        "classification_train": lambda: reader.build_dataset(converted["classification"], "train", batch, size,
                                                             seed=0),
        "detection_images_only": lambda: images_only(converted["objects"], batch, size),
        "decode_bound_in_memory": lambda: decode_bound(photos, size, batch),
    }
    if stages:
        makers.update(stage_variants(converted["objects"], batch, size))
    measured = read_bench.alternating_rounds(makers, rounds, lambda name: batches)
    stage_rows = {name: measured.pop(name) for name in STAGES if name in measured}
    speed = {name: round(row["images_per_s"], 1) for name, row in measured.items()}
    spread = {name: [round(min(row["samples"]), 1), round(max(row["samples"]), 1)] for name, row in measured.items()}
    found = {
        "images": images, "photo_sides": list(sides), "objects": objects, "rounds": rounds, "batches": batches,
        "image_size": size, "batch": batch, "images_per_s": speed, "images_per_s_min_max": spread,
        "cpu_ms_per_image": {name: round(row["cpu_ms_per_image"], 3) for name, row in measured.items()},
        "detection_over_decode_bound": round(speed["detection_train"] / speed["decode_bound_in_memory"], 3),
        "detection_over_classification": round(speed["detection_train"] / speed["classification_train"], 3),
        "classification_over_decode_bound": round(speed["classification_train"] / speed["decode_bound_in_memory"],
                                                  3),
        "boxes_cost": round(speed["detection_images_only"] / speed["detection_train"] - 1, 3),
        "paired": {
            "detection_over_decode_bound": round(read_bench.paired_ratio(measured, "detection_train",
                                                                         "decode_bound_in_memory"), 3),
            "detection_over_classification": round(read_bench.paired_ratio(measured, "detection_train",
                                                                           "classification_train"), 3),
        },
        # CPU time per image: the bound's over detection's (1.0: detection spends what the bound does)
        "detection_cpu_over_decode_bound": round(measured["decode_bound_in_memory"]["cpu_ms_per_image"]
                                                 / measured["detection_train"]["cpu_ms_per_image"], 3),
    }
    if stage_rows:
        found["stages"] = stage_costs(measured, stage_rows)
    return found


# the stage variants' names (--stages), in the order they are reported
STAGES = ("no_flip", "resized_to_output", "zero_image", "zero_image_no_objects", "bound_on_shards", "padded_batch")


def stage_costs(measured: dict, stage_rows: dict) -> dict:
    """The stage variants' CPU ms an image and images/s, and what each stage costs (CPU ms an image): the
    pipeline's over the variant without it."""
    cpu = {name: row["cpu_ms_per_image"] for name, row in {**measured, **stage_rows}.items()}
    costs = {"flip": ("detection_train", "no_flip"), "padding_and_flip": ("detection_train", "resized_to_output"),
             "image_path": ("detection_train", "zero_image"), "objects": ("zero_image", "zero_image_no_objects"),
             "reading_shards_over_memory": ("bound_on_shards", "decode_bound_in_memory"),
             "padded_batch_over_pad_and_batch": ("padded_batch", "detection_train")}
    return {
        "cpu_ms_per_image": {name: round(value, 3) for name, value in cpu.items() if name in stage_rows},
        "images_per_s": {name: round(row["images_per_s"], 1) for name, row in stage_rows.items()},
        "cost_cpu_ms_per_image": {name: round(cpu[a] - cpu[b], 3) for name, (a, b) in costs.items()
                                  if a in cpu and b in cpu},
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.read_objects", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=640, help="photos (300-500 px) converted both ways")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=30, help="timed batches per measurement")
    parser.add_argument("--batch", type=int, default=64, help="images per batch (default: %(default)s; a smoke run "
                        "takes fewer)")
    parser.add_argument("--json", default=RESULTS, help="where to write the results")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS),
                        help="224: 224 px on 300-500 px photos; 384: 384 px on 480-640 px photos (issue #49)")
    parser.add_argument("--direct-running-mode", default="multi_processing",
                        choices=("multi_processing", "in_memory"),
                        help="how the two conversions run (set-up, not measured; the same shards either way; "
                        "default: %(default)s; a smoke run converts its few photos in this process)")
    parser.add_argument("--stages", action="store_true",
                        help="also measure the detection pipeline with one stage taken away at a time (the profile)")
    args = parser.parse_args(argv)
    by_config = {}
    for name in args.configs:
        work = tempfile.mkdtemp(prefix="bench-read-objects-")
        try:
            by_config[name] = measure(args.images, args.rounds, args.batches, work, *CONFIGS[name], args.stages,
                                      args.batch, args.direct_running_mode)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        found = by_config[name]
        print(f"{found['image_size']} px on {found['photo_sides'][0]}-{found['photo_sides'][1]} px photos, detection "
              f"training: {found['detection_over_decode_bound']}x the decode bound (paired "
              f"{found['paired']['detection_over_decode_bound']}, CPU {found['detection_cpu_over_decode_bound']}; "
              f"target >= {TARGETS['detection_over_decode_bound']}), {found['detection_over_classification']}x the "
              f"classification preset (target >= {TARGETS['detection_over_classification']}, which is itself "
              f"{found['classification_over_decode_bound']}x the bound); the boxes themselves cost "
              f"{found['boxes_cost']:+.1%}; images/s {found['images_per_s']}")
        if "stages" in found:
            print(f"  CPU ms an image: {found['cpu_ms_per_image']} {found['stages']['cpu_ms_per_image']}; what each "
                  f"stage costs: {found['stages']['cost_cpu_ms_per_image']}")
    # The first configuration's numbers at the top level (where they have always been), every one by name
    result = {**by_config[args.configs[0]], "by_config": by_config, "targets": TARGETS}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
