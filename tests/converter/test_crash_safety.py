"""A conversion killed with SIGKILL at any moment leaves OUT as it was, or complete.

Real subprocesses are killed at each named fault point (``beam_jobs.faults``)
and at arbitrary times; then the same command is rerun with no manual cleanup
and must give byte-identical shards, with no debris beside OUT.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import record_schema
from beam_jobs import faults
from beam_jobs.files.publish import ConcurrentRunError, output_lock
from tests.conftest import REPO, run_converter
from tests.in_process import cli_in_forked_process

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


def _snapshot(folder) -> dict:
    """name -> bytes of every file in a folder (empty dict if missing)."""
    if not os.path.isdir(folder):
        return {}
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def _assert_old_or_complete(out, before: dict) -> str:
    now = _snapshot(out)
    if now == before:
        return "as before"
    manifest = json.loads(now[record_schema.MANIFEST_FILE])  # no manifest: neither old nor complete
    listed = {s["file"] for split in manifest["splits"].values() for s in split["shards"]}
    shards = {name for name in now if name.endswith(".tfrecord")}
    assert shards == listed, "shards without their manifest, or a manifest without its shards"
    return "complete"


def _command(src, out, shards):
    return ["--src", src, "--out", str(out), "--shards", str(shards), "--overwrite", *FAST]


def _killed_run(args, fault, tmpdir):
    """``python -m converter ARGS`` in a process of its own that kills itself at ``fault``, forked from a server
    that imported Beam once (tests/in_process.py): the point is what the kill leaves, not the interpreter's start,
    which the arbitrary moments below cover."""
    return cli_in_forked_process(args, env={faults.ENV: fault, "TMPDIR": str(tmpdir)})


@pytest.fixture(scope="module")
def reference(demo_src, tmp_path_factory):
    """Shards of an undisturbed run, to compare reruns with."""
    out = tmp_path_factory.mktemp("reference") / "out"
    run_converter(*_command(demo_src, out, 3), check=True)
    return {k: v for k, v in _snapshot(out).items() if k.endswith(".tfrecord")}


@pytest.fixture(scope="module")
def previous(demo_src, tmp_path_factory):
    """A different, complete dataset (2 shards) for a killed run to replace: made once, copied by each test."""
    out = tmp_path_factory.mktemp("previous") / "out"
    run_converter(*_command(demo_src, out, 2), check=True)
    return out


# "displaced" exists only when a dataset is being replaced (by the two-rename fallback).
KILL_CASES = [(p, prev) for p in faults.POINTS for prev in (False, True) if prev or p != "displaced"]


@pytest.mark.parametrize("point,over_a_dataset", KILL_CASES,
                         ids=[f"{p}-{'over-a-dataset' if prev else 'into-nothing'}" for p, prev in KILL_CASES])
def test_sigkill_at_each_point_leaves_out_old_or_complete_and_a_rerun_recovers(
    tmp_path, tmp_path_factory, demo_src, reference, point, over_a_dataset, request
):
    out = tmp_path / "out"
    if over_a_dataset:
        shutil.copytree(request.getfixturevalue("previous"), out)  # a different, complete dataset
    before = _snapshot(out)
    system_tmp = tmp_path_factory.mktemp("system-tmp")
    proc = _killed_run(_command(demo_src, out, 3), f"kill@{point}", system_tmp)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert os.listdir(system_tmp) == []  # the runner's temporary files live in the staging folder
    if point == "displaced":
        # Only the fallback commit (no renameat2 RENAME_EXCHANGE: not Linux) has this window:
        # OUT is missing, the old dataset sits beside it, and the next run puts it back first.
        assert not out.exists()
    else:
        assert _assert_old_or_complete(out, before) == ("complete" if point == "committed" else "as before")

    run_converter(*_command(demo_src, out, 3), check=True)
    assert {k: v for k, v in _snapshot(out).items() if k.endswith(".tfrecord")} == reference
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging, lock or displaced copy left


def test_sigkill_at_arbitrary_moments_of_a_multiprocess_run(tmp_path, demo_src, reference):
    out = tmp_path / "out"
    args = ["--src", demo_src, "--out", str(out), "--shards", "3", "--overwrite", "--no-progress"]
    run_converter(*args[:-2], "--shards", "2", "--no-progress", check=True)
    for delay in (0.3, 1.0, 1.8, 2.6, 3.4):
        before = _snapshot(out)
        proc = subprocess.Popen([sys.executable, "-m", "converter", *args], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": REPO}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its worker processes
        proc.wait()
        _assert_old_or_complete(out, before)
    run_converter(*args, check=True)
    assert {k: v for k, v in _snapshot(out).items() if k.endswith(".tfrecord")} == reference
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_second_conversion_into_the_same_out_fails_while_one_runs(tmp_path, demo_src):
    out = tmp_path / "out"
    with output_lock(str(out)):  # the real lock a running conversion holds
        proc = run_converter("--src", demo_src, "--out", str(out), *FAST)
        with pytest.raises(ConcurrentRunError, match="another conversion is writing"):
            with output_lock(str(out)):
                pass
    assert proc.returncode == 1 and "another conversion is writing" in proc.stderr
    assert not out.exists()


def test_an_input_that_vanishes_after_listing_is_rejected_and_the_run_goes_on(tmp_path, demo_src):
    src = tmp_path / "src"
    shutil.copytree(demo_src, src)
    out = tmp_path / "out"
    # A process of its own forked from one that imported Beam once (tests/in_process.py), waited for by a thread
    # while this one removes a listed file during the pause: the point is the run's listing, not its start-up.
    done: dict = {}
    runner = threading.Thread(target=lambda: done.update(proc=cli_in_forked_process(
        ["--src", str(src), "--out", str(out), *FAST], env={faults.ENV: "sleep:4@listed"})))
    runner.start()
    deadline = time.time() + 60
    while not any(n.startswith(".out.staging-") for n in os.listdir(tmp_path)) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    os.remove(src / "circle" / "circle_0003.jpg")
    runner.join(timeout=300)
    proc = done["proc"]
    assert proc.returncode == 0, proc.stderr
    rejected = [json.loads(line) for line in open(out / record_schema.REJECTED_FILE)]
    # Gone since the listing: rejected as missing (a file listed by a label file but absent gets the same).
    assert rejected[0]["path"] == "circle/circle_0003.jpg" and rejected[0]["reason"] == "missing-file"


def test_out_that_cannot_be_created_is_a_clear_error(tmp_path, demo_src):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = run_converter("--src", demo_src, "--out", str(blocker / "out"), *FAST)
    assert proc.returncode == 1 and str(blocker) in proc.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB file system (tmpfs), to fill up; needs root, as on the project's machines and CI."""
    mount = tmp_path / "small"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_fails_clearly_leaves_the_previous_dataset_and_keeps_the_finished_work(tmp_path, demo_src, small_disk):
    tiny = tmp_path / "tiny"
    for shape in ("circle", "square"):
        (tiny / shape).mkdir(parents=True)
        for name in sorted(os.listdir(os.path.join(demo_src, shape)))[:3]:
            shutil.copy(os.path.join(demo_src, shape, name), tiny / shape / name)
    out = small_disk / "out"
    run_converter("--src", str(tiny), "--out", str(out), "--shards", "2", *FAST, check=True)
    before = _snapshot(out)
    big = tmp_path / "big"
    for copy in range(4):  # ~2.5 MB of images: more than the disk holds
        shutil.copytree(demo_src, big / f"c{copy}", dirs_exist_ok=True)
    proc = run_converter("--src", str(big), "--out", str(out), "--overwrite", *FAST)
    assert proc.returncode == 1
    assert "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
    assert _snapshot(out) == before
    # The finished work stays for the same command to resume once there is room, and the error says where.
    kept = [name for name in os.listdir(small_disk) if name != "out"]
    assert len(kept) == 1 and kept[0].startswith(".out.staging-"), kept
    assert f"Its finished work is kept in {small_disk / kept[0]}" in proc.stderr
