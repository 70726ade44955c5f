"""``python -m bench.profile_objects``: where a Beam run's CPU goes on COCO-sized photos, by process and by kind.

    python -m bench.profile_objects --images 3000            # py-spy over the converter's process tree
    python -m bench.profile_objects --images 200 --rate 50   # a quick look

Issue #57 §6: the per-image functions (``python -m bench.convert_bench steps``) account for about 1.2 ms of the
whole tree's 2.1 ms an image; this names the rest. The converter runs as a user runs it (``python -m converter
--src COCO --out OUT --shards 8``, its own choice of workers), and ``py-spy record`` samples every process of its
tree by PID as it appears (the launcher, the forkserver, each worker forked from it: ``py-spy --subprocesses``
does not follow the forkserver's children). Each sample is put in a kind by the innermost frame of ours it
holds (:func:`kind_of`); the shares are of the samples (CPU, ``--idle`` left off), so on a shared machine the
split holds where the seconds do not.

Needs ``py-spy`` on PATH (``pip install py-spy``) and permission to attach to one's own processes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OURS = re.compile(r"\((beam_jobs|record_files|converter|record_schema|reader)[/.]")
# Our functions that only hand work to Beam or to the per-image functions (the DoFns, the pipeline's wiring and
# run): a sample whose innermost frame of ours is one of these is spent in what they call, Beam's or a library's.
WIRING = re.compile(r"\((beam_jobs/transforms\.py|beam_jobs/pipeline/|beam_jobs/runtime/|converter/)")


def kind_of(stack: str) -> str:
    """A sample's kind: ``imports``; ``ours: FILE`` for one whose innermost frame of ours is a per-image (or
    planning, publishing) function's, by its file; ``beam: MODULE`` / ``library: MODULE`` for one spent under our
    wiring or none of ours, by the innermost frame's module (``apache_beam/coders``, ``grpc``, ``threading``)."""
    frames = stack.split(";")
    if any("importlib._bootstrap" in frame for frame in frames):
        return "imports"
    ours = [frame for frame in frames if OURS.search(frame)]
    if ours and not WIRING.search(ours[-1]):
        return "ours: " + ours[-1].rsplit("(", 1)[1].split(":", 1)[0]
    leaf = frames[-1].rsplit("(", 1)[-1].split(":", 1)[0] if frames and "(" in frames[-1] else "?"
    if leaf.startswith("apache_beam/"):
        return "beam: " + "/".join(leaf.split("/")[1:3]).removesuffix(".py")
    if WIRING.search(frames[-1]):
        return "wiring: " + leaf
    return "library: " + leaf.split("/")[0].removesuffix(".py")


def descendants(pid: int) -> list[int]:
    """The PIDs of ``pid``'s process tree below it (from /proc: the parent of each process)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children[parent].append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def thread_ticks(pids: Sequence[int]) -> dict[int, int]:
    """Each thread's CPU so far (utime + stime, in clock ticks) of the processes ``pids``, by its OS id."""
    ticks = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                ticks[int(tid)] = int(fields[11]) + int(fields[12])
            except (OSError, ValueError, IndexError):
                continue
    return ticks


def record_tree(argv: Sequence[str], folder: str, rate: int, env: dict) -> tuple[float, dict[int, str], dict, str]:
    """Run ``argv`` and ``py-spy record --threads`` each process of its tree as it appears (polled every 50 ms)
    into ``folder``; ``(wall seconds, {pid: its raw profile}, {tid: CPU ticks last seen}, the command's output)``.
    The threads' CPU weighs their samples (:func:`shares`): a thread py-spy sees as running while it waits for a
    core (a loaded machine) or spins in a C call counts what it used, not what it was sampled."""
    started = time.perf_counter()
    log = open(os.path.join(folder, "converter.log"), "w+", encoding="utf-8")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    spies: dict[int, subprocess.Popen] = {}
    profiles: dict[int, str] = {}
    ticks: dict[int, int] = {}

    def spy(pid: int) -> None:
        path = os.path.join(folder, f"{pid}.txt")
        profiles[pid] = path
        spies[pid] = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", str(rate), "--format",
                                       "raw", "--threads", "--nonblocking", "-o", path],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    spy(proc.pid)
    while proc.poll() is None:
        tree = [proc.pid, *descendants(proc.pid)]
        for pid in tree[1:]:
            if pid not in spies:
                spy(pid)
        ticks.update(thread_ticks(tree))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    for each in spies.values():
        try:
            each.wait(timeout=30)
        except subprocess.TimeoutExpired:
            each.terminate()
    log.seek(0)
    return wall, profiles, ticks, log.read()


