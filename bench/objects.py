"""``python -m bench.objects``: COCO-style data against Model Garden's script, and the plan's memory at two sizes.

    python -m bench.objects                        # 1,200 images x 3 rounds; plans of 12k and 120k images
    python -m bench.objects --images 60 --rounds 1 --sizes 600,1200 --json /tmp/objects.json   # a smoke run

Issue #40's targets:

* **speed**: converting COCO-style data takes at most 1.0x the time of Model Garden's
  ``official/vision/data/create_coco_tf_record.py`` with ``--num_processes`` equal to the cores, on the
  same images and annotation file (both as commands, alternating rounds, medians; ours validates every
  image and it does not);
* **memory, whole runs** (``--convert-sizes``): the launcher's and the largest worker's peak RSS converting
  COCO trees of tiny images at two sizes; annotations reach the workers with their items, so the workers'
  growth should be flat;
* **memory**: planning an annotation file of train2017's size (120k images, about 1M objects) keeps the
  launcher under 1 GB peak. Measured as the peak RSS of a process that plans a synthetic
  ``instances_train2017.json`` (the images need not exist to be planned) at two sizes, so the growth per
  object is what is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "objects.json")
TARGETS = {"speed": 1.0, "plan_mb_at_1m_objects": 1024}
OBJECTS_PER_IMAGE = 8  # train2017: 860k annotations on 118k images, about 7.3 an image


def write_synthetic_coco(root: str, images: int, seed: int = 0) -> int:
    """``root/annotations/instances_train2017.json`` of ``images`` images, 8 objects each, and an empty
    ``root/train2017/``; returns the number of objects."""
    import numpy as np

    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    os.makedirs(os.path.join(root, "train2017"), exist_ok=True)
    corners = rng.uniform(0, 400, size=(images * OBJECTS_PER_IMAGE, 4)).round(2)
    with open(os.path.join(root, "annotations", "instances_train2017.json"), "w") as handle:
        handle.write('{"info": {}, "images": [')
        handle.write(",".join(json.dumps({"id": i + 1, "file_name": f"{i + 1:012d}.jpg", "width": 640, "height": 480})
                              for i in range(images)))
        handle.write('], "annotations": [')
        handle.write(",".join(
            json.dumps({"id": n + 1, "image_id": n // OBJECTS_PER_IMAGE + 1, "category_id": int(n % 80) + 1,
                        "bbox": [float(x), float(y), float(w) / 4 + 1, float(h) / 4 + 1], "area": 100.0,
                        "iscrowd": 0, "segmentation": [[float(x), float(y), float(x) + 5, float(y), float(x) + 5,
                                                        float(y) + 5]]})
            for n, (x, y, w, h) in enumerate(corners)))
        handle.write('], "categories": [')
        handle.write(",".join(json.dumps({"id": i + 1, "name": f"class{i + 1}", "supercategory": "x"})
                              for i in range(80)))
        handle.write("]}")
    return images * OBJECTS_PER_IMAGE


_PLAN = """
import resource, sys, tempfile
from beam_jobs.options import ConvertOptions
from beam_jobs.sources import plan_inputs
with tempfile.TemporaryDirectory() as scratch:
    plan = plan_inputs(ConvertOptions(src=sys.argv[1], out=sys.argv[1] + "-out"), scratch)
    print(len(plan.refs), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def plan_memory(sizes: Sequence[int], work: str) -> dict:
    """Peak RSS (MB) of a process planning a synthetic COCO file at each size, and the growth per object."""
    rows = []
    for images in sizes:
        root = os.path.join(work, f"coco-{images}")
        objects = write_synthetic_coco(root, images)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _PLAN, root], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": REPO}, check=True)
        planned, peak_kb = (int(v) for v in proc.stdout.split()[-2:])
        assert planned == images, proc.stdout
        rows.append({"images": images, "objects": objects, "peak_mb": round(peak_kb / 1024, 1),
                     "seconds": round(time.perf_counter() - started, 1),
                     "json_mb": round(os.path.getsize(os.path.join(root, "annotations",
                                                                   "instances_train2017.json")) / 2**20, 1)})
        shutil.rmtree(root)
    small, large = rows[0], rows[-1]
    per_object = (large["peak_mb"] - small["peak_mb"]) * 2**20 / max(large["objects"] - small["objects"], 1)
    at_1m = small["peak_mb"] + per_object * (1_000_000 - small["objects"]) / 2**20
    return {"sizes": rows, "bytes_per_object": round(per_object), "plan_mb_at_1m_objects": round(at_1m)}


