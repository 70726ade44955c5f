"""What ``report`` costs per 100k records, and that its memory does not grow with them: ``python -m bench.report_bench``.

    python -m bench.report_bench                                   # 100k and 400k records, both tasks (minutes)
    python -m bench.report_bench --sizes 2000 4000 --tasks objects --json /tmp/r.json   # a quick look

Synthetic datasets written straight as shards (``record_files.tfrecord``'s writer, a manifest, no
conversion): records of small JPEGs (64 x 48, a few hundred bytes, so the pass's own cost is measured, not
the disk's), sizes declared as photos' (640 x 480 and others), and

- ``objects``: 0-7 boxes an image over COCO's 80 classes, 1% crowd;
- ``classification``: 1,000 classes, as ImageNet (the contact sheets stop at 48 classes).

``--photo-bytes N`` pads each record's image to about N bytes (a real photo's ~110 KB) to see the reading
cost. Each size is reported by a process of its own (its peak RSS is the report's, from its start); a
second pass over the same records that only reads their frames (CRCs checked) is the floor the report's
pass is compared with. Results go to ``bench/results/report.json`` (or ``--json``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "report.json")
RECORDS_PER_SHARD = 10_000
SIDES = ((640, 480), (500, 375), (480, 640), (1024, 768), (300, 200))


def _jpegs(count: int, rng: np.random.Generator, pad_to: int) -> list[bytes]:
    """``count`` small JPEGs; padded with a COM segment (still a valid JPEG) to about ``pad_to`` bytes."""
    out = []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buffer, format="JPEG", quality=80)
        data = buffer.getvalue()
        while len(data) < pad_to:
            chunk = min(pad_to - len(data), 65_000)
            data = data[:2] + b"\xff\xfe" + (chunk + 2).to_bytes(2, "big") + bytes(chunk) + data[2:]
        out.append(data)
    return out


def write_dataset(folder: str, records: int, task: str, seed: int = 0, pad_to: int = 0) -> str:
    """A dataset of ``records`` synthetic records of ``task`` (``objects`` or ``classification``) in ``folder``,
    kept when it is already there (the manifest is written last)."""
    import record_schema
    from record_files.tfrecord import ByteStrings, Floats, Ints, frame_record, serialize_example

    if os.path.exists(os.path.join(folder, record_schema.MANIFEST_FILE)):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    images = _jpegs(16, rng, pad_to)
    classes = [""] + [f"class{i}" for i in range(1, 81)] if task == "objects" else [f"n{i:08d}" for i in range(1000)]
    shards, counts, count_shards = [], np.zeros(len(classes), np.int64), -(-records // RECORDS_PER_SHARD)
    for shard in range(count_shards):
        name = record_schema.shard_filename("train", shard, count_shards)
        size = min(RECORDS_PER_SHARD, records - shard * RECORDS_PER_SHARD)
        with open(os.path.join(folder, name), "wb") as handle:
            for index in range(size):
                width, height = SIDES[int(rng.integers(len(SIDES)))]
                features = {record_schema.IMAGE_ENCODED: images[index % len(images)],
                            record_schema.IMAGE_FORMAT: b"jpeg", record_schema.WIDTH: width,
                            record_schema.HEIGHT: height, record_schema.CHANNELS: 3,
                            record_schema.FILENAME: f"train/{shard:05d}/{index:06d}.jpg".encode(),
                            record_schema.SHA256: b"0" * 64}
                if task == "objects":
                    boxes = int(rng.integers(8))
                    x0, y0 = rng.uniform(0, 0.8, boxes), rng.uniform(0, 0.8, boxes)
                    x1, y1 = x0 + rng.uniform(0.01, 0.2, boxes), y0 + rng.uniform(0.01, 0.2, boxes)
                    labels = rng.integers(1, 81, boxes)
                    counts += np.bincount(labels, minlength=len(classes))
                    features.update({record_schema.BBOX_XMIN: Floats(x0), record_schema.BBOX_YMIN: Floats(y0),
                                     record_schema.BBOX_XMAX: Floats(x1), record_schema.BBOX_YMAX: Floats(y1),
                                     record_schema.OBJECT_LABEL: Ints(int(v) for v in labels),
                                     record_schema.OBJECT_TEXT: ByteStrings(classes[v].encode() for v in labels),
                                     record_schema.OBJECT_IS_CROWD: Ints(int(rng.random() < 0.01) for _ in labels),
                                     record_schema.OBJECT_DIFFICULT: Ints(0 for _ in labels)})
                else:
                    label = int(rng.integers(len(classes)))
                    counts[label] += 1
                    features.update({record_schema.LABEL: label, record_schema.LABEL_TEXT: classes[label].encode()})
                handle.write(frame_record(serialize_example(features)))
        shards.append({"file": name, "num_examples": size, "num_bytes": os.path.getsize(os.path.join(folder, name)),
                       "sha256": ""})
    manifest = {"format_version": record_schema.FORMAT_VERSION, "classes": classes, "num_classes": len(classes),
                "task": record_schema.TASK_OBJECTS if task == "objects" else record_schema.TASK_CLASSIFICATION,
                "splits": {"train": {"num_examples": records, "num_bytes": sum(s["num_bytes"] for s in shards),
                                     "num_shards": len(shards), "label_counts": counts.tolist(),
                                     "num_reencoded": 0, "reencoded_by_reason": {}, "shards": shards}},
                "options": {"src": os.path.join(folder, "src")}}
    with open(os.path.join(folder, record_schema.MANIFEST_FILE), "w") as handle:
        json.dump(manifest, handle)
    return folder


def measure(folder: str) -> dict:
    """In this process: the floor (frames read), then the report; seconds and peak RSS (MiB) after each."""
    import reader  # noqa: F401  (TensorFlow loaded before the baseline memory is taken)
    from reader import report
    from reader.info import dataset_info
    from reader.verify import iter_records

    import matplotlib  # noqa: F401

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    records = sum(1 for split in dataset_info(folder).splits.values() for shard in split.shards
                  for _ in iter_records(shard.path))
    read_only = time.perf_counter() - started
    dest = tempfile.mkdtemp(prefix="report-bench-")
    try:
        started = time.perf_counter()
        report.write_report(folder, dest)
        seconds = time.perf_counter() - started
        html_bytes = os.path.getsize(os.path.join(dest, report.HTML_FILE))
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"records": records, "report_s": round(seconds, 3), "read_frames_only_s": round(read_only, 3),
            "report_s_per_100k": round(seconds / records * 1e5, 2),
            "read_frames_only_s_per_100k": round(read_only / records * 1e5, 2),
            "peak_rss_mib": round(peak, 1), "rss_after_imports_mib": round(baseline, 1),
            "report_rss_growth_mib": round(peak - baseline, 1), "html_bytes": html_bytes}


def _measured_in_own_process(folder: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.report_bench", "--measure", folder], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO,
                                                               "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode:
        raise RuntimeError(f"measuring {folder} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 400_000], help="records a dataset")
    parser.add_argument("--tasks", nargs="+", default=["objects", "classification"],
                        choices=["objects", "classification"])
    parser.add_argument("--photo-bytes", type=int, default=0, help="pad each image to about this many bytes")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "imgshards-report-bench"),
                        help="where the synthetic datasets are written (and kept for the next run)")
    parser.add_argument("--json", default=RESULTS, help="where the results go")
    parser.add_argument("--measure", metavar="DATASET", help=argparse.SUPPRESS)  # the child's side
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    results = {"records_per_shard": RECORDS_PER_SHARD, "photo_bytes": args.photo_bytes, "cpu": os.cpu_count(),
               "runs": {}}
    for task in args.tasks:
        for size in args.sizes:
            folder = write_dataset(os.path.join(args.work, f"{task}-{size}-{args.photo_bytes}"), size, task,
                                   pad_to=args.photo_bytes)
            results["runs"][f"{task}-{size}"] = _measured_in_own_process(folder)
            print(f"{task} {size:,}: {json.dumps(results['runs'][f'{task}-{size}'])}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(results, handle, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
