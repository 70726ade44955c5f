"""What ``report`` costs, and that its memory does not grow with the records: ``python -m bench.report_bench``.

    python -m bench.report_bench                                   # 100k and 1M records, both tasks (minutes)
    python -m bench.report_bench --sizes 2000 4000 --tasks objects --json /tmp/r.json   # a quick look

Synthetic datasets written straight as shards (``record_files.tfrecord``'s writer, a manifest, no
conversion) with their records table (``record_files.records_table``'s writer and join, the figures summed
per shard as the converter's shard writers sum them): records of small JPEGs (64 x 48, a few hundred bytes,
so the pass's own cost is measured, not the disk's), sizes declared as photos' (640 x 480 and others), and

- ``objects``: 0-7 boxes an image over COCO's 80 classes, 1% crowd;
- ``classification``: 1,000 classes, as ImageNet (the contact sheets stop at 48 classes).

``--photo-bytes N`` pads each record's image to about N bytes (a real photo's ~110 KB) to see the reading
cost. Each size is reported by a process of its own (its peak RSS is the report's, from its start; its CPU
seconds, user and system, the report's alone): from the records tables (issue #56 §3: the footers' figures,
only the drawn records read), and, up to ``--scan-up-to`` records, by the scan of every record that a
dataset converted before the tables gets, beside the floor of that scan (a pass that only reads the frames,
CRCs checked). Results go to ``bench/results/report.json`` (or ``--json``).
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
    from record_files import records_table
    from record_files.record_stats import ObjectValues, SplitStats
    from record_files.tfrecord import ByteStrings, Floats, Ints, frame_record, serialize_example

    if os.path.exists(os.path.join(folder, record_schema.MANIFEST_FILE)):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    images = _jpegs(16, rng, pad_to)
    classes = [""] + [f"class{i}" for i in range(1, 81)] if task == "objects" else [f"n{i:08d}" for i in range(1000)]
    shards, counts, count_shards = [], np.zeros(len(classes), np.int64), -(-records // RECORDS_PER_SHARD)
    task_name = record_schema.TASK_OBJECTS if task == "objects" else record_schema.TASK_CLASSIFICATION
    parts = []
    for shard in range(count_shards):
        name = record_schema.shard_filename("train", shard, count_shards)
        size = min(RECORDS_PER_SHARD, records - shard * RECORDS_PER_SHARD)
        parts.append(os.path.join(folder, f"{name}.rows"))
        with open(os.path.join(folder, name), "wb") as handle, open(parts[-1], "wb") as rows_file:
            rows, stats, offset = records_table.TableWriter(rows_file, shard), SplitStats("train"), 0
            for index in range(size):
                width, height = SIDES[int(rng.integers(len(SIDES)))]
                objects = None
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
                    corners = [np.asarray(v, np.float32).tolist() for v in (x0, y0, x1, y1)]
                    objects = ObjectValues(labels.tolist(), list(features[record_schema.OBJECT_IS_CROWD]),
                                           [0] * boxes, *corners)
                    ids = labels.tolist()
                else:
                    label = int(rng.integers(len(classes)))
                    counts[label] += 1
                    features.update({record_schema.LABEL: label, record_schema.LABEL_TEXT: classes[label].encode()})
                    ids = [label]
                record = frame_record(serialize_example(features))
                handle.write(record)
                image = features[record_schema.IMAGE_ENCODED]
                rows.add(index, offset, ids, width, height, len(image), bytes(32), int(rng.integers(1 << 63)),
                         features[record_schema.FILENAME].decode())
                stats.add_image(width, height, len(image), b"jpeg", 3, task_name, ids, objects)
                offset += len(record)
            rows.close("train", stats)
        shards.append({"file": name, "num_examples": size, "num_bytes": os.path.getsize(os.path.join(folder, name)),
                       "sha256": ""})
    table_name = record_schema.records_table_filename("train")
    with open(os.path.join(folder, table_name), "wb") as handle:
        opened = [open(part, "rb") for part in parts]
        table = records_table.join_tables(opened, handle, "train")
        for part in opened:
            part.close()
    for part in parts:
        os.remove(part)
    manifest = {"format_version": record_schema.FORMAT_VERSION, "classes": classes, "num_classes": len(classes),
                "task": task_name,
                "splits": {"train": {"num_examples": records, "num_bytes": sum(s["num_bytes"] for s in shards),
                                     "num_shards": len(shards), "label_counts": counts.tolist(),
                                     "num_reencoded": 0, "reencoded_by_reason": {}, "shards": shards,
                                     "records_table": {"file": table_name, "num_rows": table.num_rows,
                                                       "num_bytes": table.num_bytes, "sha256": table.sha256}}},
                "options": {"src": os.path.join(folder, "src")}}
    with open(os.path.join(folder, record_schema.MANIFEST_FILE), "w") as handle:
        json.dump(manifest, handle)
    return folder


def cpu_seconds() -> float:
    """This process's CPU seconds, user and system (its TensorFlow threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(folder: str, scan: bool = False) -> dict:
    """In this process: the report (from the records tables, or by the scan and then its floor, the frames
    read); seconds, CPU seconds and peak RSS (MiB)."""
    import reader  # noqa: F401  (TensorFlow loaded before the baseline memory is taken)
    from reader.tools import report
    from reader.info import dataset_info
    from reader.frames import iter_records

    import matplotlib  # noqa: F401

    info = dataset_info(folder)
    records = sum(split.num_examples for split in info.splits.values())
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    dest = tempfile.mkdtemp(prefix="report-bench-")
    try:
        started, cpu = time.perf_counter(), cpu_seconds()
        report.write_report(folder, dest, scan=scan)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        html_bytes = os.path.getsize(os.path.join(dest, report.HTML_FILE))
        figures_from = json.load(open(os.path.join(dest, report.JSON_FILE)))["figures_from"]
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"records": records, "figures_from": figures_from, "report_s": round(seconds, 3),
              "report_cpu_s": round(cpu, 3), "report_s_per_100k": round(seconds / records * 1e5, 2),
              "peak_rss_mib": round(peak, 1), "rss_after_imports_mib": round(baseline, 1),
              "report_rss_growth_mib": round(peak - baseline, 1), "html_bytes": html_bytes}
    if scan:
        started = time.perf_counter()
        assert records == sum(1 for split in info.splits.values() for shard in split.shards
                              for _ in iter_records(shard.path))
        read_only = time.perf_counter() - started
        result.update({"read_frames_only_s": round(read_only, 3),
                       "read_frames_only_s_per_100k": round(read_only / records * 1e5, 2)})
    return result


