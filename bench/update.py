"""``python -m bench.update``: an ``--update`` of a 1% change against the full conversion (issue #59's goal: <= 0.3x of its wall time).

    python -m bench.update                     # 12,000 photos (the issue's size): ~15 min on 2 loaded cores
    python -m bench.update --photos 2000       # a first figure
    python -m bench.update --reads             # reading after 10 updates of 1% against a fresh conversion:
                                               # ~20 min on 2 loaded cores (making 12,000 photos: ~6)
    python -m bench.update --reads --photos 3000 --rounds 3 --batches 20   # a first figure, a few minutes

One run, every command a process of its own as a user runs it (start-up included), on the same photos
(:mod:`bench.data`): the full conversion of SRC, then three updates of 1% each, one after the other:
photos added, photos changed in place (other bytes, same names) and photos deleted, and last an update
that finds nothing changed. Each is timed by wall clock, start-up included; the ratios are to the full
conversion's. The change and the deletion also run, on the same SRC, against a twin of OUT copied after the
addition whose updates compact every shard they touch (``shard_moves.MAX_RUNS = -1`` in that process: no mask
qualifies), so masks and compaction are compared in one run (``changed_compacting``,
``deleted_compacting``; the twin goes first, so the masked update finds the changed photos in the page
cache: 1% of SRC). Written to ``bench/results/update.json``.

``--reads`` (issue #59's last goal: reading the latest version after 10 updates of 1% each at >= 0.95x a fresh
conversion's read speed): SRC converted, then 10 updates, each a third photos added, a third changed in place,
a third deleted (of SRC as it is then, drawn with a seeded generator); then SRC as it ends converted afresh into
another folder with the same flags. Both are read in this one process by ``reader.build_dataset`` (the training
preset, and the evaluation order, 224 px, batch 64, the train split, warm page cache), alternated in rounds;
the ratio is the median over rounds of the updated version's images/s over the fresh one's in the same round.
Each dataset's shards are described too (files, extents, records per extent, file MB). Written to
``bench/results/update_reads.json``.
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
READS_RESULTS = os.path.join(REPO, "bench", "results", "update_reads.json")


# An update's wall time in parts: each stage of ``beam_jobs.update.launch._run`` wrapped by a timer (the same
# functions, called as the launcher calls them), written as JSON to $BENCH_PHASES at exit. "start-up" is from
# this snippet's first line to the update's entry (imports, the CLI); the stages follow in the order they run.
_PHASED = """
import atexit, json, os, runpy, sys, time
began = time.perf_counter()
from beam_jobs.update import checks, compose, kept_hashes, launch, shard_moves
from beam_jobs.files import version_store
phases = {}
def timed(owner, name, label):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        phases.setdefault('start-up', time.perf_counter() - began)
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - started
    setattr(owner, name, wrapper)
for owner, name, label in ((checks, 'source_plan', 'listing'), (launch, '_compare', 'comparison'),
        (kept_hashes.KeptRecords, 'of', 'kept records'), (launch, '_convert', 'pipeline'),
        (compose, 'compact', 'masks and compaction'), (compose, 'version_manifest', 'compose'),
        (compose, 'write_tables', 'compose'), (compose, 'write_card', 'compose'), (compose, 'write_sources', 'compose'),
        (version_store, 'publish', 'publish')):
    timed(owner, name, label)
def written():
    phases['in process'] = time.perf_counter() - began
    with open(os.environ['BENCH_PHASES'], 'w') as handle:
        json.dump({key: round(value, 2) for key, value in phases.items()}, handle)
atexit.register(written)
if os.environ.get('BENCH_COMPACTING'):  # masks off: every shard an update touches is compacted, as before masks
    shard_moves.MAX_RUNS = -1
