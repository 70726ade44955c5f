"""``python -m bench.update_scale``: an ``--update`` of the same change at two dataset sizes: what follows N.

    python -m bench.update_scale                          # 100k and 1M tiny images, 3,000 changed (~30 min)
    python -m bench.update_scale --sizes 20000,100000     # quicker
    python -m bench.update_scale --sizes 2000,2400 --change 30 --results -   # a smoke run

Issue #59's scale goal: at 1M images an update's cost follows the change, not N, except for listing SRC and
comparing it with the latest version (that comparison must not read unchanged images' bytes: a file's size and
modification time decide), and every process's memory stays flat in N. So each size gets the *same* change, in
count: a third of ``--change`` images added, a third rewritten in place (other bytes, same names), a third
deleted; what grows between the sizes is what follows N. Inputs are the scale benchmark's tiny 8x8 JPEGs
(:func:`bench.scale.make_tiny_jpegs`, 1000 classes), so per-image bookkeeping is what is measured.

Each size: SRC converted with the scale benchmark's flags (``--shards 64 --val-fraction 0.1``, the defaults
otherwise), then changed and updated; both are real processes measured as :func:`bench.scale.measured_run`
measures them (wall, CPU of the process tree, peak RSS of the launcher and of its largest worker). The update
runs under :data:`bench.update._PHASED`, which times its stages (listing, comparison, pipeline, compose, ...).
Reported: per size, both runs and the update's stages; between the sizes, each stage's and the update's growth
per image (us) and each process's memory growth (MB); the update's share of the conversion at each size.
Written to ``bench/results/update_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from bench.scale import make_tiny_jpegs, measured_run
from bench.update import _PHASED

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "update_scale.json")
FLAGS = ["--shards", "64", "--val-fraction", "0.1", "--no-progress"]


def change_tiny(src: str, count: int, seed: int = 1) -> dict:
    """Change SRC (made by ``make_tiny_jpegs``) by ``count`` images: a third rewritten in place with other pixels,
    a third deleted, the rest added as new names; the folder's completion marker removed (it is no longer what
    ``make_tiny_jpegs`` made). What was done, by counts."""
    rng = np.random.default_rng(seed)
    changed = deleted = count // 3
    added = count - changed - deleted
    classes = sorted(name for name in os.listdir(src) if not name.startswith("."))
    # Random images without listing every folder, each folder keeping one image it is not picked for (the
    # converter refuses an empty class folder); more than its folders can give is refused.
    listed: dict[str, list[str]] = {}
    picked: set[str] = set()
    while len(picked) < changed + deleted:
        folder = classes[int(rng.integers(len(classes)))]
        names = listed.setdefault(folder, sorted(os.listdir(os.path.join(src, folder))))
        if len(names) > 1:
            picked.add(os.path.join(folder, names.pop(int(rng.integers(len(names))))))
        elif all(len(listed.get(name, "..")) <= 1 for name in classes):
            raise ValueError(f"{src}: too few images to change {count} and leave one in each class folder")
    doomed = sorted(picked)
    rng.shuffle(doomed)
    pixels = rng.integers(0, 256, size=(changed + added, 8, 8, 3), dtype=np.uint8)
    for image, name in zip(pixels[:changed], doomed[:changed]):
        Image.fromarray(image).save(os.path.join(src, name), quality=90)
    for name in doomed[changed:]:
        os.remove(os.path.join(src, name))
    for number, image in enumerate(pixels[changed:]):
        folder = classes[number % len(classes)]
        Image.fromarray(image).save(os.path.join(src, folder, f"added-{number:06d}.jpg"), quality=90)
    os.remove(os.path.join(src, ".complete"))
    return {"added": added, "changed": changed, "deleted": deleted}


def one_size(work: str, size: int, change: int) -> dict:
    """SRC of ``size`` tiny images converted, changed by ``change`` images and updated: both runs measured."""
    src, out = os.path.join(work, f"tiny-{size}"), os.path.join(work, f"out-{size}")
    make_tiny_jpegs(src, size)
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    base = ["--src", src, "--out", out, *FLAGS]
    converted = measured_run([sys.executable, "-m", "converter", *base], env, REPO)
    done = change_tiny(src, change)
    handle, phases = tempfile.mkstemp(prefix="bench-update-scale-", suffix=".json")
    os.close(handle)
    try:
        updated = measured_run([sys.executable, "-c", _PHASED, *base, "--update"], {**env, "BENCH_PHASES": phases},
                               REPO)
        with open(phases, encoding="utf-8") as stream:
            updated["phases_s"] = json.load(stream)
    finally:
        os.remove(phases)
        shutil.rmtree(out, ignore_errors=True)
    for run in (converted, updated):
        run.pop("watched_mb", None)
    return {"conversion": converted, "update": updated, "changes": done,
            "update_over_conversion": round(updated["seconds"] / converted["seconds"], 3)}


def growth(runs: dict, sizes: Sequence[int]) -> dict:
    """Between the smallest and largest size: the update's and each stage's growth per image (us of wall, and of
    CPU for the update), and each process's peak memory growth (MB) of both runs."""
    small, large = runs[str(sizes[0])], runs[str(sizes[-1])]
    images = sizes[-1] - sizes[0]
    per_image = {"update_wall": (large["update"]["seconds"] - small["update"]["seconds"]) / images * 1e6,
                 "update_cpu": (large["update"]["cpu_seconds"] - small["update"]["cpu_seconds"]) / images * 1e6,
                 "conversion_wall": (large["conversion"]["seconds"] - small["conversion"]["seconds"]) / images * 1e6}
    for stage, seconds in large["update"]["phases_s"].items():
        per_image[f"stage {stage}"] = (seconds - small["update"]["phases_s"].get(stage, 0.0)) / images * 1e6
    memory = {f"{run} {process}": round(large[run][process] - small[run][process], 1)
              for run in ("conversion", "update") for process in ("launcher_mb", "largest_worker_mb")}
    return {"images": images, "per_image_us": {key: round(value, 1) for key, value in per_image.items()},
            "memory_growth_mb": memory}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.update_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="two or more dataset sizes, comma-separated")
    parser.add_argument("--change", type=int, default=3000, help="images changed at every size (a third each: "
                        "added, rewritten, deleted)")
    parser.add_argument("--work", help="folder for the generated images (kept when given; else a temporary one)")
    parser.add_argument("--results", default=RESULTS, help="where to write the JSON ('-': print only)")
    args = parser.parse_args(argv)
    sizes = sorted(int(size) for size in args.sizes.split(","))
    if len(sizes) < 2 or args.change < 3 or args.change >= sizes[0]:
        parser.error("--sizes needs two sizes, and --change at least 3 images and fewer than the smaller size")
    work = args.work or tempfile.mkdtemp(prefix="bench-update-scale-")
    try:
        runs = {}
        for size in sizes:
            runs[str(size)] = one_size(work, size, args.change)
            print(f"{size}: {json.dumps(runs[str(size)])}", file=sys.stderr, flush=True)
        result = {"sizes": sizes, "change": args.change, "runs": runs, "growth": growth(runs, sizes)}
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.results != "-":
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
