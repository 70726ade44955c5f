"""``python -m bench.scale``: peak memory per process at two dataset sizes, and speed against a baseline.

    python -m bench.scale                                   # local 100k and 1M, Dask 100k and 400k (about 2 h)
    python -m bench.scale --local 20000,100000 --dask 0     # quicker
    python -m bench.scale --baseline dd024e2                # also run that commit on the same data
    python -m bench.scale --near-off --dask 0 --stages 0    # also the same runs with the near search off

Inputs are distinct tiny JPEGs (8x8, ``DIR/cNNN/NNNNNNN.jpg``, 1000 classes), so
per-image bookkeeping, not pixels, is what the converter spends memory and
time on. Every run is a real subprocess. Memory is each process's peak RSS
(``VmHWM``): the launcher's from ``wait4``, the workers' read from ``/proc``
while they live. Local runner workers are the launcher's children; on Dask
they are the cluster's scheduler and two workers (loopback), started fresh
for each size so their peaks belong to that run. What matters is the growth
between the two sizes, checked against the targets of issue #18.

``--baseline REV`` converts the same data with another commit (a git worktree)
in the same run, alternating: memory of both, and the wall-time ratio, on the
tiny images and on JPEG photos (pass-through). ``--near-off`` converts each size
a second time with ``--near-distance off``, right after the default run: the
defaults' time over that run's is what the near search (hashes, search,
grouping) costs at each size (issue #56 §5: at most 1.1x at 1M).

Every run converts with ``--val-fraction 0.1`` (issue #56's run), so the leak
search has evaluation images to probe with.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np
import psutil
from PIL import Image

from bench import data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "scale.json")
# The run with issue #56's defaults (the near search, the records tables) and with the search off (--near-off).
DEFAULTS_RESULTS = os.path.join(REPO, "bench", "results", "scale_defaults.json")
# Growth from the small to the large size allowed for the launcher and for every worker (issue #18).
TARGET_MB = {"local": 60, "dask": 40}
STAGES = ("list_and_parts", "validate", "order", "write", "reports", "near", "table")


def make_tiny_jpegs(folder: str, count: int, classes: int = 1000, seed: int = 0) -> None:
    """``count`` distinct 8x8 JPEGs; kept when the folder already holds them (generating 1M takes minutes)."""
    marker = os.path.join(folder, ".complete")
    if os.path.exists(marker) and open(marker).read() == str(count):
        return
    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for start in range(0, count, 10_000):
        pixels = rng.integers(0, 256, size=(min(10_000, count - start), 8, 8, 3), dtype=np.uint8)
        for offset, image in enumerate(pixels):
            index = start + offset
            target = os.path.join(folder, f"c{index % classes:03d}")
            if index < classes:
                os.makedirs(target)
            Image.fromarray(image).save(os.path.join(target, f"{index:07d}.jpg"), quality=90)
    with open(marker, "w") as handle:
        handle.write(str(count))


def _peak_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    """User and system CPU of a live process so far (``/proc/PID/stat``), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def measured_run(command: Sequence[str], env: dict, cwd: str, watch: Sequence[int] = ()) -> dict:
    """Run ``command``; its wall time, its peak RSS, its largest descendant's and each watched process's (MB).

    ``cwd`` is the checkout: ``python -m`` puts the working folder first on the import path.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(list(command), env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks: dict[int, int] = {}
    cpu: dict[int, float] = {}  # each process's CPU when last seen (a worker's last 0.2 s before it ends is lost)
    launcher = 0
    while True:
        # The launcher's own high-water mark, not wait4's ru_maxrss: a forked child's maxrss counts its
        # parent's pages until exec, so a benchmark process that had just packed a million-member tar
        # (900 MB) made every launcher look 900 MB. VmHWM starts afresh at exec.
        launcher = max(launcher, _peak_kb(proc.pid))
        own = _cpu_seconds(proc.pid)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        cpu[proc.pid] = own
        for child in _descendants(proc.pid):
            peaks[child] = max(peaks.get(child, 0), _peak_kb(child))
            cpu[child] = max(cpu.get(child, 0.0), _cpu_seconds(child))
        time.sleep(0.2)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} failed: {proc.stderr.read().decode()[-3000:]}")
    # CPU of the launcher (its own, from wait4) and of every descendant seen (forked workers are not all waited
    # for by it): a ratio of two runs' CPU holds on a loaded machine, where their wall times swing by a third.
    cpu[proc.pid] = usage.ru_utime + usage.ru_stime
    return {"seconds": round(elapsed, 1), "cpu_seconds": round(sum(cpu.values()), 1),
            "launcher_mb": round(launcher / 1024, 1),
            "largest_worker_mb": round(max(peaks.values(), default=0) / 1024, 1),
            "watched_mb": {str(pid): round(_peak_kb(pid) / 1024, 1) for pid in watch}}


# What a variant of a run adds to the conversion's flags (``--near-off``).
VARIANT_FLAGS = {"this": (), "baseline": (), "near-off": ("--near-distance", "off")}


def _convert_command(checkout: str, src: str, out: str, extra: Sequence[str]) -> tuple[list[str], dict]:
    env = {**os.environ, "PYTHONPATH": checkout, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", "64", "--no-progress",
               "--val-fraction", "0.1", "--overwrite", *extra]
    return command, env


class DaskCluster:
    """A scheduler and two workers on loopback, started fresh (so their peaks are this run's)."""

    def __init__(self, checkout: str, work: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": checkout}
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        self.procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                        "--no-dashboard"], env=env, cwd=checkout, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)]
        for index in range(2):
            self.procs.append(subprocess.Popen(
                [dask, "worker", self.address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                 "--memory-limit", "0", "--local-directory", os.path.join(work, f"dask-w{index}")],
                env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        import distributed

        with distributed.Client(self.address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def memory_at(runner: str, checkout: str, src: str, out: str, work: str, flags: Sequence[str] = ()) -> dict:
    """One conversion's peaks: launcher, largest local worker, and on Dask the scheduler and each worker."""
    if runner == "local":
        # Worker processes, whatever the size: a small run would otherwise convert in the launcher's process.
        command, env = _convert_command(checkout, src, out, ["--direct_running_mode=multi_processing", *flags])
        return measured_run(command, env, checkout)
    cluster = DaskCluster(checkout, work)
    try:
        command, env = _convert_command(checkout, src, out, ["--runner=dask", *flags,
                                                              f"--dask_client_address={cluster.address}"])
        result = measured_run(command, env, checkout, watch=cluster.pids())
    finally:
        cluster.close()
    watched = list(result.pop("watched_mb").values())
    result["scheduler_mb"], result["largest_worker_mb"] = watched[0], max(watched[1:])
    return result


def growth(small: dict, large: dict) -> dict:
    keys = [key for key in ("launcher_mb", "largest_worker_mb", "scheduler_mb") if key in small]
    return {key: round(large[key] - small[key], 1) for key in keys}


def bench_memory(runner: str, sizes: Sequence[int], checkouts: dict[str, str], work: str) -> dict:
    """Each variant (checkouts' names: ``this``, ``baseline``, ``near-off``) at each size, a size's runs one after
    another (so a ratio between variants is taken under the same load); growth per process and, with
    ``near-off``, the defaults' time over it at each size."""
    result: dict = {"sizes": list(sizes), "target_growth_mb": TARGET_MB[runner]}
    runs: dict[str, dict] = {name: {} for name in checkouts}
    for size in sizes:
        src = os.path.join(work, f"tiny-{size}")
        make_tiny_jpegs(src, size)
        for name, checkout in checkouts.items():
            out = os.path.join(work, f"out-{name}")
            runs[name][size] = memory_at(runner, checkout, src, out, work, VARIANT_FLAGS[name])
            shutil.rmtree(out, ignore_errors=True)
            print(f"{runner} {name} {size}: {runs[name][size]}", file=sys.stderr, flush=True)
    for name, by_size in runs.items():
        result[name] = {"runs": {str(k): v for k, v in by_size.items()},
                        "growth_mb": growth(by_size[sizes[0]], by_size[sizes[-1]])}
    result["within_target"] = all(v <= TARGET_MB[runner] for v in result["this"]["growth_mb"].values())
    if "near-off" in runs:
        result["near_cost"] = {str(size): {key: round(runs["this"][size][key] / runs["near-off"][size][key], 3)
                                           for key in ("seconds", "cpu_seconds")} for size in sizes}
    return result


def bench_speed(checkouts: dict[str, str], work: str, tiny: int, photos: int, rounds: int) -> dict:
    """Wall time of this checkout over the baseline's, alternating, on tiny images and on photos."""
    inputs = {"tiny": os.path.join(work, f"tiny-{tiny}"), "photos": os.path.join(work, f"photos-{photos}")}
    make_tiny_jpegs(inputs["tiny"], tiny)
    if not os.path.exists(inputs["photos"]):
        data.make_photo_dataset(inputs["photos"], photos, seed=5)
    result = {}
    for kind, src in inputs.items():
        times: dict[str, list[float]] = {name: [] for name in checkouts}
        for _ in range(rounds):
            for name, checkout in checkouts.items():
                command, env = _convert_command(checkout, src, os.path.join(work, f"speed-{name}"), [])
                times[name].append(measured_run(command, env, checkout)["seconds"])
        best = {name: min(values) for name, values in times.items()}
        result[kind] = {"images": tiny if kind == "tiny" else photos, "seconds": times,
                        "ratio_this_over_baseline": round(best["this"] / best["baseline"], 3)}
        print(f"speed {kind}: {result[kind]}", file=sys.stderr, flush=True)
    return result


def stage_costs(src: str, work: str, part_size: int = 1 << 14, near: bool = True) -> dict:
    """CPU microseconds per image of each stage, run in this process on ``src`` (no Beam: the stages' own cost).

    What a 1e9-image projection multiplies: each stage's per-image cost, its
    files and its largest in-memory unit (a part, a bucket, a hash range).
    ``near`` False: as ``--near-distance off`` runs them (no hashes, no band records, no search).
    """
    from beam_jobs.options import DEFAULT_NEAR_DISTANCE, EncodeOptions
    from beam_jobs.planning import discover
    from beam_jobs.stages import count, join_tables, list_parts, merge_reports, near_groups, near_links, order_bucket, validate_part
    from beam_jobs.files import work_layout

    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "scratch"))
    os.makedirs(os.path.join(work, "out"))
    costs, clock = {}, time.process_time
    started = clock()
    plan = discover.plan_inputs(discover.list_tree(src, os.path.join(work, "scratch")),
                                scratch=os.path.join(work, "scratch"))
    # The near search at its default distance for this size (auto's choice below 8.4M images: 3 bits, 4 bands).
    layout = work_layout.plan_layout(os.path.join(work, "work"), plan.split_sizes(), part_size,
                                     DEFAULT_NEAR_DISTANCE + 1 if near else 0)
    options = EncodeOptions(perceptual_hash=near)
    list_parts.write_parts(layout, plan.refs, part_size)
    costs["list_and_parts"] = clock() - started
    started = clock()
    totals = count.PartCounts({}, {})
    for part in range(layout.num_parts):
        totals = totals.plus(validate_part.validate_part(src, layout, part, 0, options))
    costs["validate"] = clock() - started
    started, slices = clock(), {}
    for task in count.bucket_tasks(totals, {"train": 64}):
        for shard, records in order_bucket.order_bucket(layout, task):
            slices.setdefault(shard, []).append((task.bucket, records))
    costs["order"] = clock() - started
    started = clock()
    _write_train_shards(src, work, layout, slices, plan.classes, options)
    costs["write"] = clock() - started
    started = clock()
    for hash_range in range(layout.hash_ranges):
        merge_reports.find_duplicates(layout, hash_range, plan.classes)
    merge_reports.merge_rejections(layout, os.path.join(work, "out", "rejected.jsonl"))
    costs["reports"] = clock() - started
    started = clock()
    if near:
        for near_range in range(layout.near_ranges):
            near_links.find_pairs(layout, near_range, DEFAULT_NEAR_DISTANCE)
        near_groups.group_near(layout, DEFAULT_NEAR_DISTANCE, plan.classes)
    costs["near"] = clock() - started
    started = clock()
    join_tables.join_split(layout, os.path.join(work, "out"), "train", 64, len(plan.refs))
    costs["table"] = clock() - started
    images = len(plan.refs)
    work_bytes = sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(layout.work)
                     for name in names)
    result = {"images": images, "part_size": part_size,
              "cpu_us_per_image": {stage: round(seconds / images * 1e6, 1) for stage, seconds in costs.items()},
              "work_bytes_per_image": round(work_bytes / images, 1)}
    shutil.rmtree(work, ignore_errors=True)
    return result


