"""``python -m bench.objects``: COCO-style data against Model Garden's script, and the plan's memory at two sizes.

    python -m bench.objects                        # 1,500 photos x 3 rounds, 20,000 once; plans of 10k and 100k objects
    python -m bench.objects --full --skip-speed    # the scale figures: plans of 100k and 1M objects, 100k label files
    python -m bench.objects --images 60 --rounds 1 --sizes 600,1200 --json /tmp/objects.json   # a smoke run

Issue #40's targets:

* **speed** (issue #49 §5): converting 1,500 COCO-sized photos (480-640 px JPEGs, 1-8 boxes each, all in
  ``train2017/``) takes at most 0.7x the time of Model Garden's ``official/vision/data/create_coco_tf_record.py``
  with ``--num_processes`` equal to the cores, on the same images and annotation file, end to end (both as
  commands, start-up included, alternating rounds, medians; ours validates every image and it does not). At
  ``--large-images`` (20,000: where start-up no longer hides the rate; one round by default) at most 1.0x (issue
  #57 §6), and each tool's seconds an image between the two sizes. Our run's phases come from its output as it
  arrives: listed (start-up, listing, plan), published (workers, the images, the commit), exit. Each round also
  gives both commands' CPU (user + system, as ``/usr/bin/time`` counts it: its ratio holds on a shared machine
  where wall seconds swing), our launcher's and largest worker's peak RSS (flat between the two sizes when the
  workers hold no more than their part), and the load. Our packages are compiled to bytecode first, as an install
  compiles them (a checkout under ``PYTHONDONTWRITEBYTECODE`` compiles them from source in every process of
  every run), and each round writes into a fresh folder. A size without its own photos under ``--data`` is cut
  from a larger tree there (links: ``--images 5000`` beside 20,000 makes no photo);
* **memory, whole runs** (``--convert-sizes``): the launcher's and the largest worker's peak RSS converting
  COCO trees of tiny images at two sizes; annotations reach the workers with their items, so the workers'
  growth should be flat;
* **memory**: planning an annotation file of train2017's size (120k images, about 1M objects) keeps the
  launcher under 1 GB peak. Measured as the peak RSS of a process that plans a synthetic
  ``instances_train2017.json`` (the images need not exist to be planned) at two sizes, so the growth per
  object is what is reported.

Issue #47's (annotations at the scale they ship):

* **memory, each layout**: the same figure for YOLO (a label file per image beside an empty placeholder
  image: planning lists images, it does not read them) and Pascal VOC (an XML per image, placeholder
  images); 8 objects an image. ``--full``: 100k and 1M objects, target under 1 GB at 1M.
* **YOLO label files**: seconds to plan ``--label-files`` YOLO images with a label file each, from a
  local folder and from S3 (moto's server on loopback: every label file a GET), read in parallel as the
  plan does and one at a time (``annotated_plan.READERS = 1``, what the launcher did before).

Each plan runs in a process of its own, forked from one that has imported the converter (a forkserver), so
a peak is that plan's, from the same baseline a fresh ``python -m converter`` has.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "objects.json")
TARGETS = {"speed": 0.7, "speed_large": 1.0, "plan_mb_at_1m_objects": 1024}
OBJECTS_PER_IMAGE = 8  # train2017: 860k annotations on 118k images, about 7.3 an image
VOC_NAMES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
             "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


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


def write_synthetic_yolo(root: str, images: int, seed: int = 0) -> int:
    """``root/data.yaml`` (80 classes), ``images/train/`` of empty placeholders and ``labels/train/`` of a label
    file each, 8 objects a file; returns the number of objects."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for folder in ("images/train", "labels/train"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    with open(os.path.join(root, "data.yaml"), "w") as handle:
        handle.write("train: images/train\nnames: [" + ", ".join(f"c{i}" for i in range(80)) + "]\n")
    for i in range(images):
        open(os.path.join(root, "images", "train", f"{i:07d}.jpg"), "wb").close()
        values = rng.uniform(0.1, 0.5, size=(OBJECTS_PER_IMAGE, 4))
        with open(os.path.join(root, "labels", "train", f"{i:07d}.txt"), "w") as handle:
            handle.writelines(f"{(i + n) % 80} {cx:.6f} {cy:.6f} {w / 4:.6f} {h / 4:.6f}\n"
                              for n, (cx, cy, w, h) in enumerate(values))
    return images * OBJECTS_PER_IMAGE


