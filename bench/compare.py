"""``python -m bench.compare REV``: this checkout's converter against a git revision's, on the same photos.

    python -m bench.compare 9b497c0                        # 3,000 and 12,000 photos, 3 alternating rounds
    python -m bench.compare HEAD~5 --sizes 600,3000 --rounds 5 --data /tmp/photos   # photos kept for the next run
    python -m bench.compare 9b497c0 --current-flags=--no-near-duplicates   # without a feature REV lacks

REV is checked out into a temporary git worktree (removed afterwards); both
converters run as real subprocesses (``python -m converter ... --shards 16``),
each from its own tree, on the same generated photos (``bench/data.py``: 300-500
px JPEGs, passed through), alternating which goes first round by round. For
each size it reports the medians and the current checkout's time over REV's
(end to end), and per image the median over rounds of the slope between the
smallest and the largest size, with each ratio's spread over the rounds, and
a run's fixed cost (that line at no image: start-up and the pipeline's build).
A ratio above 1 means this checkout is slower. The wall time ends when the
launcher exits; the CPU is the whole process tree's: this process adopts the
orphans a run leaves (a forkserver, workers forked from it or from a zygote)
and waits for them, so their CPU counts too. Absolute times on a shared
machine swing; ratios taken in one run, rounds alternated, do not, and the CPU
swings least.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ("current", "rev")
Timer = Callable[[str, str, str], tuple[float, float]]  # (tree, src, out) -> (wall s, CPU s)


def converter_command(src: str, out: str, shards: int, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", str(shards), "--overwrite",
            "--no-progress", *extra]


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux; elsewhere nothing): a run's forkserver and the
    workers forked from it, orphaned when the launcher exits, become this process's children, so
    :func:`tree_cpu` can wait for them and count their CPU with the run's."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def orphans_adopted() -> Iterator[None]:
    """:func:`adopt_orphans` for the time of a block, then as before: a process that goes on after the run (a
    test's, running a benchmark's smoke run in it) does not adopt the orphans of whatever it runs next."""
    import ctypes

    before = ctypes.c_int(0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before))
    except (OSError, AttributeError):
        pass
    adopt_orphans()
    try:
        yield
    finally:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, before.value)
        except (OSError, AttributeError):
            pass


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


def tree_cpu(before: resource.struct_rusage) -> float:
    """CPU seconds of every child process that ended since ``before``, after waiting for the orphans this process
    adopted (:func:`adopt_orphans`): a run's whole process tree, forkserver and forked workers included. Waits for
    every child, so only for a process whose one child is the run."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def run_converter(tree: str, src: str, out: str, shards: int = 16, extra: Sequence[str] = ()) -> tuple[float, float]:
    """Wall seconds of one conversion by the converter in ``tree`` (until the launcher exits) and the CPU seconds
    of its whole process tree (forked workers included once :func:`adopt_orphans` has run)."""
    env = {**os.environ, "PYTHONPATH": tree, "TF_CPP_MIN_LOG_LEVEL": "3"}  # the tree's packages first
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # not a pipe: forked workers hold it until they end
        proc = subprocess.run(converter_command(src, out, shards, extra), cwd=tree, env=env,
                              stdout=subprocess.DEVNULL, stderr=errors)
        wall = time.perf_counter() - started
        cpu = tree_cpu(usage)
        if proc.returncode != 0:
            errors.seek(0)
            raise RuntimeError(f"the converter in {tree} failed: {errors.read().decode(errors='replace')[-2000:]}")
    return wall, cpu


def measure(trees: dict[str, str], sets: dict[int, str], rounds: int, work: str, timer: Timer) -> dict:
    """Every round's wall and CPU seconds, per tool and size: ``{tool: {size: {"wall": [...], "cpu": [...]}}}``.

    Even rounds run the current checkout first, odd ones REV first; within a round each tool runs its sizes
    back to back, so a slope's two runs share the machine's momentary speed.
    """
    times = {tool: {size: {"wall": [], "cpu": []} for size in sets} for tool in trees}
    for index in range(rounds):
        for tool in (TOOLS if index % 2 == 0 else TOOLS[::-1]):
            for size, src in sorted(sets.items()):
                out = os.path.join(work, f"out-{tool}-{size}")
                wall, cpu = timer(trees[tool], src, out)
                print(f"round {index + 1}: {tool} {size} photos {wall:.2f} s", file=sys.stderr, flush=True)
                shutil.rmtree(out, ignore_errors=True)
                times[tool][size]["wall"].append(wall)
                times[tool][size]["cpu"].append(cpu)
    return times


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else float("nan")