def _write_train_shards(src: str, work: str, layout, slices: dict, classes: Sequence[str], options) -> None:
    """The writer stage of :func:`stage_costs`: 64 train shards from the ordered slices, each with its rows of the
    records table, as the pipeline's writer does."""
    from beam_jobs.files import filesystems, work_records
    from beam_jobs.stages.write import ShardRows, write_shard
    import record_schema

    for shard in range(64):  # each with its rows of the records table, as the pipeline's writer
        items = (work_records.decode_accepted(record, "train") for bucket, _ in sorted(slices.get(shard, []))
                 for record in work_records.iter_file(layout.slice("train", shard, bucket), work_records.ACCEPTED))
        with filesystems.whole_file(layout.table_part("train", shard)) as handle:
            rows = ShardRows(handle, shard, record_schema.TASK_CLASSIFICATION)
            write_shard(src, os.path.join(work, "out"), "train", shard, 64, items, classes, options,
                        work=layout.work, table=rows)
            rows.close("train")


def near_cost_by_stage(src: str, work: str, rounds: int) -> tuple[dict, dict]:
    """:func:`stage_costs` with the near search and without, alternated ``rounds`` times, each stage's least."""
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(rounds):
        for near in (True, False):
            runs[near].append(stage_costs(src, work, near=near))
    least = {}
    for near, measured in runs.items():
        least[near] = dict(measured[0])
        least[near]["cpu_us_per_image"] = {stage: min(run["cpu_us_per_image"][stage] for run in measured)
                                           for stage in measured[0]["cpu_us_per_image"]}
    return least[True], least[False]