def write_synthetic_voc(root: str, images: int, seed: int = 0) -> int:
    """``root/Annotations/`` of an XML each (8 objects of VOC's classes) beside ``root/JPEGImages/`` of empty
    placeholders, no ImageSets (every image is train); returns the number of objects."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for folder in ("Annotations", "JPEGImages"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    for i in range(images):
        open(os.path.join(root, "JPEGImages", f"{i:06d}.jpg"), "wb").close()
        corners = rng.integers(1, 200, size=(OBJECTS_PER_IMAGE, 2))
        objects = "".join(f"<object><name>{VOC_NAMES[(i + n) % 20]}</name><pose>Left</pose><truncated>0</truncated>"
                          f"<difficult>0</difficult><bndbox><xmin>{x}</xmin><ymin>{y}</ymin><xmax>{x + 40}</xmax>"
                          f"<ymax>{y + 30}</ymax></bndbox></object>" for n, (x, y) in enumerate(corners))
        with open(os.path.join(root, "Annotations", f"{i:06d}.xml"), "w") as handle:
            handle.write(f"<annotation><filename>{i:06d}.jpg</filename><size><width>320</width><height>240</height>"
                         f"<depth>3</depth></size>{objects}</annotation>")
    return images * OBJECTS_PER_IMAGE


WRITERS = {"coco": write_synthetic_coco, "yolo": write_synthetic_yolo, "voc": write_synthetic_voc}


def _plan_in_child(src: str, s3_flags: Sequence[str] = (), readers: int = 0) -> tuple[int, int, float]:
    """(images planned, peak RSS in KB, seconds) of planning ``src`` with a scratch folder, as the converter
    does; run in a process of its own (:func:`_child`). ``readers``: YOLO's label files read at once."""
    import resource

    from beam_jobs.options import ConvertOptions
    from beam_jobs.sources import plan_inputs
    from beam_jobs.sources.objects import annotated_plan

    if s3_flags:
        from apache_beam.options.pipeline_options import PipelineOptions

        from beam_jobs.files.filesystems import FileSystems

        FileSystems.set_options(PipelineOptions(list(s3_flags)))
    annotated_plan.READERS = readers or annotated_plan.READERS
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        plan = plan_inputs(ConvertOptions(src=src, out=os.path.join(scratch, "out")), scratch)
        seconds = time.perf_counter() - started
        return len(plan.refs), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, seconds


def _child(*args) -> tuple[int, int, float]:
    """:func:`_plan_in_child` in a fresh process forked from the forkserver (the converter imported once)."""
    context = multiprocessing.get_context("forkserver")
    with context.Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(_plan_in_child, args)


def plan_memory(sizes: Sequence[int], work: str, layout: str = "coco") -> dict:
    """Peak RSS (MB) of a process planning a synthetic ``layout`` dataset at each size, and the growth per object."""
    rows = []
    for images in sizes:
        root = os.path.join(work, f"{layout}-{images}")
        started = time.perf_counter()
        objects = WRITERS[layout](root, images)
        written = time.perf_counter() - started
        planned, peak_kb, seconds = _child(root)
        assert planned == images, (planned, images)
        rows.append({"images": images, "objects": objects, "peak_mb": round(peak_kb / 1024, 1),
                     "seconds": round(seconds, 1), "write_seconds": round(written, 1)})
        if layout == "coco":
            rows[-1]["json_mb"] = round(os.path.getsize(os.path.join(root, "annotations",
                                                                     "instances_train2017.json")) / 2**20, 1)
        shutil.rmtree(root)
    small, large = rows[0], rows[-1]
    per_object = (large["peak_mb"] - small["peak_mb"]) * 2**20 / max(large["objects"] - small["objects"], 1)
    at_1m = small["peak_mb"] + per_object * (1_000_000 - small["objects"]) / 2**20
    return {"sizes": rows, "bytes_per_object": round(per_object), "plan_mb_at_1m_objects": round(at_1m)}