sys.argv = ['converter'] + sys.argv[1:]
runpy.run_module('converter', run_name='__main__')
"""


def _timed(args: list[str], compacting: bool = False) -> dict:
    """Run ``python -m converter ARGS`` (``compacting``: with masks off): its wall time, first lines and, for an
    update, its parts (:data:`_PHASED`). (No CPU time: a conversion's worker processes are not its waited-for
    children, so ``RUSAGE_CHILDREN`` would leave them out.)"""
    started = time.perf_counter()
    update = "--update" in args
    env = {**os.environ, "PYTHONPATH": REPO}
    if update:
        handle, phases = tempfile.mkstemp(prefix="bench-update-phases-", suffix=".json")
        os.close(handle)
        env.update(BENCH_PHASES=phases, **({"BENCH_COMPACTING": "1"} if compacting else {}))
        command = ["-c", _PHASED]
    else:
        command = ["-m", "converter"]
    proc = subprocess.run([sys.executable, *command, *args, "--no-progress"], cwd=REPO,
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"converter {' '.join(args)} failed:\n{proc.stderr}")
    timed = {"wall_s": round(wall, 2), "said": proc.stdout.strip().splitlines()[:5]}
    if update:
        with open(phases, encoding="utf-8") as handle:
            timed["phases_s"] = json.load(handle)
        os.remove(phases)
    return timed


def _images(src: str) -> list[str]:
    return sorted(os.path.join(cls, name) for cls in os.listdir(src) for name in os.listdir(os.path.join(src, cls)))


def _convert(flags: list[str], in_process: bool) -> dict:
    """A conversion or update (``flags``), timed: a process of its own, or, for a smoke run, this process on
    Beam's in-memory runner (a converter process's start-up would cost more than a few photos)."""
    if not in_process:
        return _timed(flags)
    from converter import cli

    started = time.perf_counter()
    if cli.main(flags + ["--no-progress", "--direct_running_mode=in_memory", "--direct_num_workers=1"]) != 0:
        raise RuntimeError(f"converter {' '.join(flags)} failed")
    return {"wall_s": round(time.perf_counter() - started, 2)}


def _one_update(src: str, extra: list[str], extra_dir: str, count: int, rng: random.Random, index: int) -> dict:
    """Change SRC by ``count`` photos: a third added (new names), a third changed in place (other bytes), a
    third deleted; the fresh photos taken from ``extra`` (consumed). What was done, by name counts."""
    changed = deleted = count // 3
    added = count - changed - deleted
    images = _images(src)
    doomed = rng.sample(images, changed + deleted)
    for old in doomed[:changed]:
        shutil.copyfile(os.path.join(extra_dir, extra.pop()), os.path.join(src, old))
    for old in doomed[changed:]:
        os.remove(os.path.join(src, old))
    for number in range(added):
        name = extra.pop()
        shutil.copyfile(os.path.join(extra_dir, name),
                        os.path.join(src, os.path.dirname(name), f"update{index}-{number}.jpg"))
    return {"added": added, "changed": changed, "deleted": deleted}


def shard_shape(out: str) -> dict:
    """A dataset's latest version as the reader sees it, per split: files, extents (a masked file's runs),
    records per extent and file MB (min, median, max), the records its files hold that it does not read."""
    import statistics

    import reader

    info = reader.dataset_info(out)
    shape = {}
    for name, split in info.splits.items():
        files = {shard.path: shard for shard in split.shards}
        sizes = [shard.num_bytes / 1e6 for shard in files.values()]
        records = [shard.num_examples for shard in split.shards]
        shape[name] = {
            "files": len(files), "extents": len(split.shards), "records": split.num_examples,
            "records_per_extent": [min(records), statistics.median(records), max(records)],
            "file_mb": [round(min(sizes), 2), round(statistics.median(sizes), 2), round(max(sizes), 2)],
            "files_under_half_median": sum(size < statistics.median(sizes) / 2 for size in sizes),
            "records_masked": sum(shard.records_in_file for shard in files.values()) - split.num_examples}
    return shape


def read_rounds(updated: str, fresh: str, rounds: int, batches: int, batch: int) -> dict:
    """Images/s of ``reader.build_dataset`` over the train split of both datasets, training preset and
    evaluation order, alternated in ``rounds`` (warm page cache); the paired ratios updated/fresh."""
    import reader
    from bench import read_bench

    infos = {"updated": reader.dataset_info(updated), "fresh": reader.dataset_info(fresh)}

    def maker(which: str, training: bool):
        def make():
            dataset = reader.build_dataset(infos[which], "train", batch, read_bench.SIZE, training=training)
            return dataset if training else dataset.repeat()
        return make

    makers = {f"{which}_{mode}": maker(which, mode == "train") for mode in ("train", "eval")
              for which in ("updated", "fresh")}
    measured = read_bench.alternating_rounds(makers, rounds, lambda name: batches)
    return {"batches": batches, "batch": batch, "rounds": rounds,
            "images_per_s": {name: round(numbers["images_per_s"], 1) for name, numbers in measured.items()},
            "samples": {name: [round(value, 1) for value in numbers["samples"]] for name, numbers in measured.items()},
            "ratio_train": round(read_bench.paired_ratio(measured, "updated_train", "fresh_train"), 3),
            "ratio_eval": round(read_bench.paired_ratio(measured, "updated_eval", "fresh_eval"), 3),
            # The same in CPU time (this process's, an image; medians over rounds): fresh / updated, so > 1 is
            # faster as the ratios above are. Steadier than wall time on a shared machine.
            "cpu_ms_per_image": {name: round(numbers["cpu_ms_per_image"], 4) for name, numbers in measured.items()},
            "cpu_samples": {name: [round(value, 4) for value in numbers["cpu_samples"]]
                            for name, numbers in measured.items()},
            "cpu_ratio_train": _cpu_ratio(measured, "train"), "cpu_ratio_eval": _cpu_ratio(measured, "eval")}


def _cpu_ratio(measured: dict, mode: str) -> float:
    """The fresh conversion's CPU an image over the updated version's, median of the rounds' pairs."""
    import statistics

    pairs = zip(measured[f"fresh_{mode}"]["cpu_samples"], measured[f"updated_{mode}"]["cpu_samples"])
    return round(statistics.median(fresh / updated for fresh, updated in pairs), 3)