def _worktree(rev: str, work: str) -> str:
    folder = os.path.join(work, f"baseline-{rev}")
    if not os.path.exists(folder):
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", folder, rev], check=True,
                       stdout=subprocess.DEVNULL)
    return folder


def format_table(results: dict) -> str:
    """The results as the README quotes them (markdown; ``tests/bench`` checks the README holds it verbatim)."""
    lines = ["| runner | checkout | images | launcher MB | largest worker MB | Dask scheduler MB | seconds |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for runner in ("local", "dask"):
        section = results.get(runner)
        if not section:
            continue
        for name in ("this", "near-off", "baseline"):
            if name not in section:
                continue
            label = {"this": "this", "near-off": "this, near search off"}.get(name, f"before ({results['baseline']})")
            for size, run in section[name]["runs"].items():
                lines.append(f"| {runner} | {label} | {int(size):,} | {run['launcher_mb']:.0f} | "
                             f"{run['largest_worker_mb']:.0f} | {_mb(run.get('scheduler_mb'))} | {run['seconds']:.0f} |")
            growth = section[name]["growth_mb"]
            lines.append(f"| {runner} | {label} | **growth** | **{growth['launcher_mb']:+.0f}** | "
                         f"**{growth['largest_worker_mb']:+.0f}** | {_mb(growth.get('scheduler_mb'), '+')} | |")
    lines.append("")
    for runner in ("local", "dask"):
        if runner in results:
            verdict = "met" if results[runner].get("within_target") else "NOT met"
            lines.append(f"Target ({runner}): growth of at most {results[runner]['target_growth_mb']} MB per process "
                         f"from {results[runner]['sizes'][0]:,} to {results[runner]['sizes'][1]:,} images: {verdict}.")
        if runner in results and "near_cost" in results[runner]:
            ratios = ", ".join(f"{int(size):,} images {ratio['cpu_seconds']:.2f}x CPU ({ratio['seconds']:.2f}x wall)"
                               for size, ratio in results[runner]["near_cost"].items())
            lines.append(f"The defaults' time over the near search off ({runner}): {ratios} (goal: at most 1.1x).")
    for kind, speed in results.get("speed", {}).items():
        lines.append(f"Speed ({kind}, {speed['images']:,} images, best of {len(speed['seconds']['this'])}): "
                     f"this / before = {speed['ratio_this_over_baseline']:.2f}.")
    if "stages" in results:
        measured = results["stages"]["cpu_us_per_image"]
        costs = ", ".join(f"{stage} {measured[stage]}" for stage in STAGES if stage in measured)
        lines.append(f"CPU us per image by stage ({results['stages']['images']:,} tiny images): {costs}; work files "
                     f"{results['stages']['work_bytes_per_image']:.0f} bytes per image.")
    if "stages_near_off" in results:
        on, off = (sum(results[name]["cpu_us_per_image"].values()) for name in ("stages", "stages_near_off"))
        measured = results["stages_near_off"]["cpu_us_per_image"]
        costs = ", ".join(f"{stage} {measured[stage]}" for stage in STAGES if stage in measured)
        lines.append(f"With the near search off, in the same process, alternated: {costs}; the stages' CPU with the "
                     f"search over without it: {on:.0f} / {off:.0f} us = {on / off:.2f}x.")
    return "\n".join(lines) + "\n"


def _mb(value, sign: str = "") -> str:
    return "" if value is None else f"{value:{sign}.0f}"


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part and int(part) > 0]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--local", default="100000,1000000", help="sizes on the local runner, or 0")
    parser.add_argument("--dask", default="100000,400000", help="sizes on a Dask cluster, or 0")
    parser.add_argument("--baseline", default=None, help="a git revision to compare against on the same data")
    parser.add_argument("--speed-tiny", type=int, default=100_000, help="tiny images for the speed ratio")
    parser.add_argument("--speed-photos", type=int, default=2000, help="photos for the speed ratio")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the speed ratio")
    parser.add_argument("--near-off", action="store_true", help="also each size with --near-distance off")
    parser.add_argument("--work", default=None, help="folder for the generated data (kept when given)")
    parser.add_argument("--stages", type=int, default=100_000, help="tiny images for the per-stage costs, or 0")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="imgshards-scale-")
    os.makedirs(work, exist_ok=True)
    checkouts = {"this": REPO}
    if args.near_off:
        checkouts["near-off"] = REPO
    if args.baseline:
        checkouts["baseline"] = _worktree(args.baseline, work)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "baseline": args.baseline}
    try:
        for runner in ("local", "dask"):
            sizes = _sizes(getattr(args, runner))
            if len(sizes) == 2:
                results[runner] = bench_memory(runner, sizes, checkouts, work)
        if args.stages:
            src = os.path.join(work, f"tiny-{args.stages}")
            make_tiny_jpegs(src, args.stages)
            if args.near_off:  # alternated, the least of each stage over the rounds: in one process, load swings less
                results["stages"], results["stages_near_off"] = near_cost_by_stage(src, os.path.join(work, "stages"),
                                                                                   args.rounds)
            else:
                results["stages"] = stage_costs(src, os.path.join(work, "stages"))
            print(f"stages: {results['stages']}", file=sys.stderr, flush=True)
        if args.baseline:
            results["speed"] = bench_speed(checkouts, work, args.speed_tiny, args.speed_photos, args.rounds)
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1, sort_keys=True)
        print(format_table(results), end="")
    finally:
        if args.baseline:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", checkouts["baseline"]], check=False)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
