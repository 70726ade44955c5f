"""``python -m bench.startup``: how much of a small job is start-up, as ratios taken in one run.

    python -m bench.startup                      # 600 demo images, 5 alternating rounds (about 2 minutes)
    python -m bench.startup --images 30 --rounds 1 --photos 2 --json /tmp/startup.json   # a smoke run

Issue #35's targets: converting 600 images takes at most 1.5x one
``python -c "import apache_beam"``, and ``verify`` and ``inspect`` of that
small dataset at most 1.5x one ``python -c "import tensorflow"``, each
measured beside its reference, alternating, and compared by their medians
(absolute times on a shared 2-core machine swing 10x; their ratios do not).
And the other end of the rule that runs small runs in one process (issue #42): 900 photos of
1200-1600 px downsized (``--max-side 256``) with the default rule, forced into one process, and on two
worker processes (``--photos 0`` skips it). At the small end (no target): the 600 images on two worker
processes against the default rule's one process, what the rule saves there.

Where the rule's threshold belongs (issue #49, ``--rule-sizes``): photo sets of 300-500 px around it, each
converted in one process and on two workers, alternating; beside each, the work the rule estimates
(``beam_jobs.runtime.work_size``). Workers pay off where their median is below one process's.
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
RESULTS = os.path.join(REPO, "bench", "results", "startup.json")
TARGETS = {"convert": 1.5, "verify": 1.5, "inspect": 1.5}


def _timed(argv: Sequence[str]) -> float:
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(images: int, rounds: int, work: str) -> dict:
    """Median seconds of each command and the ratios to their references."""
    from converter.demo import write_demo

    src, out = os.path.join(work, "shapes"), os.path.join(work, "shapes-tfrecords")
    write_demo(src, per_class=max(images // 3, 1), seed=1)
    python = sys.executable
    commands = {
        "import apache_beam": [python, "-c", "import apache_beam"],
        "convert": [python, "-m", "converter", "--src", src, "--out", out, "--shards", "8", "--overwrite",
                    "--no-progress"],
        "import tensorflow": [python, "-c", "import tensorflow"],
        "verify": [python, "-m", "converter", "verify", out],
        "inspect": [python, "-m", "converter", "inspect", out],
        "convert, 2 workers": [python, "-m", "converter", "--src", src, "--out", out, "--shards", "8",
                               "--overwrite", "--no-progress", "--direct_num_workers=2"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    if rounds > 1:  # warm the page cache (a one-round smoke run skips it: its round converts before verify reads)
        _timed(commands["convert"])
    for _ in range(rounds):
        for name, argv in commands.items():
            times[name].append(_timed(argv))
    medians = {name: statistics.median(values) for name, values in times.items()}
    reference = {"convert": "import apache_beam", "verify": "import tensorflow", "inspect": "import tensorflow",
                 "convert, 2 workers": "convert"}
    ratios = {name: medians[name] / medians[ref] for name, ref in reference.items()}
    return {"images": 3 * max(images // 3, 1), "rounds": rounds, "median_s": medians, "ratio": ratios,
            "reference": reference, "target": TARGETS,
            "met": {name: ratios[name] <= TARGETS[name] for name in TARGETS}}


def measure_large(photos: int, rounds: int, work: str) -> dict:
    """The other end of the small-run rule (issue #42): ``photos`` photos of 1200-1600 px, ``--max-side 256``,
    converted with the default rule, forced into one process, and forced onto two worker processes."""
    from bench.data import make_photo_dataset

    src, out = os.path.join(work, "photos"), os.path.join(work, "photos-tfrecords")
    make_photo_dataset(src, photos, seed=2, sides=(1200, 1600))
    common = [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", "4", "--overwrite",
              "--no-progress", "--max-side", "256"]
    commands = {"default rule": common,
                "one process": [*common, "--direct_running_mode=in_memory", "--direct_num_workers=1"],
                "2 workers": [*common, "--direct_num_workers=2"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    if rounds > 1:
        _timed(commands["default rule"])  # warm the page cache (a one-round smoke run skips it)
    for _ in range(rounds):
        for name, argv in commands.items():
            times[name].append(_timed(argv))
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"photos": photos, "rounds": rounds, "median_s": medians,
            "default_over_one_process": medians["default rule"] / medians["one process"],
            "default_over_two_workers": medians["default rule"] / medians["2 workers"]}


def measure_rule(sizes: Sequence[int], rounds: int, work: str) -> dict:
    """Each photo set (300-500 px JPEGs) converted in one process and on two workers: medians, the workers' over
    one process's, and the rule's estimate of the work (one core's seconds) and its choice."""
    from bench.data import make_photo_dataset

    from beam_jobs.runtime import work_size

    rows = []
    for size in sizes:
        src, out = os.path.join(work, f"rule-{size}"), os.path.join(work, "rule-out")
        make_photo_dataset(src, size, seed=size)
        common = [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", "4", "--overwrite",
                  "--no-progress"]
        commands = {"one process": [*common, "--direct_running_mode=in_memory", "--direct_num_workers=1"],
                    "2 workers": [*common, "--direct_num_workers=2"]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for index in range(rounds):
            for name in (list(commands) if index % 2 == 0 else list(commands)[::-1]):
                times[name].append(_timed(commands[name]))
        medians = {name: statistics.median(values) for name, values in times.items()}
        estimate = work_size.glance(src)
        rows.append({"photos": size, "median_s": medians, "workers_over_one": medians["2 workers"] / medians["one process"],
                     "estimated_work_s": estimate.seconds() if estimate else None,
                     "rule_chooses_workers": bool(estimate and work_size.wants_workers(estimate))})
        shutil.rmtree(src, ignore_errors=True)
    return {"rounds": rounds, "threshold_s": work_size.WORKERS_FROM_S, "sizes": rows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=RESULTS, help="where to write the results (default: %(default)s)")
    parser.add_argument("--photos", type=int, default=900,
                        help="large photos downsized, the other end of the small-run rule (0: skip)")
    parser.add_argument("--rule-sizes", default="",
                        help="photo sets (e.g. 500,1000,2000,4000) converted in one process and on two workers: where "
                        "the rule's threshold belongs")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="imgshards-startup-")
    try:
        results = measure(args.images, args.rounds, work)
        if args.photos:
            results["large_photos"] = measure_large(args.photos, max(1, min(args.rounds, 3)), work)
        if args.rule_sizes:
            results["rule"] = measure_rule([int(v) for v in args.rule_sizes.split(",")], max(1, min(args.rounds, 3)),
                                           work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    for name, ratio in results["ratio"].items():
        target = f" (target {TARGETS[name]}x: {'met' if results['met'][name] else 'missed'})" if name in TARGETS else ""
        print(f"{name}: {results['median_s'][name]:.2f} s = {ratio:.2f}x {results['reference'][name]}{target}")
    if "large_photos" in results:
        large = results["large_photos"]
        print(f"{large['photos']} large photos, --max-side 256: " + ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in large["median_s"].items()))
    for row in results.get("rule", {}).get("sizes", []):
        print(f"{row['photos']} photos (the rule's estimate {row['estimated_work_s']:.1f} s of work, "
              f"{'workers' if row['rule_chooses_workers'] else 'one process'}): one process "
              f"{row['median_s']['one process']:.2f} s, 2 workers {row['median_s']['2 workers']:.2f} s "
              f"= {row['workers_over_one']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