def shares(profiles: dict[int, str], ticks: Optional[dict[int, int]] = None) -> dict:
    """Samples by kind over the whole tree, and by process; with ``ticks`` each thread's samples are weighed to
    its CPU (``cpu_by_kind``, ``cpu_s`` by process), else they count as samples."""
    hz = os.sysconf("SC_CLK_TCK")
    samples: dict[tuple[int, int], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    leaves: collections.Counter[str] = collections.Counter()
    for pid, path in profiles.items():
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                if not count.isdigit():
                    continue
                thread, _, stack = stack.partition(";")
                match = re.match(r"thread \((\d+)\)", thread)
                tid = int(match.group(1)) if match else 0
                samples[pid, tid][kind_of(stack)] += int(count)
                leaves[stack.split(";")[-1]] += int(count)
    by_kind: collections.Counter[str] = collections.Counter()
    cpu_by_kind: collections.Counter[str] = collections.Counter()
    cpu_by_process: collections.Counter[int] = collections.Counter()
    process_kinds: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (pid, tid), counted in samples.items():
        by_kind.update(counted)
        total = sum(counted.values())
        used = (ticks or {}).get(tid, 0) / hz
        for kind, count in counted.items():
            cpu_by_kind[kind] += used * count / total
            process_kinds[pid][kind] += used * count / total
        cpu_by_process[pid] += used
    total, cpu = sum(by_kind.values()) or 1, sum(cpu_by_kind.values()) or 1
    return {"samples": sum(by_kind.values()), "cpu_s": round(sum(cpu_by_kind.values()), 2),
            "by_kind": {kind: round(count / total, 3) for kind, count in by_kind.most_common()},
            "cpu_by_kind": {kind: round(value / cpu, 3) for kind, value in cpu_by_kind.most_common()},
            "cpu_s_by_process": {str(pid): round(value, 2) for pid, value in cpu_by_process.most_common()},
            # each process's CPU by kind, as a share of that process's (the workers' tell the Beam run's cost)
            "cpu_by_process_kind": {str(pid): {kind: round(value / (cpu_by_process[pid] or 1), 3)
                                               for kind, value in process_kinds[pid].most_common(20)}
                                    for pid, _ in cpu_by_process.most_common()},
            "top_leaf_frames": {frame: round(count / total, 3) for frame, count in leaves.most_common(25)}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_objects", description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000, help="COCO-sized photos (made once under --data)")
    parser.add_argument("--rate", type=int, default=100, help="py-spy's samples a second of each process")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "bench-objects-photos"),
                        help="where the photos are made and kept")
    parser.add_argument("--keep", help="a folder to keep the raw profiles in (default: removed)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if shutil.which("py-spy") is None:
        parser.error("py-spy is not on PATH: pip install py-spy")
    from bench.objects import coco_photos

    src = coco_photos(args.images, args.data)
    work = args.keep or tempfile.mkdtemp(prefix="profile-objects-")
    os.makedirs(work, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "converter", "--src", src, "--out", os.path.join(work, "ds"), "--shards", "8",
               "--overwrite", "--no-progress"]
    try:
        wall, profiles, ticks, output = record_tree(command, work, args.rate, env)
        result = {"images": args.images, "wall_s": round(wall, 2), "rate": args.rate, **shares(profiles, ticks)}
    finally:
        shutil.rmtree(os.path.join(work, "ds"), ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(output.strip().splitlines()[-1] if output.strip() else "(no output)")
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
