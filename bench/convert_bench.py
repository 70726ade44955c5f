"""Converter benchmark: ``python -m converter`` against the tutorial's plain loop, and the hardware bound.

Both converters run as real subprocesses on the same files, alternating, at two
dataset sizes. Per-image cost is the slope between the sizes (the median of the
rounds' slopes); start-up is what is left at the small size. Peak memory is the largest sum of RSS over the
process tree (the converter's workers are separate processes).

Where the converter's CPU goes, step by step (issue #49 §3)::

    python -m bench.convert_bench steps SRC        # a class-folder tree of images; prints CPU us per image

runs the per-image stages (validation, ordering, shard writing) in this one
process, without Beam, and times each step with the thread's CPU clock.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterator, Optional, Sequence

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _children_cpu() -> float:
    """CPU seconds of every finished child process tree so far (workers are reaped by their launcher)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(command: Sequence[str]) -> tuple[float, int, float, int]:
    """Wall time, peak tree RSS (bytes), CPU seconds and the largest single process's peak RSS (bytes)."""
    from bench.compare import orphans_adopted

    # The converter's forkserver (and the workers forked from it) can outlive the launcher by a moment: as this
    # process's adopted orphans they are waited for, so their CPU counts (else it went to init, unseen). Only
    # for the run: a smoke test runs this in its own process, which goes on to other tests.
    with orphans_adopted():
        return _timed_tree(command)