def yolo_label_files(files: int, work: str) -> dict:
    """Seconds to plan ``files`` YOLO images with a label file each: local, and in S3 (moto on loopback), the
    label files read in parallel (as planned) and one at a time (as before)."""
    from bench.s3_read import _start_moto

    root = os.path.join(work, f"yolo-files-{files}")
    write_synthetic_yolo(root, files)
    result = {"files": files, "readers": _readers()}
    result["local_s"] = round(_child(root)[2], 2)
    result["local_one_at_a_time_s"] = round(_child(root, (), 1)[2], 2)
    proc, endpoint = _start_moto()
    try:
        remote, flags = _upload(root, endpoint)
        result["s3_s"] = round(_child(remote, flags)[2], 2)
        result["s3_one_at_a_time_s"] = round(_child(remote, flags, 1)[2], 2)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(root)
    result["s3_speedup"] = round(result["s3_one_at_a_time_s"] / max(result["s3_s"], 1e-9), 1)
    return result


def _readers() -> int:
    from beam_jobs.sources.objects import annotated_plan

    return annotated_plan.READERS


def _upload(root: str, endpoint: str) -> tuple[str, list[str]]:
    """``root``'s files into a new bucket of moto's server, 16 at a time; the dataset's URL and the flags."""
    import boto3

    keys = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench", "region_name": "us-east-1"}
    client = boto3.client("s3", endpoint_url=endpoint, **keys)
    client.create_bucket(Bucket="bench")
    paths = [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda path: client.upload_file(path, "bench", f"yolo/{os.path.relpath(path, root)}"), paths))
    flags = [f"--s3_endpoint_url={endpoint}", "--s3_access_key_id=bench", "--s3_secret_access_key=bench",
             "--s3_region_name=us-east-1"]
    return "s3://bench/yolo", flags


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


def coco_photos(images: int, work: str, seed: int = 1) -> str:
    """A COCO tree of ``images`` COCO-sized photos (480-640 px JPEGs, ``bench/data.py``), all in ``train2017/``, with
    1-8 boxes an image (``bench.read_objects.write_coco_of``); made once under ``work``, or, where a larger tree
    is there already, its first ``images`` (links to its photos, the JSON cut to them: no photo made twice)."""
    import glob

    from bench import data
    from bench.read_objects import write_coco_of

    root = os.path.join(work, f"coco-photos-{images}")
    if not os.path.exists(os.path.join(root, "annotations", "instances_train2017.json")):
        larger = sorted((int(path.rsplit("-", 1)[1]), path) for path in glob.glob(os.path.join(work, "coco-photos-*"))
                        if path.rsplit("-", 1)[1].isdigit() and int(path.rsplit("-", 1)[1]) > images and
                        os.path.exists(os.path.join(path, "annotations", "instances_train2017.json")))
        if larger:
            return _first_of(larger[0][1], images, root)
        photos = os.path.join(work, f"photos-{images}")
        data.make_photo_dataset(photos, images, seed=seed, sides=(480, 640))
        write_coco_of(sorted(glob.glob(os.path.join(photos, "*", "*.jpg"))), root, seed=seed)
    return root


