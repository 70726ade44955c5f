"""SIGINT or SIGTERM at any moment ends a conversion within 10 s: exit 130 or 143, one line, nothing left.

A real ``python -m converter`` replaces a real dataset (``--overwrite``) while
the test sends the signal at every half second from 0.5 to 8 s: while Python
and Beam import, while the local runner starts its workers (where the join of
a worker still starting hung), and while images are validated and shards
written. Ctrl-C is sent to the whole process group, as a terminal does;
SIGTERM too, as Slurm and Kubernetes do. The SIGINT run and the SIGTERM run of
each delay go side by side (each over its own dataset), once with nothing
else of the test running and once with a core kept busy, which moves the
start-up's moments around: 64 runs in the time of 32.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO

DELAYS = [0.5 * step for step in range(1, 17)]  # 0.5 .. 8 s
LIMIT_S = 10.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(scope="module")
def slow_source(tmp_path_factory) -> str:
    """Two classes of 3,000 PNGs each (links to 8 noise images): about 15 s of re-encoding on 2 cores."""
    root = tmp_path_factory.mktemp("signals")
    rng = np.random.default_rng(3)
    originals = []
    for index in range(8):
        path = root / f"original-{index}.png"
        Image.fromarray((rng.random((256, 256, 3)) * 255).astype(np.uint8)).save(path)
        originals.append(path)
    for name in ("a", "b"):
        folder = root / "src" / name
        folder.mkdir(parents=True)
        for index in range(3000):
            os.symlink(originals[index % 8], folder / f"{index:05d}.png")
    return str(root / "src")


@pytest.fixture()
def existing_datasets(tmp_path, demo_dataset) -> dict[int, str]:
    """Per signal, an OUT already holding a dataset that an interrupted ``--overwrite`` must leave as it was."""
    outs = {}
    for signum in SIGNALS:
        out = tmp_path / signal.Signals(signum).name / "out"
        shutil.copytree(demo_dataset, out)
        outs[signum] = str(out)
    return outs


def _fingerprint(folder: str) -> dict:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))}


def _processes_marked(marker: str) -> list[int]:
    """Processes whose environment carries ``marker``: the run's launcher and every worker it started."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture(params=["idle", "other-core-busy"])
def load(request):
    if request.param == "idle":
        yield request.param
        return
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield request.param
    finally:
        burner.kill()
        burner.wait()


def _start(source: str, out: str) -> tuple[subprocess.Popen, str]:
    """A conversion replacing ``out``, in its own process group, its processes marked in their environment."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": REPO, "IMGSHARDS_SIGNAL_TEST": marker}
    proc = subprocess.Popen(
        [sys.executable, "-m", "converter", "--src", source, "--out", out, "--shards", "4", "--overwrite"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, f"IMGSHARDS_SIGNAL_TEST={marker}"


def _stopped(proc: subprocess.Popen, marker: str, signum: int, out: str, sent: float) -> list[str]:
    """What is wrong with how the run stopped after ``signum`` was sent at ``sent``: [] when all is well."""
    exited = None  # the launcher's exit and the end of its output, apart: a straggler holding the pipes shows
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            if exited is None and proc.poll() is not None:
                exited = time.monotonic() - sent
            if time.monotonic() - sent > 30:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return [f"output still open 30 s after the signal (exit after {exited} s)"]
    closed = time.monotonic() - sent
    exited = closed if exited is None else exited
    lines = [line for line in stderr.splitlines() if line.strip()]
    expected = ("interrupted" if signum == signal.SIGINT else "terminated") + \
        f": nothing was published; {out} is unchanged"
    problems = []
    if proc.returncode != 128 + signum or closed > LIMIT_S or lines != [expected] or stdout:
        problems.append(f"exit {proc.returncode} after {exited:.1f} s (output closed after {closed:.1f} s), "
                        f"stdout {stdout!r}, stderr {lines[:5]}")
    if _processes_marked(marker):
        problems.append(f"processes of the run are still alive: {_processes_marked(marker)}")
    return problems


@pytest.mark.slow
def test_a_signal_at_any_moment_ends_the_run_within_10_s_in_one_line_leaving_the_dataset_as_it_was(
        slow_source, existing_datasets, load):
    before = {signum: (_fingerprint(out), sorted(os.listdir(os.path.dirname(out))))
              for signum, out in existing_datasets.items()}
    failures, damaged = [], False
    for delay in DELAYS:
        runs = {signum: _start(slow_source, out) for signum, out in existing_datasets.items()}
        time.sleep(delay)
        sent = {}
        for signum, (proc, _) in runs.items():
            os.killpg(proc.pid, signum)  # the whole group, as a terminal's Ctrl-C and Slurm's SIGTERM do
            sent[signum] = time.monotonic()
        for signum, (proc, marker) in runs.items():
            out, name = existing_datasets[signum], signal.Signals(signum).name
            failures += [f"{name} at {delay} s: {problem}"
                         for problem in _stopped(proc, marker, signum, out, sent[signum])]
            if (_fingerprint(out), sorted(os.listdir(os.path.dirname(out)))) != before[signum]:
                failures.append(f"{name} at {delay} s: left {sorted(os.listdir(os.path.dirname(out)))}, "
                                f"dataset changed: {_fingerprint(out) != before[signum][0]}")
                damaged = True
        if damaged:
            break  # the next runs would start from what this one left
    assert not failures, "\n".join(failures)


LIBRARY_RUN = """
import os, signal, subprocess, sys, threading, time
from beam_jobs.interrupt import Interrupted
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run

src, out, small = sys.argv[1:4]
mine = subprocess.Popen(["sleep", "120"])  # the caller's own process, started before the run
threading.Timer(float(sys.argv[4]), os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    run(ConvertOptions(src=src, out=out, shards=4))
    print("published")
except Interrupted as err:
    print("interrupted", err.exit_status)
time.sleep(9)  # past the reaper's deadline: a run that unwound in time must not take the process down
print("alive", mine.poll() is None)
run(ConvertOptions(src=small, out=out + "-next", shards=2))
print("next run published")
mine.kill()
"""


@pytest.mark.slow
def test_ctrl_c_in_a_notebook_stops_the_run_and_leaves_the_process_its_children_and_the_next_run_alone(
        slow_source, demo_src, tmp_path):
    proc = subprocess.run([sys.executable, "-c", LIBRARY_RUN, slow_source, str(tmp_path / "out"), demo_src, "4"],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.split("\n")[:3] == ["interrupted 130", "alive True", "next run published"], proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["out-next"]