def _timed_tree(command: Sequence[str]) -> tuple[float, int, float, int]:
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cpu_before = _children_cpu()
    seen: set[int] = set()
    started = time.perf_counter()
    proc = subprocess.Popen(list(command), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(proc.pid)
    peak = largest = 0
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
            seen.update(p.pid for p in tree[1:])
            sizes = [p.memory_info().rss for p in tree if p.is_running()]
            peak, largest = max(peak, sum(sizes)), max([largest] + sizes)
        except psutil.Error:
            pass
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    for pid in seen:  # the run's descendants left behind, now this process's children: their CPU with the run's
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    if proc.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed: {proc.stderr.read().decode()[-2000:]}")
    return elapsed, peak, _children_cpu() - cpu_before, largest


def ours(src: str, out: str, shards: int, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", str(shards), "--no-progress",
            *extra]


def prepare(src: str, out: str, shards: int, in_process: bool = False) -> None:
    """Shards that a reader measurement reads (set-up, not measured): ``python -m converter`` in a process of its
    own; or, for a smoke run, the same job in this process on Beam's in-memory runner (the same shards; a
    converter process's start-up would cost more than its few photos)."""
    if not in_process:
        timed_run(ours(src, out, shards))
        return
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run

    run(ConvertOptions(src=src, out=out, shards=shards), ["--direct_running_mode=in_memory", "--direct_num_workers=1"],
        show_progress=False)


def plain(src: str, out: str, shards: int, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "bench.plain_loop", src, out, "--shards", str(shards), *extra]


def _validate_file(path: str, max_side: Optional[int] = None) -> bool:
    from beam_jobs.options import EncodeOptions
    from beam_jobs.stages.encode import Encoded, encode_image

    with open(path, "rb") as handle:
        return isinstance(encode_image(handle.read(), EncodeOptions(max_side=max_side)), Encoded)


def _max_side(extra: Sequence[str]) -> Optional[int]:
    return int(extra[list(extra).index("--max-side") + 1]) if "--max-side" in extra else None


def hardware_bound(src: str, processes: int, max_side: Optional[int] = None) -> float:
    """Images/s of the per-image work alone (read + validate, and re-encode where needed) on ``processes`` cores."""
    files = [os.path.join(root, name) for root, _, names in os.walk(src) for name in names]
    work = functools.partial(_validate_file, max_side=max_side)
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pool.map(work, files[: processes * 4])  # warm the workers
        started = time.perf_counter()
        accepted = sum(pool.map(work, files, chunksize=16))
        elapsed = time.perf_counter() - started
    assert accepted == len(files)
    return len(files) / elapsed


def bench_converter(small: tuple[str, int], large: tuple[str, int], work: str, rounds: int, shards: int = 8,
                    extra: Sequence[str] = ()) -> dict:
    """Time both converters at both sizes, alternating; returns every measurement and the derived numbers.

    ``extra`` flags go to both tools (``--max-side 256``: both downsize).

    Each round runs one tool at the small then the large size back to back, so
    the pair shares the machine's momentary speed; the per-image cost is the
    median over rounds of (large - small) / (extra images). On a shared machine
    that is far steadier than the difference of two medians taken minutes apart.
    """
    tools = {"ours": ours, "plain_loop": plain}
    times: dict = {tool: {"small": [], "large": []} for tool in tools}
    peaks: dict = {tool: {"small": [], "large": []} for tool in tools}
    largest: dict = {tool: {"small": [], "large": []} for tool in tools}
    cpus: dict = {tool: {"small": [], "large": []} for tool in tools}
    for round_index in range(rounds):
        order = list(tools) if round_index % 2 == 0 else list(reversed(tools))
        for tool in order:
            for size, (src, _) in (("small", small), ("large", large)):
                out = os.path.join(work, f"{tool}-{size}")
                shutil.rmtree(out, ignore_errors=True)
                elapsed, peak, cpu, biggest = timed_run(tools[tool](src, out, shards, extra))
                times[tool][size].append(elapsed)
                largest[tool][size].append(biggest)
                peaks[tool][size].append(peak)
                cpus[tool][size].append(cpu)
                shutil.rmtree(out, ignore_errors=True)
    result: dict = {"sizes": {"small": small[1], "large": large[1]}, "rounds": rounds, "flags": list(extra),
                    "tools": {}}
    more = large[1] - small[1]
    for tool in tools:
        slopes = [(t_large - t_small) / more for t_small, t_large in zip(times[tool]["small"], times[tool]["large"])]
        per_image = statistics.median(slopes)
        cpu_slopes = [(c_large - c_small) / more for c_small, c_large in zip(cpus[tool]["small"], cpus[tool]["large"])]
        t_small, t_large = statistics.median(times[tool]["small"]), statistics.median(times[tool]["large"])
        result["tools"][tool] = {
            "seconds": times[tool],
            "median_seconds": {"small": t_small, "large": t_large},
            "per_image_ms": per_image * 1000,
            "per_image_ms_by_round": [slope * 1000 for slope in slopes],
            "cpu_per_image_ms": statistics.median(cpu_slopes) * 1000,
            "cpu_seconds": cpus[tool],
            "images_per_s": 1 / per_image if per_image > 0 else float("inf"),
            "startup_s": t_small - small[1] * per_image,
            "end_to_end_images_per_s": large[1] / t_large,
            "peak_rss_mb": {size: max(peaks[tool][size]) / 2**20 for size in ("small", "large")},
            "peak_rss_mb_per_1000_more_images": (max(peaks[tool]["large"]) - max(peaks[tool]["small"]))
            / 2**20 / more * 1000,
            "largest_process_peak_rss_mb": {size: max(largest[tool][size]) / 2**20 for size in ("small", "large")},
        }
    ratio = result["tools"]["ours"]["images_per_s"] / result["tools"]["plain_loop"]["images_per_s"]
    result["ratio_ours_over_plain_per_image"] = ratio
    # What the cores allow: the plain loop's CPU per image over ours, times the cores ours can use.
    cpu_ratio = result["tools"]["plain_loop"]["cpu_per_image_ms"] / result["tools"]["ours"]["cpu_per_image_ms"]
    result["ratio_ceiling_all_cores"] = cpu_ratio * (os.cpu_count() or 1)
    result["hardware_bound_images_per_s"] = {
        "all_cores": hardware_bound(large[0], os.cpu_count() or 1, _max_side(extra)),
        "one_core": hardware_bound(large[0], 1, _max_side(extra)),
    }
    return result


# (module, function, step): each call's thread CPU time is added to its step. The writer's and validation's
# SHA-256 are timed through their modules' ``hashlib`` (see _timed_hashlib).
_STEPS = (
    ("beam_jobs.stages.validate", "read_stamped", "validate: read"),
    ("beam_jobs.stages.encode", "_libjpeg_check", "validate: libjpeg check (reduced-scale decode)"),
    ("beam_jobs.stages.perceptual_hash", "of_scaled", "validate: perceptual hash"),
    ("beam_jobs.stages.validate", "encode_image", "validate: encode_image (the check, the hash, headers)"),
    ("beam_jobs.stages.validate_part", "near_records", "validate: near-search records"),
    ("beam_jobs.files.work_records", "write_file", "validate + order: work files written"),
    ("beam_jobs.stages.write", "read_stamped", "write: read"),
    ("beam_jobs.stages.write", "build_example", "write: Example serialized"),
    ("beam_jobs.stages.write", "frame_parts", "write: TFRecord frame (CRC32C)"),
    ("beam_jobs.files.work_records", "decode_accepted", "write: work records decoded"),
)


_SHA_STEPS = ("validate: SHA-256", "write: SHA-256 check (when the stamp cannot tell)")


class _TimedHashlib:
    """A module's ``hashlib`` whose ``sha256`` adds its thread CPU time to a step."""

    def __init__(self, spent: collections.Counter, step: str) -> None:
        self._spent, self._step = spent, step

    def sha256(self, data: bytes = b""):
        started = time.thread_time()
        digest = hashlib.sha256(data)
        self._spent[self._step] += time.thread_time() - started
        return digest

    def __getattr__(self, name: str):
        return getattr(hashlib, name)


@contextlib.contextmanager
def _timed_steps(spent: collections.Counter) -> Iterator[None]:
    """Inside: every function of :data:`_STEPS` adds its thread CPU time to ``spent``; restored on exit."""
    import importlib

    saved = []

    def timed(function, step):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[step] += time.thread_time() - started
        return wrapper

    for module_name, name, step in _STEPS:
        module = importlib.import_module(module_name)
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, timed(getattr(module, name), step))
    for module_name, step in zip(("beam_jobs.stages.validate", "beam_jobs.stages.write"), _SHA_STEPS):
        module = importlib.import_module(module_name)
        saved.append((module, "hashlib", module.hashlib))
        module.hashlib = _TimedHashlib(spent, step)
    try:
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