def _first_of(larger: str, images: int, root: str) -> str:
    """``root``: the first ``images`` images of the COCO tree ``larger`` (by id), their annotations and its
    categories, the photos linked."""
    with open(os.path.join(larger, "annotations", "instances_train2017.json")) as handle:
        found = json.load(handle)
    kept = found["images"][:images]
    ids = {image["id"] for image in kept}
    os.makedirs(os.path.join(root, "train2017"))
    os.makedirs(os.path.join(root, "annotations"))
    for image in kept:
        os.link(os.path.join(larger, "train2017", image["file_name"]), os.path.join(root, "train2017",
                                                                                   image["file_name"]))
    with open(os.path.join(root, "annotations", "instances_train2017.json"), "w") as handle:
        json.dump({"images": kept, "annotations": [ann for ann in found["annotations"] if ann["image_id"] in ids],
                   "categories": found["categories"]}, handle)
    return root


def timed_phases(argv: Sequence[str], env: dict) -> dict:
    """Seconds from the start of ``argv`` to each of its phases, read from its output as it arrives: ``listed``
    (ours: start-up, listing and plan), ``published`` (ours: workers, every image, the commit), and ``exit`` (the
    process's end, not its output's: forked workers hold that a moment longer); with its CPU (``cpu_s``: user and
    system of the command and every process it waited for, as ``/usr/bin/time`` counts it: a ratio of CPU holds on
    a shared machine where wall seconds swing) and peak RSS in MB (``launcher_mb``, ``largest_worker_mb``: the
    command's own and its largest descendant's high-water marks, polled every 0.2 s)."""
    from bench.scale import _descendants, _peak_kb

    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict = {}
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            for phase, marker in (("listed", " listed"), ("published", "published ")):
                if marker in line and phase not in seen:
                    seen[phase] = time.perf_counter() - started

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    launcher = worker = 0
    while True:
        launcher = max(launcher, _peak_kb(proc.pid))
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        worker = max([worker] + [_peak_kb(child) for child in _descendants(proc.pid)])
        time.sleep(0.2)
    seen["exit"] = time.perf_counter() - started
    reader.join(timeout=60)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if code:
        raise RuntimeError(f"{argv[2]} failed ({code}): {''.join(lines)[-2000:]}")
    seen.update(cpu_s=usage.ru_utime + usage.ru_stime, launcher_mb=round(launcher / 1024, 1),
                largest_worker_mb=round(worker / 1024, 1), load=_load())
    return seen


def _load() -> float:
    """The machine's load average over the last minute (the machine is shared: each figure says its load)."""
    return round(os.getloadavg()[0], 1)


