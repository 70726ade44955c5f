"""What a mixture with repeat factors costs to build over a large source: ``python -m bench.repeat_factor_build``.

    python -m bench.repeat_factor_build                         # 1M records of objects (minutes to write once)
    python -m bench.repeat_factor_build --records 20000 --json /tmp/rf.json   # a quick look

The source is ``bench.report_bench``'s synthetic dataset (shards of tiny JPEGs, 0-7 boxes an image over COCO's
80 classes, and its records table), kept in ``--work`` for the next run. Each measurement runs in a process of
its own, after ``import reader``: CPU seconds (user and system) and wall seconds of ``reader.mixture(...,
repeat_factor=RepeatFactor())`` (the plan: the class ids read, the factors computed and written to their file),
of ``reader.build_dataset(plan, ...)`` (the pipeline's graph built), and of the order's first batch of records
(64, not decoded: the synthetic images are smaller than their declared sizes),
without repeat factors (the baseline: what any mixture's pipeline costs to build), with the records table
(issue #56 §3: the ``classes`` column), and without it (the manifest's ``records_table``
entry hidden: every record's labels read from the shards, as for a dataset converted before the tables), and
the size of the pipeline's serialized graph. Results: ``bench/results/repeat_factor_build.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Optional, Sequence

from bench.report_bench import cpu_seconds, measured_in_own_process, write_dataset, write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "repeat_factor_build.json")


def measure(folder: str, repeat: bool = True) -> dict:
    """In this process: the plan, the build and the first batch of a one-source mixture with repeat factors (or,
    not ``repeat``, without: the same pipeline's own cost, the baseline)."""
    import reader
    import tensorflow as tf

    timings = {}
    started, cpu = time.perf_counter(), cpu_seconds()
    plan = reader.mixture([(folder, 1)], "train", 64, repeat_factor=reader.RepeatFactor() if repeat else None)
    timings["plan"] = (time.perf_counter() - started, cpu_seconds() - cpu)
    started, cpu = time.perf_counter(), cpu_seconds()
    batches = reader.build_dataset(plan, image_size=224, seed=1, dtype=tf.uint8)
    timings["build"] = (time.perf_counter() - started, cpu_seconds() - cpu)
    graph_bytes = len(batches._as_serialized_graph().numpy())
    # The first batch of the order (the records, not decoded: the synthetic images are smaller than their
    # declared sizes): the factors file read, each record's copies counted for the epoch.
    from reader.mixtures.pipeline import _mixed_records, _present

    records = _mixed_records(plan, [_present(s) for s in plan.sources], 1, lambda: tf.constant(0, tf.int64), 1,
                             (0, plan.batch_size))
    started, cpu = time.perf_counter(), cpu_seconds()
    next(iter(records.batch(plan.batch_size)))
    timings["first_batch"] = (time.perf_counter() - started, cpu_seconds() - cpu)
    result = {f"{name}_{kind}": round(value, 3) for name, (wall, cpu) in timings.items()
              for kind, value in (("s", wall), ("cpu_s", cpu))}
    result.update({"records": plan.sources[0].split.num_examples,
                   "epoch_records": plan.sources[0].factors.epoch_records if repeat else None,
                   "graph_bytes": graph_bytes,
                   "from_table": plan.sources[0].split.records_table is not None,
                   "plan_and_build_cpu_s": round(timings["plan"][1] + timings["build"][1], 3),
                   "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})
    return result


def _without_table(folder: str, work: str) -> str:
    """A view of ``folder`` whose manifest lists no records table (its shards linked, not copied)."""
    view = os.path.join(work, os.path.basename(folder) + "-no-table")
    shutil.rmtree(view, ignore_errors=True)
    os.makedirs(view)
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    for split in manifest["splits"].values():
        split.pop("records_table", None)
        for shard in split["shards"]:
            os.symlink(os.path.join(folder, shard["file"]), os.path.join(view, shard["file"]))
    with open(os.path.join(view, "manifest.json"), "w") as handle:
        json.dump(manifest, handle)
    return view


def _measured_in_own_process(folder: str, repeat: bool = True) -> dict:
    return measured_in_own_process("bench.repeat_factor_build", folder, *([] if repeat else ["--plain"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.repeat_factor_build", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "imgshards-report-bench"),
                        help="where the synthetic dataset is written (and kept: bench.report_bench's too)")
    parser.add_argument("--no-scan", action="store_true", help="leave out the build from the shards' labels")
    parser.add_argument("--json", default=RESULTS)
    parser.add_argument("--measure", metavar="DATASET", help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, not args.plain)))
        return 0
    folder = write_dataset(os.path.join(args.work, f"objects-{args.records}-0"), args.records, "objects")
    results = {"records": args.records, "cpu": os.cpu_count(), "runs": {
        "without_repeat_factors": _measured_in_own_process(folder, repeat=False)}}
    print(f"without repeat factors: {json.dumps(results['runs']['without_repeat_factors'])}", flush=True)
    results["runs"]["table"] = _measured_in_own_process(folder)
    print(f"with the records table: {json.dumps(results['runs']['table'])}", flush=True)
    if not args.no_scan:
        results["runs"]["shards"] = _measured_in_own_process(_without_table(folder, args.work))
        print(f"from the shards' labels: {json.dumps(results['runs']['shards'])}", flush=True)
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