def step_costs(src: str, part_size: Optional[int] = 125, shards: int = 16) -> dict[str, float]:
    """CPU microseconds per image of each step of converting the class folders of ``src`` (JPEGs stored as they
    are), the stages run one after another in this process as the pipeline runs them on each worker (no Beam;
    the listing, start-up and the exact search left out), the near search at ``--near-distance auto``'s
    distance for this many images. ``part_size`` None: the converter's choice. A stage's ``..., all`` row holds
    its other rows; encode_image holds the libjpeg check and the perceptual hash."""
    from beam_jobs.files import work_layout, work_records
    from beam_jobs.options import DEFAULT_NEAR_DISTANCE, EncodeOptions
    from beam_jobs.planning.shard import plan_shard_counts
    from beam_jobs.stage_records import ImageRef
    from beam_jobs.stages import list_parts, near_groups, near_links, order_bucket, perceptual_hash, validate_part, write
    from beam_jobs.stages.count import SumCounts, bucket_tasks

    classes = sorted(name for name in os.listdir(src) if os.path.isdir(os.path.join(src, name)))
    refs = [ImageRef("train", f"{name}/{file}", label) for label, name in enumerate(classes)
            for file in sorted(os.listdir(os.path.join(src, name)))]
    part_size = part_size or list_parts.choose_part_size(len(refs))
    distance = perceptual_hash.auto_distance(len(refs), DEFAULT_NEAR_DISTANCE)
    spent: collections.Counter = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="convert-steps-") as scratch:
        out = os.path.join(scratch, "out")
        os.makedirs(out)
        layout = work_layout.plan_layout(os.path.join(scratch, "work"), {"train": len(refs)}, part_size,
                                         distance + 1)
        for folder in layout.folders():
            os.makedirs(folder)
        list_parts.write_parts(layout, refs, part_size)
        with _timed_steps(spent):
            started = time.thread_time()
            counts = [validate_part.validate_part(src, layout, part, 0, EncodeOptions())
                      for part in range(layout.num_parts)]
            spent["validate: validate_part, all"] = time.thread_time() - started
            combine = SumCounts()
            totals = combine.extract_output(functools.reduce(combine.add_input, counts, combine.create_accumulator()))
            started = time.thread_time()
            slices: dict = collections.defaultdict(list)
            for task in bucket_tasks(totals, plan_shard_counts({"train": len(refs)}, shards)):
                for shard, _ in order_bucket.order_bucket(layout, task):
                    slices[(task.split, shard, task.num_shards)].append(task.bucket)
            spent["order: order_bucket, all"] = time.thread_time() - started
            started = time.thread_time()
            for near_range in range(layout.near_ranges):
                near_links.find_pairs(layout, near_range, distance)
            spent["search: near, find_pairs"] = time.thread_time() - started
            started = time.thread_time()
            near_groups.group_near(layout, distance, classes)
            spent["search: near, group_near"] = time.thread_time() - started
            started = time.thread_time()
            for (split, index, num_shards), buckets in sorted(slices.items()):
                items = (work_records.decode_accepted(record, split) for bucket in sorted(buckets)
                         for record in work_records.iter_file(layout.slice(split, index, bucket), work_records.ACCEPTED))
                write.write_shard(src, out, split, index, num_shards, items, classes, EncodeOptions(),
                                  work=layout.work)
            spent["write: write_shard, all"] = time.thread_time() - started
    declared = [step for _, _, step in _STEPS] + list(_SHA_STEPS)
    steps = sorted(set(declared) | set(spent),
                   key=lambda step: (*_data_flow(step), declared.index(step) if step in declared else 0))
    return {step: spent[step] / len(refs) * 1e6 for step in steps}


_STAGES = ("validate: ", "validate + order: ", "order: ", "search: ", "write: ")


def _data_flow(step: str) -> tuple[int, bool]:
    """Steps in the order the data meets them: validation, ordering, writing; each stage's total after its steps."""
    return next(i for i, prefix in enumerate(_STAGES) if step.startswith(prefix)), step.endswith(", all")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.convert_bench", description="the converter's CPU per "
                                     "image, step by step (the benchmark itself runs from python -m bench)")
    parser.add_argument("command", choices=["steps"])
    parser.add_argument("src", help="class folders of images, e.g. made by bench.data.make_photo_dataset")
    parser.add_argument("--part-size", type=int, default=125, help="images a part (0: the converter's choice)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.src):
        parser.error(f"SRC {args.src} is not a folder")
    for step, micros in step_costs(args.src, args.part_size or None).items():
        print(f"{step:55s} {micros:8.1f} us/image")
    return 0


if __name__ == "__main__":
    sys.exit(main())
