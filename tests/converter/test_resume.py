"""A killed or failed conversion resumes: the same command continues from the finished work, to the same bytes.

The run is killed (SIGKILL, no cleanup) at each phase of a conversion cut into
many parts, key buckets and hash ranges; the rerun must say it resumes, redo
less, and publish exactly what an uninterrupted run publishes. A rerun with
other options or other inputs starts afresh, saying why.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil

import pytest

from beam_jobs import faults
from tests.conftest import run_converter
from tests.in_process import cli_in_forked_process

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]
ARGS = ["--shards", "5", "--val-fraction", "0.2", "--part-size", "8", *FAST]


def _stopped_run(*args: str, fault: str):
    """The command in a process of its own that kills or stops itself at ``fault`` (``kill@POINT``,
    ``term@POINT``), forked from a server that imported Beam once (tests/in_process.py): what a resume continues
    from is what the stopped run left, not how its interpreter started."""
    return cli_in_forked_process(list(args), env={faults.ENV: fault})


def _digests(folder) -> dict[str, str]:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder)) if name != "manifest.json"}


@pytest.fixture(scope="module")
def reference(demo_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("resume-reference") / "out"
    run_converter("--src", demo_src, "--out", str(out), *ARGS, check=True)
    return _digests(out)


PHASES = ["listed", "part-validated", "bucket-ordered", "shard-written", "duplicates-found", "pipeline-done"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_run_killed_in_any_phase_resumes_from_its_finished_work_to_the_same_bytes(tmp_path, demo_src, reference,
                                                                                      phase):
    out = tmp_path / "out"
    killed = _stopped_run("--src", demo_src, "--out", str(out), *ARGS, fault=f"kill@{phase}")
    assert killed.returncode == -9 and not out.exists()
    rerun = run_converter("--src", demo_src, "--out", str(out), *ARGS, check=True)
    match = re.search(r"resuming the interrupted run with the same inputs and options: (\d+) of (\d+) parts "
                      r"validated, (\d+) shards written", rerun.stderr)
    assert match, rerun.stderr
    validated, parts, shards = map(int, match.groups())
    assert parts == 12  # 90 images in parts of 8
    if phase != "listed":
        assert validated >= 1
    if phase in ("duplicates-found", "pipeline-done", "shard-written"):
        assert validated == parts
    assert _digests(out) == reference
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing left beside OUT
    # The summary's rate counts the images this run processed, not the ones the killed run had.
    processed = re.search(r"images/s, (\d+) processed by this run; the stopped run it resumed had validated (\d+)\)",
                          rerun.stdout)
    assert processed and int(processed.group(1)) <= 90 and int(processed.group(2)) <= 90, rerun.stdout
    if phase == "listed":  # nothing validated before the kill
        assert processed.group(2) == "0"
    if phase == "pipeline-done":  # every part validated and every shard written before the kill
        assert processed.groups() == ("0", "90")


def test_a_failed_run_keeps_its_finished_work_and_the_same_command_resumes_from_it(tmp_path, demo_src, reference):
    """A worker's error (here injected; a full disk or a lost connection in the field) costs only the rerun's
    remaining work: the failed run says where it kept its work, and the same command continues from it."""
    out = tmp_path / "out"
    failed = run_converter("--src", demo_src, "--out", str(out), *ARGS, env={faults.ENV: "fail@shard-written"})
    assert failed.returncode == 1 and not out.exists(), failed.stderr
    kept = [name for name in os.listdir(tmp_path) if name != "out"]
    assert len(kept) == 1 and kept[0].startswith(".out.staging-"), kept
    assert "injected failure at shard-written" in failed.stderr
    assert f"Its finished work is kept in {tmp_path / kept[0]}: the same command resumes from it" in failed.stderr
    rerun = run_converter("--src", demo_src, "--out", str(out), *ARGS, check=True)
    match = re.search(r"resuming the interrupted run with the same inputs and options: (\d+) of (\d+) parts "
                      r"validated", rerun.stderr)
    assert match and match.group(1) == match.group(2) == "12", rerun.stderr
    assert _digests(out) == reference
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_rerun_with_other_options_or_inputs_starts_afresh_and_says_why(tmp_path, demo_src):
    src = tmp_path / "src"
    shutil.copytree(demo_src, src)
    out = tmp_path / "out"
    _stopped_run("--src", str(src), "--out", str(out), *ARGS, fault="kill@shard-written")
    other = [arg if arg != "5" else "4" for arg in ARGS]
    rerun = run_converter("--src", str(src), "--out", str(out), *other, check=True)
    assert "not resuming the interrupted run" in rerun.stderr and "--shards 5 -> 4" in rerun.stderr
    assert "resuming the interrupted run with" not in rerun.stderr
    assert len([name for name in os.listdir(out) if name.startswith("train-") and name.endswith(".tfrecord")]) == 4

    _stopped_run("--src", str(src), "--out", str(out), "--overwrite", *ARGS, fault="kill@shard-written")
    victim = sorted((src / "circle").iterdir())[0]
    victim.unlink()
    rerun = run_converter("--src", str(src), "--out", str(out), "--overwrite", *ARGS, check=True)
    assert "the listed images changed (90 -> 89 images)" in rerun.stderr
    assert sorted(name for name in os.listdir(tmp_path)) == ["out", "src"]


def test_a_preempted_overwrite_keeps_its_work_beside_the_old_dataset_and_every_command_names_it(
        tmp_path, demo_src, demo_dataset, reference):
    """SIGTERM once a shard is written: the old dataset stays, the work stays beside it; the refusal without
    --overwrite and inspect both name the kept folder, and the same command resumes from it."""
    out = tmp_path / "out"
    shutil.copytree(demo_dataset, out)
    stopped = _stopped_run("--src", demo_src, "--out", str(out), "--overwrite", *ARGS, fault="term@shard-written")
    assert stopped.returncode == 143, stopped.stderr
    kept = [name for name in os.listdir(tmp_path) if name != "out"]
    assert len(kept) == 1 and kept[0].startswith(".out.staging-"), kept
    line = [text for text in stopped.stderr.strip().splitlines() if not text.startswith("progress: ")]
    assert stopped.stderr.strip().splitlines()[-1] == line[-1]  # the stop line is the last
    assert len(line) == 1 and line[0].startswith(f"terminated: nothing was published; {out} is unchanged. Its "
                                                 "finished work (12 of 12 parts validated, ")
    assert f"is kept in {tmp_path / kept[0]}: the same command resumes from it" in line[0]

    refused = run_converter("--src", demo_src, "--out", str(out), *ARGS)
    assert refused.returncode == 1 and "pass --overwrite" in refused.stderr
    assert re.search(r"a stopped run's finished work \(12 of 12 parts validated, \d+ shards? written; [\d.]+ kB, "
                     r"0\.0 h old\) is kept in " + re.escape(str(tmp_path / kept[0])), refused.stderr), refused.stderr
    inspect = run_converter("inspect", str(out), check=True)
    assert f"note: a stopped conversion's finished work is kept in {tmp_path / kept[0]}" in inspect.stdout

    rerun = run_converter("--src", demo_src, "--out", str(out), "--overwrite", *ARGS, check=True)
    assert "resuming the interrupted run" in rerun.stderr
    assert _digests(out) == reference
    assert sorted(os.listdir(tmp_path)) == ["out"]