def compiled(env: dict) -> None:
    """Our packages' bytecode compiled, as installing them compiles it (``pip install`` writes ``__pycache__``;
    Model Garden's and Beam's are): a checkout run with ``PYTHONDONTWRITEBYTECODE`` would compile every module of
    ours from source in each process of each run, which no installed converter does. Python checks each file's
    bytecode against its source, so an edited file is compiled afresh, never run stale."""
    packages = ["beam_jobs", "converter", "record_files", "record_schema.py"]  # what a conversion imports
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def speed(images: int, rounds: int, work: str, large: int = 0, large_rounds: int = 1,
          data: Optional[str] = None) -> dict:
    """Both converters on the same COCO-sized photos (all train), as commands, alternating rounds: medians end to
    end, our phases, and with ``large`` images as well, each tool's seconds an image between the two sizes. The
    photos are made under ``data`` (kept and reused) or ``work``."""
    cores = os.cpu_count() or 1
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if max(images, large) >= 1000:  # a timing worth comparing (a smoke run's is not: it compiles nothing ahead)
        compiled(env)
    result = {"cores": cores, "photo_sides": [480, 640]}
    for size, size_rounds in ((images, rounds), (large, large_rounds)):
        if not size:
            continue
        src = coco_photos(size, data or work)
        commands = {
            "ours": [sys.executable, "-m", "converter", "--src", src, "--out", os.path.join(work, "ours"), "--shards",
                     "8", "--overwrite"],
            "model_garden": [sys.executable, "-m", "official.vision.data.create_coco_tf_record", "--logtostderr",
                             f"--image_dir={src}/train2017",
                             f"--object_annotations_file={src}/annotations/instances_train2017.json",
                             f"--output_file_prefix={work}/garden/train", "--num_shards=8", f"--num_processes={cores}"]}
        runs: dict[str, list[dict]] = {name: [] for name in commands}
        outputs = {"ours": os.path.join(work, "ours"), "model_garden": os.path.join(work, "garden")}
        for index in range(size_rounds):
            for name in (list(commands) if index % 2 == 0 else list(commands)[::-1]):
                # Each round into a fresh folder, as the other tool's (ours would otherwise replace the last
                # round's dataset, a removal Model Garden's overwrite in place does not make).
                shutil.rmtree(outputs[name], ignore_errors=True)
                os.makedirs(os.path.join(work, "garden"), exist_ok=True)
                runs[name].append(timed_phases(commands[name], env))
        medians = {name: statistics.median(run["exit"] for run in done) for name, done in runs.items()}
        cpu = {name: statistics.median(run["cpu_s"] for run in done) for name, done in runs.items()}
        phases = {phase: round(statistics.median(run[phase] for run in runs["ours"]), 2)
                  for phase in ("listed", "published", "exit")}
        result[str(size)] = {"images": size, "rounds": size_rounds,
                             "seconds": {name: round(value, 2) for name, value in medians.items()},
                             "ratio": round(medians["ours"] / medians["model_garden"], 2),
                             "rounds_ratio": [round(o["exit"] / g["exit"], 2)
                                              for o, g in zip(runs["ours"], runs["model_garden"])],
                             "cpu_s": {name: round(value, 1) for name, value in cpu.items()},
                             "cpu_ratio": round(cpu["ours"] / cpu["model_garden"], 2),
                             "ours_phases_s": phases,
                             "peak_mb": {name: {key: max(run[key] for run in done)
                                                for key in ("launcher_mb", "largest_worker_mb")}
                                         for name, done in runs.items()},
                             "load": [run["load"] for name in commands for run in runs[name]]}
        shutil.rmtree(os.path.join(work, "ours"), ignore_errors=True)
    first = result[str(images)]
    # The keys earlier runs wrote (the smoke test reads them): the small size's.
    result.update(images=images, rounds=rounds, large=large, seconds=first["seconds"], ratio=first["ratio"])
    if large:
        grown = {name: (result[str(large)]["seconds"][name] - first["seconds"][name]) / (large - images) * 1000
                 for name in ("ours", "model_garden")}
        result["per_image_ms"] = {name: round(value, 3) for name, value in grown.items()}
        result["per_image_ratio"] = round(grown["ours"] / grown["model_garden"], 2)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.objects", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1500, help="COCO-sized photos for the speed rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--large-images", type=int,
                        help="COCO-sized photos of the larger speed run (default: 20,000, or none when --images is "
                        "under 1,000, a quick look; 0: none)")
    parser.add_argument("--large-rounds", type=int, default=1)
    parser.add_argument("--data", help="a folder for the speed runs' photos, kept and reused (default: temporary)")
    parser.add_argument("--sizes", default="1250,12500", help="images of the two planned datasets (8 objects each)")
    parser.add_argument("--layouts", default="coco,yolo,voc",
                        help="the layouts whose plans are measured ('': none, the figures in --json are kept)")
    parser.add_argument("--label-files", type=int, default=2000,
                        help="YOLO label files planned from a folder and from S3 (0: not measured)")
    parser.add_argument("--full", action="store_true",
                        help="the scale figures: --sizes 12500,125000 (100k and 1M objects), --label-files 100000")
    parser.add_argument("--json", default=RESULTS, help="where to write the results")
    parser.add_argument("--skip-speed", action="store_true", help="only the plan's memory")
    parser.add_argument("--convert-sizes", default="",
                        help="also convert COCO trees of this many tiny images (e.g. 10000,50000): each process's "
                        "peak memory at both sizes")
    args = parser.parse_args(argv)
    if args.large_images is None:
        args.large_images = 20_000 if args.images >= 1000 else 0
    if args.full:
        args.sizes, args.label_files = "12500,125000", 100_000
    multiprocessing.get_context("forkserver").set_forkserver_preload(["beam_jobs.sources", "apache_beam"])
    work = tempfile.mkdtemp(prefix="bench-objects-")
    try:
        sizes = [int(v) for v in args.sizes.split(",")]
        by_layout = {layout: plan_memory(sizes, work, layout) for layout in args.layouts.split(",") if layout}
        result = _kept(args.json)  # what this run does not measure stays as the last run measured it
        if by_layout:
            result.update(memory=by_layout.get("coco") or next(iter(by_layout.values())), memory_by_layout=by_layout)
        if args.label_files:
            result["yolo_label_files"] = yolo_label_files(args.label_files, work)
        if not args.skip_speed:
            result["speed"] = speed(args.images, args.rounds, work, args.large_images, args.large_rounds, args.data)
        if args.convert_sizes:
            result["convert_memory"] = convert_memory([int(v) for v in args.convert_sizes.split(",")], work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["targets"] = TARGETS
    _print(result)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    return 0


def _kept(path: str) -> dict:
    """The results at ``path`` (a run that measures part of them keeps the rest), or nothing."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _print(result: dict) -> None:
    for layout, memory in result.get("memory_by_layout", {}).items():
        peaks = ", ".join(f"{row['peak_mb']} MB at {row['objects']}" for row in memory["sizes"])
        print(f"{layout}: plan of 1M objects: {memory['plan_mb_at_1m_objects']} MB peak (target < "
              f"{TARGETS['plan_mb_at_1m_objects']}), {memory['bytes_per_object']} bytes an object ({peaks})")
    if "yolo_label_files" in result:
        files = result["yolo_label_files"]
        print(f"YOLO, {files['files']} label files: local {files['local_s']} s ({files['local_one_at_a_time_s']} s "
              f"one at a time), S3 {files['s3_s']} s ({files['s3_one_at_a_time_s']} s one at a time)")
    if "convert_memory" in result:
        grown = result["convert_memory"]
        print(f"converting: launcher +{grown['launcher_growth_mb']} MB, largest worker +{grown['worker_growth_mb']} MB "
              f"between {', '.join(str(r['images']) for r in grown['sizes'])} images")
    if "speed" in result:
        found = result["speed"]
        for size in (found["images"], found.get("large")):
            if str(size) in found:
                row = found[str(size)]
                print(f"COCO, {size} photos: {row['seconds']['ours']} s against {row['seconds']['model_garden']} s, "
                      f"{row['ratio']}x Model Garden's script end to end (target <= "
                      f"{TARGETS['speed' if size == found['images'] else 'speed_large']}); ours listed at "
                      f"{row['ours_phases_s']['listed']} s, published at {row['ours_phases_s']['published']} s")
                if "cpu_s" in row:
                    peaks = row["peak_mb"]["ours"]
                    print(f"  CPU {row['cpu_s']['ours']} s against {row['cpu_s']['model_garden']} s = "
                          f"{row['cpu_ratio']}x; ours' peak RSS: launcher {peaks['launcher_mb']} MB, largest worker "
                          f"{peaks['largest_worker_mb']} MB; load {row['load']}")
        if "per_image_ratio" in found:
            print(f"  per image: {found['per_image_ms']['ours']} against {found['per_image_ms']['model_garden']} ms "
                  f"= {found['per_image_ratio']}x")


if __name__ == "__main__":
    sys.exit(main())