def convert_memory(sizes: Sequence[int], work: str) -> dict:
    """Peak RSS (MB) of the launcher and of its largest worker converting a COCO tree of tiny images (8 objects
    each) at each size, on the default local runner (2 worker processes): the growth is what scales."""
    from bench.scale import make_tiny_jpegs, measured_run

    rows = []
    for images in sizes:
        root = os.path.join(work, f"tiny-coco-{images}")
        make_tiny_jpegs(os.path.join(root, "train2017"), images, classes=100)
        names = [f"c{i % 100:03d}/{i:07d}.jpg" for i in range(images)]
        os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
        with open(os.path.join(root, "annotations", "instances_train2017.json"), "w") as handle:
            json.dump({"images": [{"id": i + 1, "file_name": name, "width": 8, "height": 8}
                                  for i, name in enumerate(names)],
                       "annotations": [{"id": n + 1, "image_id": n // OBJECTS_PER_IMAGE + 1, "category_id": n % 80 + 1,
                                        "bbox": [1.0, 1.0, 4.0, 5.0], "area": 20.0, "iscrowd": 0}
                                       for n in range(images * OBJECTS_PER_IMAGE)],
                       "categories": [{"id": i + 1, "name": f"class{i + 1}"} for i in range(80)]}, handle)
        command = [sys.executable, "-m", "converter", "--src", root, "--out", os.path.join(work, "tiny-out"),
                   "--shards", "16", "--no-progress", "--overwrite", "--direct_num_workers=2"]
        result = measured_run(command, {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}, REPO)
        rows.append({"images": images, "objects": images * OBJECTS_PER_IMAGE, **result})
        shutil.rmtree(root)
    small, large = rows[0], rows[-1]
    return {"sizes": rows, "launcher_growth_mb": round(large["launcher_mb"] - small["launcher_mb"], 1),
            "worker_growth_mb": round(large["largest_worker_mb"] - small["largest_worker_mb"], 1)}


def speed(images: int, rounds: int, work: str) -> dict:
    """Median seconds of our conversion and of Model Garden's script on the same COCO demo images."""
    from converter.demo import write_object_demo

    src = os.path.join(work, "shapes-coco")
    write_object_demo(src, "coco", images=images, seed=1)
    cores = os.cpu_count() or 1
    ours = [sys.executable, "-m", "converter", "--src", src, "--out", os.path.join(work, "ours"), "--shards", "8",
            "--overwrite", "--no-progress"]
    garden = [sys.executable, "-m", "official.vision.data.create_coco_tf_record", "--logtostderr",
              f"--image_dir={src}/train2017", f"--object_annotations_file={src}/annotations/instances_train2017.json",
              f"--output_file_prefix={work}/garden/train", "--num_shards=8", f"--num_processes={cores}"]
    os.makedirs(os.path.join(work, "garden"), exist_ok=True)
    times: dict[str, list[float]] = {"ours": [], "model_garden": []}
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for _ in range(rounds):
        for name, argv in (("ours", ours), ("model_garden", garden)):
            started = time.perf_counter()
            proc = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            times[name].append(time.perf_counter() - started)
            if proc.returncode:
                raise RuntimeError(f"{name} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    medians = {name: statistics.median(values) for name, values in times.items()}
    # Ours converts train and val (a fifth of the images); Model Garden's command, train only: per image.
    train = sum(1 for i in range(images) if i % 5 != 4)
    per_image = {"ours": medians["ours"] / images, "model_garden": medians["model_garden"] / train}
    return {"images": images, "rounds": rounds, "cores": cores, "seconds": {k: round(v, 2) for k, v in medians.items()},
            "ratio": round(per_image["ours"] / per_image["model_garden"], 2)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.objects", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1200, help="COCO demo images for the speed rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="12000,120000", help="images of the two planned files (8 objects each)")
    parser.add_argument("--json", default=RESULTS, help="where to write the results")
    parser.add_argument("--skip-speed", action="store_true", help="only the plan's memory")
    parser.add_argument("--convert-sizes", default="",
                        help="also convert COCO trees of this many tiny images (e.g. 10000,50000): each process's "
                        "peak memory at both sizes")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-objects-")
    try:
        result = {"memory": plan_memory([int(v) for v in args.sizes.split(",")], work)}
        if not args.skip_speed:
            result["speed"] = speed(args.images, args.rounds, work)
        if args.convert_sizes:
            result["convert_memory"] = convert_memory([int(v) for v in args.convert_sizes.split(",")], work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["targets"] = TARGETS
    memory = result["memory"]["plan_mb_at_1m_objects"]
    print(f"plan of 1M objects: {memory} MB peak (target < {TARGETS['plan_mb_at_1m_objects']}), "
          f"{result['memory']['bytes_per_object']} bytes an object")
    if "convert_memory" in result:
        grown = result["convert_memory"]
        print(f"converting: launcher +{grown['launcher_growth_mb']} MB, largest worker +{grown['worker_growth_mb']} MB "
              f"between {', '.join(str(r['images']) for r in grown['sizes'])} images")
    if "speed" in result:
        print(f"COCO conversion: {result['speed']['ratio']}x Model Garden's script per image (target <= 1.0)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