def measured_in_own_process(module: str, folder: str, *flags: str) -> dict:
    """``python -m MODULE --measure FOLDER FLAGS...`` in a fresh process (its memory and imports its own): the
    JSON its last line prints."""
    proc = subprocess.run([sys.executable, "-m", module, "--measure", folder, *flags], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO,
                                                               "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode:
        raise RuntimeError(f"measuring {folder} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_results(results: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(results, handle, indent=1)
    print(f"wrote {path}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="records a dataset")
    parser.add_argument("--scan-up-to", type=int, default=100_000,
                        help="also report datasets of up to this many records by the scan of every record")
    parser.add_argument("--tasks", nargs="+", default=["objects", "classification"],
                        choices=["objects", "classification"])
    parser.add_argument("--photo-bytes", type=int, default=0, help="pad each image to about this many bytes")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "imgshards-report-bench"),
                        help="where the synthetic datasets are written (and kept for the next run)")
    parser.add_argument("--json", default=RESULTS, help="where the results go")
    parser.add_argument("--measure", metavar="DATASET", help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--scan", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.scan)))
        return 0
    results = {"records_per_shard": RECORDS_PER_SHARD, "photo_bytes": args.photo_bytes, "cpu": os.cpu_count(),
               "runs": {}}
    for task in args.tasks:
        for size in args.sizes:
            folder = write_dataset(os.path.join(args.work, f"{task}-{size}-{args.photo_bytes}"), size, task,
                                   pad_to=args.photo_bytes)
            results["runs"][f"{task}-{size}"] = measured_in_own_process("bench.report_bench", folder)
            print(f"{task} {size:,}: {json.dumps(results['runs'][f'{task}-{size}'])}", flush=True)
            if size <= args.scan_up_to:
                results["runs"][f"{task}-{size}-scan"] = measured_in_own_process("bench.report_bench", folder,
                                                                                  "--scan")
                print(f"{task} {size:,} scanned: {json.dumps(results['runs'][f'{task}-{size}-scan'])}", flush=True)
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
