"""What a new user meets on the first day: the runner they get, typos, a terminal's Ctrl-C, quiet output.

Every test drives ``python -m converter`` in a real subprocess, as a user does.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import record_schema
from tests.conftest import REPO

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


def _manifest(folder):
    with open(os.path.join(folder, record_schema.MANIFEST_FILE), encoding="utf-8") as handle:
        return json.load(handle)


def test_default_run_is_the_multiprocess_fnapi_runner_and_never_starts_prism(tmp_path, demo_src, converter):
    out = tmp_path / "out"
    proc = converter("--src", demo_src, "--out", str(out), "--shards", "2", "-v", "--no-progress", check=True)
    assert "Prism" not in proc.stderr and "prism" not in proc.stderr
    assert "sdk_worker_main" in proc.stderr  # -v shows Beam's own log, so the absence above means something
    import apache_beam

    written_by = _manifest(out)["written_by"]
    workers = os.cpu_count()
    assert written_by == {
        "runner": f"FnApiRunner (multi_processing, {workers} worker{'s' if workers != 1 else ''})",
        "apache_beam": apache_beam.__version__,
    }


def test_explicit_direct_runner_is_pinned_too_and_prism_runs_only_when_named(tmp_path, demo_src, converter):
    out = tmp_path / "out"
    converter("--src", demo_src, "--out", str(out), "--runner=DirectRunner", *FAST, check=True)
    assert _manifest(out)["written_by"]["runner"] == "FnApiRunner (in_memory, 1 worker)"


def test_default_run_prints_only_the_summary_and_no_beam_or_worker_chatter(tmp_path, demo_src, converter):
    proc = converter("--src", demo_src, "--out", str(tmp_path / "out"), "--shards", "2", "--no-progress", check=True)
    assert proc.stderr == ""
    assert proc.stdout.startswith("published ")


@pytest.mark.parametrize(
    ("args", "named", "hint"),
    [
        (["--output", "X"], "--output", "--out"),
        (["--val", "0.2"], "--val", "--val-fraction"),
        (["-shards", "4"], "-shards", "--shards"),
        (["--shard", "4"], "--shard", "--shards"),
        (["--no_such_beam_option=1"], "--no_such_beam_option", None),
        (["stray"], "'stray'", None),
    ],
)
def test_unknown_flags_are_usage_errors_naming_them(tmp_path, demo_src, converter, args, named, hint):
    out = tmp_path / "out"
    proc = converter("--src", demo_src, "--out", str(out), *FAST, *args)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert named in last
    if hint:
        assert f"did you mean {hint}?" in last
    assert not out.exists() and "Traceback" not in proc.stderr


def test_beam_flags_still_pass_through(tmp_path, demo_src, converter):
    converter("--src", demo_src, "--out", str(tmp_path / "out"), *FAST, "--job_name=first-contact",
              "--experiments=use_fake_flag_for_test", check=True)


def _start(args, tmp_path, fault):
    env = {**os.environ, "PYTHONPATH": REPO, "IMGSHARDS_FAULT": fault}
    return subprocess.Popen([sys.executable, "-m", "converter", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _wait_for(pattern, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if glob.glob(pattern):
            return
        time.sleep(0.1)
    raise AssertionError(f"{pattern} never appeared")


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "to_group", "code", "word"),
                         [(signal.SIGINT, True, 130, "interrupted"), (signal.SIGTERM, False, 143, "terminated")])
def test_ctrl_c_and_sigterm_print_one_line_and_leave_nothing_beside_out(tmp_path, demo_src, signum, to_group,
                                                                          code, word):
    """Ctrl-C reaches the terminal's whole process group; timeout/Slurm/Kubernetes send SIGTERM to the launcher."""
    src = tmp_path / "imgs"
    shutil.copytree(demo_src, src)
    out = tmp_path / "imgs-tfrecords"
    proc = _start(["--src", str(src), "--shards", "4", "--no-progress"], tmp_path, "sleep:60@shard-written")
    _wait_for(str(tmp_path / ".imgs-tfrecords.staging-*" / "_work" / "*.tfrecord.json"))
    time.sleep(1)
    started = time.monotonic()
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - started < 20
    assert proc.returncode == code
    assert stderr.strip().splitlines() == [f"{word}: nothing was published; {out} is unchanged"]
    assert sorted(os.listdir(tmp_path)) == ["imgs"]
    # No worker process outlives the launcher.
    time.sleep(1)
    workers = subprocess.run(["pgrep", "-f", "beam_jobs.local_worker"], capture_output=True, text=True).stdout
    assert workers.strip() == ""