def bench_reads(work: str, photos: int, change: float, updates: int, rounds: int, batches: int, batch: int,
                in_process: bool) -> dict:
    """SRC converted, updated ``updates`` times by ``change`` of it each (:func:`_one_update`), converted afresh
    as it ends; both read (:func:`read_rounds`) and their shards described (:func:`shard_shape`)."""
    src, out, fresh = (os.path.join(work, name) for name in ("photos", "out", "fresh"))
    make_photo_dataset(src, photos, seed=0)
    flags = ["--val-fraction", "0.1"]
    figures: dict = {"photos": photos, "change": change, "updates": [],
                     "full": _convert(["--src", src, "--out", out, *flags], in_process)}
    count = max(3, round(photos * change))
    extra_dir = os.path.join(work, "extra")
    make_photo_dataset(extra_dir, updates * (count - count // 3), seed=1)
    extra, rng = _images(extra_dir)[::-1], random.Random(0)
    for index in range(updates):
        done = _one_update(src, extra, extra_dir, count, rng, index)
        done.update(_convert(["--src", src, "--out", out, *flags, "--update"], in_process))
        figures["updates"].append(done)
        print("update", index + 1, done, flush=True)
    figures["fresh"] = _convert(["--src", src, "--out", fresh, *flags], in_process)
    figures["shards"] = {"updated": shard_shape(out), "fresh": shard_shape(fresh)}
    print(json.dumps(figures["shards"]), flush=True)
    train = figures["shards"]["fresh"]["train"]["records"]
    figures["reads"] = read_rounds(out, fresh, rounds, batches or max(1, train // batch), batch)
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.update", description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=12_000)
    parser.add_argument("--change", type=float, default=0.01, help="the fraction each update changes")
    parser.add_argument("--results", default=None, help="where to write the JSON ('-': print only; default "
                        "bench/results/update.json, with --reads update_reads.json)")
    parser.add_argument("--reads", action="store_true", help="reading after --updates updates against a fresh conversion")
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5, help="--reads: alternated rounds")
    parser.add_argument("--batches", type=int, default=0, help="--reads: batches a measurement (0: an epoch)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--in-process", action="store_true",
                        help="--reads: convert and update in this process, in memory (a smoke run)")
    parser.add_argument("--work", help="--reads: the folder to make the datasets in, kept (default: a temporary "
                        "one, removed)")
    args = parser.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="bench-update-")
    if args.reads:
        try:
            figures = bench_reads(work, args.photos, args.change, args.updates, args.rounds, args.batches,
                                  args.batch, args.in_process)
        finally:
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)
        return _write(figures, READS_RESULTS if args.results is None else args.results)
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
    return _write(figures, RESULTS if args.results is None else args.results)


def _write(figures: dict, results: str) -> int:
    text = json.dumps(figures, indent=2)
    print(text)
    if results != "-":
        with open(results, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
