"""``python -m bench.hub``: converting a Hugging Face Parquet dataset against the same photos as class folders.

    python -m bench.hub                                  # the issue #34 targets (about 15 minutes)
    python -m bench.hub --photos 300 --tiny 2000,4000 --rounds 1 --json /tmp/hub.json   # a smoke run

Speed: the same photos (``bench.data``, 300-500 px JPEGs) as class folders and
as the Parquet files ``datasets`` writes for the Hub (ClassLabel names in the
folders' sorted order, so the label ids agree), each converted ``--rounds``
times, alternating; the ratio of the medians, in one run (target: 1.15x).

Memory: Parquet datasets of N tiny JPEGs at two sizes, converted on the local
runner: each process's own peak RSS (launcher, largest worker) and its growth
between the sizes (rows move through files, so it should not follow N).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Optional, Sequence

from bench import data
from bench.scale import REPO, measured_run

RESULTS = os.path.join(REPO, "bench", "results", "hub.json")
TARGET_RATIO = 1.15
TARGET_GROWTH_MB = 60
ROWS_PER_FILE = 20_000  # files of ~500 MB of photos at most, as push_to_hub cuts them


def folders_as_parquet(folder: str, out: str, rows_per_file: int = ROWS_PER_FILE) -> int:
    """The class folders of ``folder`` as ``out/data/train-*.parquet``, written by ``datasets``; rows written."""
    import datasets

    classes = sorted(name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name)))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})

    def rows():
        for label, name in enumerate(classes):
            for file in sorted(os.listdir(os.path.join(folder, name))):
                with open(os.path.join(folder, name, file), "rb") as handle:
                    yield {"image": {"bytes": handle.read(), "path": file}, "label": label}

    dataset = datasets.Dataset.from_generator(rows, features=features, cache_dir=os.path.join(out, ".cache"))
    shards = max(1, -(-len(dataset) // rows_per_file))
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    for index in range(shards):
        dataset.shard(shards, index, contiguous=True).to_parquet(
            os.path.join(out, "data", f"train-{index:05d}-of-{shards:05d}.parquet"))
    shutil.rmtree(os.path.join(out, ".cache"), ignore_errors=True)
    return len(dataset)


def tiny_parquet(out: str, count: int, classes: int = 100) -> None:
    """``count`` distinct 8x8 JPEGs as Hub Parquet, written a file at a time (memory: one file's rows)."""
    import datasets
    import numpy as np
    from PIL import Image

    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=[f"c{i:03d}" for i in range(classes)])})
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    shards = max(1, -(-count // ROWS_PER_FILE))
    for index in range(shards):
        first, last = index * ROWS_PER_FILE, min(count, (index + 1) * ROWS_PER_FILE)

        def rows(first=first, last=last):
            for row in range(first, last):
                pixels = np.frombuffer(row.to_bytes(8, "little") * 24, np.uint8).reshape(8, 8, 3)
                buffer = io.BytesIO()
                Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
                yield {"image": {"bytes": buffer.getvalue(), "path": f"{row:09d}.jpg"}, "label": row % classes}

        part = datasets.Dataset.from_generator(rows, features=features, cache_dir=os.path.join(out, ".cache"))
        part.to_parquet(os.path.join(out, "data", f"train-{index:05d}-of-{shards:05d}.parquet"))
        shutil.rmtree(os.path.join(out, ".cache"), ignore_errors=True)


def _convert(src: str, out: str) -> list[str]:
    return [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", "16", "--overwrite",
            "--no-progress"]


def bench_speed(photos: int, rounds: int, work: str) -> dict:
    folder, hub = os.path.join(work, "photos"), os.path.join(work, "photos-hub")
    data.make_photo_dataset(folder, photos, seed=5)
    folders_as_parquet(folder, hub)
    env = {**os.environ, "PYTHONPATH": REPO}
    times: dict[str, list[float]] = {"class folders": [], "Hub Parquet": []}
    for _ in range(rounds):
        times["class folders"].append(measured_run(_convert(folder, os.path.join(work, "out")), env, REPO)["seconds"])
        times["Hub Parquet"].append(measured_run(_convert(hub, os.path.join(work, "out")), env, REPO)["seconds"])
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["Hub Parquet"] / medians["class folders"]
    return {"photos": photos, "rounds": rounds, "seconds": times, "median_s": medians, "ratio": round(ratio, 3),
            "target": TARGET_RATIO, "met": ratio <= TARGET_RATIO}


def bench_memory(sizes: Sequence[int], work: str) -> dict:
    env = {**os.environ, "PYTHONPATH": REPO}
    rows = {}
    for count in sizes:
        src = os.path.join(work, f"tiny-{count}")
        tiny_parquet(src, count)
        rows[count] = measured_run(_convert(src, os.path.join(work, f"tiny-out-{count}")), env, REPO)
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(os.path.join(work, f"tiny-out-{count}"), ignore_errors=True)
    small, large = rows[min(sizes)], rows[max(sizes)]
    growth = {key: round(large[key] - small[key], 1) for key in ("launcher_mb", "largest_worker_mb")}
    return {"sizes": {str(count): row for count, row in rows.items()}, "growth_mb": growth,
            "target_growth_mb": TARGET_GROWTH_MB, "met": max(growth.values()) <= TARGET_GROWTH_MB}


def format_table(results: dict) -> str:
    speed, lines = results["speed"], []
    lines.append(f"{speed['photos']} photos (300-500 px), {speed['rounds']} alternating rounds, medians: class folders "
                 f"{speed['median_s']['class folders']:.1f} s, Hub Parquet {speed['median_s']['Hub Parquet']:.1f} s: "
                 f"{speed['ratio']:.2f}x (target {TARGET_RATIO}x: {'met' if speed['met'] else 'missed'})")
    memory = results.get("memory")
    if memory:
        for count, row in memory["sizes"].items():
            lines.append(f"{int(count):,} tiny images as Parquet: launcher {row['launcher_mb']} MB, largest worker "
                         f"{row['largest_worker_mb']} MB, {row['seconds']} s")
        lines.append(f"growth: launcher {memory['growth_mb']['launcher_mb']:+} MB, largest worker "
                     f"{memory['growth_mb']['largest_worker_mb']:+} MB (target {TARGET_GROWTH_MB} MB: "
                     f"{'met' if memory['met'] else 'missed'})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hub", description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", default="100000,1000000", help="row counts of the memory runs; '' skips them")
    parser.add_argument("--json", default=RESULTS)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="imgshards-hub-bench-")
    try:
        results = {"speed": bench_speed(args.photos, args.rounds, work)}
        sizes = [int(size) for size in args.tiny.split(",") if size]
        if sizes:
            results["memory"] = bench_memory(sizes, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