def _spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(times: dict) -> dict:
    """Medians, and the current checkout's over REV's: end to end at each size (the ratio of the medians, and the
    spread of the rounds' own ratios) and per image (each round's slope between the smallest and largest size)."""
    sizes = sorted(times["current"])
    summary: dict = {"sizes": sizes, "end_to_end": {}, "median_s": {}}
    for tool in TOOLS:
        summary["median_s"][tool] = {size: statistics.median(times[tool][size]["wall"]) for size in sizes}
    for size in sizes:
        paired = [c / r for c, r in zip(times["current"][size]["wall"], times["rev"][size]["wall"])]
        summary["end_to_end"][size] = {
            "ratio": summary["median_s"]["current"][size] / summary["median_s"]["rev"][size],
            "rounds": _spread(paired)}
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        slopes = {tool: {kind: [(b - a) / (large - small) * 1000 for a, b in
                                zip(times[tool][small][kind], times[tool][large][kind])] for kind in ("wall", "cpu")}
                  for tool in TOOLS}
        ms = {tool: statistics.median(slopes[tool]["wall"]) for tool in TOOLS}
        summary["per_image"] = {
            "ms": ms, "cpu_ms": {tool: statistics.median(slopes[tool]["cpu"]) for tool in TOOLS},
            "ratio": _ratio(ms["current"], ms["rev"]),  # nan where a slope is noise at or below 0 (sizes too close)
            "rounds": _spread([_ratio(c, r) for c, r in zip(slopes["current"]["wall"], slopes["rev"]["wall"])]),
        }
        # A run's fixed cost: each round's line through its two sizes, at no image (start-up, the pipeline's build).
        summary["fixed_s"] = {tool: {kind: statistics.median(
            a - slope / 1000 * small for a, slope in zip(times[tool][small][kind], slopes[tool][kind]))
            for kind in ("wall", "cpu")} for tool in TOOLS}
    return summary


def report(rev: str, summary: dict) -> str:
    """The summary as lines for the terminal."""
    lines = [f"this checkout over {rev} (above 1: this checkout is slower)"]
    for size in summary["sizes"]:
        e2e, medians = summary["end_to_end"][size], summary["median_s"]
        lines.append(f"  {size} photos end to end: {medians['current'][size]:.2f} s against {medians['rev'][size]:.2f} s"
                     f" = {e2e['ratio']:.2f}x (rounds {e2e['rounds']['min']:.2f}-{e2e['rounds']['max']:.2f})")
    if "per_image" in summary:
        per = summary["per_image"]
        lines.append(f"  per image: {per['ms']['current']:.3f} ms against {per['ms']['rev']:.3f} ms = {per['ratio']:.2f}x"
                     f" (rounds {per['rounds']['min']:.2f}-{per['rounds']['max']:.2f}); CPU "
                     f"{per['cpu_ms']['current']:.3f} against {per['cpu_ms']['rev']:.3f} ms")
        fixed = summary["fixed_s"]
        lines.append(f"  fixed cost a run (at no image): {fixed['current']['wall']:.2f} s against {fixed['rev']['wall']:.2f} s"
                     f"; CPU {fixed['current']['cpu']:.2f} against {fixed['rev']['cpu']:.2f} s")
    return "\n".join(lines)


def add_worktree(rev: str, parent: str) -> str:
    """A detached worktree of ``rev`` under ``parent`` (``git worktree add``); remove it with remove_worktree."""
    path = os.path.join(parent, "wt-" + "".join(c if c.isalnum() else "-" for c in rev))
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "--quiet", path, rev], check=True,
                   stdout=subprocess.DEVNULL)
    return path


def remove_worktree(path: str) -> None:
    subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", path], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def photo_sets(sizes: Sequence[int], folder: str) -> dict[int, str]:
    """The photo folders of each size under ``folder``, made once (a kept ``--data`` folder is reused)."""
    from bench.data import make_photo_dataset

    sets = {}
    for size in sizes:
        path, done = os.path.join(folder, f"photos-{size}"), os.path.join(folder, f"photos-{size}.done")
        if not os.path.exists(done):
            shutil.rmtree(path, ignore_errors=True)
            make_photo_dataset(path, size, seed=size)
            open(done, "w", encoding="utf-8").close()
        sets[size] = path
    return sets


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the git revision to compare against (a commit, tag or branch)")
    parser.add_argument("--sizes", default="3000,12000", help="photo counts, comma-separated (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--data", help="a folder for the photos, kept and reused (default: a temporary one)")
    parser.add_argument("--json", help="write every round's times and the summary here")
    parser.add_argument("--tree", default=REPO,
                        help="the converter's tree measured against REV (default: this checkout; e.g. a copy with a "
                        "change not yet made here)")
    parser.add_argument("--current-flags", default="",
                        help="converter flags for this checkout only, e.g. '--no-near-duplicates' to leave out a "
                        "feature REV lacks (the other flags given go to both)")
    args, extra = parser.parse_known_args(argv)
    try:
        args.sizes = sorted({int(size) for size in args.sizes.split(",") if size.strip()})
    except ValueError:
        parser.error(f"--sizes takes whole numbers, e.g. 3000,12000 (got {args.sizes!r})")
    if not args.sizes or min(args.sizes) < 1 or args.rounds < 1:
        parser.error("--sizes needs at least one positive count and --rounds at least 1")
    args.extra = extra  # further converter flags, given to both (e.g. --max-side 256)
    return args


def main(argv: Optional[Sequence[str]] = None, timer: Optional[Timer] = None) -> int:
    args = parse_args(argv)
    if timer is None:  # real runs: count their forked workers' CPU (never in a caller's process that passed a timer)
        adopt_orphans()
    work = tempfile.mkdtemp(prefix="imgshards-compare-")
    tree = None
    try:
        tree = add_worktree(args.rev, work)
        sets = photo_sets(args.sizes, args.data or work)
        current = os.path.abspath(args.tree)
        own = shlex.split(args.current_flags)
        timer = timer or (lambda tree_, src, out: run_converter(
            tree_, src, out, args.shards, [*args.extra, *(own if tree_ == current else [])]))
        times = measure({"current": current, "rev": tree}, sets, args.rounds, work, timer)
    finally:
        if tree:
            remove_worktree(tree)
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(times)
    print(report(args.rev, summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"rev": args.rev, "rounds": args.rounds, "times": times, "summary": summary}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
