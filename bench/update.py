"""``python -m bench.update``: an ``--update`` of a 1% change against the full conversion (issue #59's goal: <= 0.3x of its wall time).

    python -m bench.update                     # 12,000 photos (the issue's size): about half an hour on 2 cores
    python -m bench.update --photos 2000       # a first figure

One run, every command a process of its own as a user runs it (start-up included), on the same photos
(:mod:`bench.data`): the full conversion of SRC, then three updates of 1% each, one after the other:
photos added, photos changed in place (other bytes, same names) and photos deleted, and last an update
that finds nothing changed. Each is timed by wall clock, start-up included; the ratios are to the full
conversion's. The change and the deletion also run, on the same SRC, against a twin of OUT copied after the
addition whose updates compact every shard they touch (``compose.MAX_RUNS = -1`` in that process: no mask
qualifies), so masks and compaction are compared in one run (``changed_compacting``,
``deleted_compacting``; the twin goes first, so the masked update finds the changed photos in the page
cache: 1% of SRC). Written to ``bench/results/update.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from bench.data import make_photo_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "update.json")


# The converter's command with masks off: every shard an update touches is compacted, as before masks.
_COMPACTING = ("import runpy, sys; import beam_jobs.update.compose as compose; compose.MAX_RUNS = -1; "
               "sys.argv = ['converter'] + sys.argv[1:]; runpy.run_module('converter', run_name='__main__')")


def _timed(args: list[str], compacting: bool = False) -> dict:
    """Run ``python -m converter ARGS`` (``compacting``: with masks off): its wall time and first lines. (No CPU
    time: a conversion's worker processes are not its waited-for children, so ``RUSAGE_CHILDREN`` would leave
    them out.)"""
    started = time.perf_counter()
    command = ["-c", _COMPACTING] if compacting else ["-m", "converter"]
    proc = subprocess.run([sys.executable, *command, *args, "--no-progress"], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"converter {' '.join(args)} failed:\n{proc.stderr}")
    return {"wall_s": round(wall, 2), "said": proc.stdout.strip().splitlines()[:4]}


def _images(src: str) -> list[str]:
    return sorted(os.path.join(cls, name) for cls in os.listdir(src) for name in os.listdir(os.path.join(src, cls)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.update", description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=12_000)
    parser.add_argument("--change", type=float, default=0.01, help="the fraction each update changes")
    parser.add_argument("--results", default=RESULTS, help="where to write the JSON ('-': print only)")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-update-")
    try:
        src, out = os.path.join(work, "photos"), os.path.join(work, "out")
        make_photo_dataset(src, args.photos, seed=0)
        flags = ["--src", src, "--out", out, "--val-fraction", "0.1"]
        figures = {"photos": args.photos, "change": args.change, "full": _timed(flags)}
        count = max(1, round(args.photos * args.change))
        rng = random.Random(0)
        extra = os.path.join(work, "extra")
        make_photo_dataset(extra, 2 * count, seed=1)
        fresh = _images(extra)
        for index, name in enumerate(fresh[:count]):  # added: new names
            shutil.copyfile(os.path.join(extra, name), os.path.join(src, os.path.dirname(name), f"new-{index}.jpg"))
        figures["added"] = _timed(flags + ["--update"])
        twin = os.path.join(work, "twin")
        shutil.copytree(out, twin)
        twin_flags = ["--src", src, "--out", twin, "--val-fraction", "0.1", "--update"]
        for old, new in zip(rng.sample(_images(src), count), fresh[count:]):  # changed: other bytes, same names
            shutil.copyfile(os.path.join(extra, new), os.path.join(src, old))
        figures["changed_compacting"] = _timed(twin_flags, compacting=True)
        figures["changed"] = _timed(flags + ["--update"])
        for name in rng.sample(_images(src), count):
            os.remove(os.path.join(src, name))
        figures["deleted_compacting"] = _timed(twin_flags, compacting=True)
        figures["deleted"] = _timed(flags + ["--update"])
        figures["nothing"] = _timed(flags + ["--update"])
        full = figures["full"]
        for case in ("added", "changed", "changed_compacting", "deleted", "deleted_compacting", "nothing"):
            figures[case]["wall_ratio"] = round(figures[case]["wall_s"] / full["wall_s"], 3)
            print(case, figures[case], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.results != "-":
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
