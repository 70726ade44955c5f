"""What a new user meets on the first day: the runner they get, typos, a terminal's Ctrl-C, quiet output.

Every test drives ``python -m converter``'s command line; those about what reaches the terminal or a log
(stderr left empty, no TensorFlow or worker noise) and about signals run it as a real subprocess, as a user
does; the rest run it in the test process (tests/in_process.py).
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
from tests.conftest import REPO, run_converter_process
from tests.in_process import cli_in_process

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


def _manifest(folder):
    with open(os.path.join(folder, record_schema.MANIFEST_FILE), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.mark.e2e
def test_default_run_is_the_fnapi_runner_in_process_when_small_else_a_worker_per_core_and_never_prism(
        tmp_path, demo_src, converter):
    import apache_beam

    out = tmp_path / "out"
    proc = converter("--src", demo_src, "--out", str(out), "--shards", "2", "-v", "--no-progress", check=True)
    assert "Prism" not in proc.stderr and "prism" not in proc.stderr
    # 90 images: converted in the launcher's process (worker processes would each import Beam first).
    assert _manifest(out)["written_by"] == {"runner": "FnApiRunner (in_memory, 1 worker)",
                                            "apache_beam": apache_beam.__version__}
    converter("--src", demo_src, "--out", str(out), "--shards", "2", "--overwrite", "--direct_num_workers=2",
              check=True)  # the user's choice of workers keeps the worker processes
    assert _manifest(out)["written_by"]["runner"] == "FnApiRunner (multi_processing, 2 workers)"


def test_a_run_with_more_work_than_starting_workers_costs_gets_a_worker_process_per_core():
    """Decided by the work, not the count alone: 900 large photos downsized once ran on one core of two."""
    from beam_jobs.runtime import runners
    from beam_jobs.runtime.runners import Work

    choice = runners.choose_runner([])
    workers = os.cpu_count()
    default = f"FnApiRunner (multi_processing, {workers} worker{'s' if workers != 1 else ''})"
    in_process = "FnApiRunner (in_memory, 1 worker)"
    assert choice.description == default
    small_jpegs = Work(600, 600 * 8_000)  # the demo's shapes: about 1.3 s of work
    large_photos = Work(900, 900 * 350_000, downsizing=True)  # 1200-1600 px photos, --max-side 256: ~23 s
    assert runners.sized_for(choice, small_jpegs).description == in_process
    assert runners.sized_for(choice, large_photos).description == default
    few_large = Work(150, 150 * 350_000, downsizing=True)  # ~3.8 s: less than starting workers costs
    assert runners.sized_for(choice, few_large).description == in_process
    chosen = runners.choose_runner(["--direct_running_mode=multi_processing"])
    assert runners.sized_for(chosen, Work(10, 100)).description == default  # the user's mode is kept


@pytest.mark.e2e
def test_explicit_direct_runner_is_pinned_too_and_prism_runs_only_when_named(tmp_path, demo_src, converter):
    out = tmp_path / "out"
    converter("--src", demo_src, "--out", str(out), "--runner=DirectRunner", *FAST, check=True)
    assert _manifest(out)["written_by"]["runner"] == "FnApiRunner (in_memory, 1 worker)"


@pytest.mark.e2e
def test_default_run_prints_only_the_summary_and_no_beam_or_worker_chatter(tmp_path, demo_src):
    proc = run_converter_process("--src", demo_src, "--out", str(tmp_path / "out"), "--shards", "2", "--no-progress", check=True)
    assert proc.stderr == ""
    assert proc.stdout.startswith("published ")


@pytest.mark.e2e
def test_into_a_log_file_progress_comes_as_lines_and_v_shows_no_beam_chatter(tmp_path, demo_src):
    """``nohup python -m converter ... > log``: the log shows each phase's end; ``-v`` adds our messages and
    Beam's warnings, never its INFO lines (type hints, worker start-up) or the flags the runner passes itself."""
    proc = run_converter_process("--src", demo_src, "--out", str(tmp_path / "out"), "--shards", "2", "-v", check=True)
    lines = proc.stderr.splitlines()
    assert "progress: validate 90/90 (100%) | write 90/90 (100%)" in lines
    assert not [line for line in lines if line.startswith("INFO apache_beam")], proc.stderr
    assert "Discarding unparseable args" not in proc.stderr and "semi_persistent" not in proc.stderr
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
        (["--runner=DirectRuner"], "--runner=DirectRuner", "--runner=DirectRunner"),
    ],
)
@pytest.mark.e2e
def test_unknown_flags_are_usage_errors_naming_them(tmp_path, demo_src, converter, args, named, hint):
    out = tmp_path / "out"
    proc = converter("--src", demo_src, "--out", str(out), *FAST, *args)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert named in last
    if hint:
        assert "did you mean" in last and hint in last.split("did you mean", 1)[1]
    assert not out.exists() and "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_the_python_api_is_as_quiet_as_the_cli_unless_the_callers_logging_asks(tmp_path, demo_src):
    code = ("import logging, sys\n"
            "from beam_jobs.options import ConvertOptions\n"
            "from beam_jobs.pipeline import run\n"
            "if sys.argv[1] == 'info': logging.basicConfig(level=logging.INFO)\n"
            f"run(ConvertOptions(src={demo_src!r}, out=sys.argv[2], shards=2))\n")
    quiet = subprocess.run([sys.executable, "-c", code, "quiet", str(tmp_path / "a")], cwd=REPO, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == ""
    chatty = subprocess.run([sys.executable, "-c", code, "info", str(tmp_path / "b")], cwd=REPO, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert chatty.returncode == 0 and "INFO:apache_beam" in chatty.stderr  # Beam's own lines, as asked


@pytest.mark.e2e
def test_verbose_logs_each_rejection_once_and_the_summary_counts_shards_in_words(tmp_path, demo_src, converter):
    src = tmp_path / "src"
    shutil.copytree(demo_src, src)
    (src / "circle" / "broken.jpg").write_bytes(b"not an image at all")
    # In this process (what -v logs, not how a process's stderr starts: the log-file test above runs a process).
    proc = converter("--src", str(src), "--shards", "1", "-v", *FAST, check=True)
    assert proc.stderr.count("broken.jpg") == 1
    assert "INFO beam_jobs.pipeline.run_notes: rejected circle/broken.jpg (not-an-image): " in proc.stderr
    assert "Worker: " not in proc.stderr  # the runner's copies of worker log records
    assert "train 90 (1 shard)" in proc.stdout


@pytest.mark.e2e
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


@pytest.mark.parametrize(("signum", "to_group", "code", "word"),
                         [(signal.SIGINT, True, 130, "interrupted"), (signal.SIGTERM, False, 143, "terminated"),
                          (signal.SIGHUP, True, 129, "hung up")])
@pytest.mark.e2e
def test_a_stop_prints_one_line_naming_the_finished_work_it_keeps_beside_out(tmp_path, demo_src, signum, to_group,
                                                                              code, word):
    """Ctrl-C reaches the terminal's whole process group; Kubernetes sends SIGTERM to the launcher; a dropped
    ssh session SIGHUP to the group. Once a shard is written, the stop keeps the run's work for the rerun."""
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
    kept = [name for name in os.listdir(tmp_path) if name != "imgs"]
    assert len(kept) == 1 and kept[0].startswith(".imgs-tfrecords.staging-"), kept
    line = [text for text in stderr.strip().splitlines() if not text.startswith("progress: ")]  # heartbeat first
    assert stderr.strip().splitlines()[-1] == line[-1]  # the stop line is the last
    assert len(line) == 1 and line[0].startswith(f"{word}: nothing was published; {out} is unchanged. Its finished "
                                                 "work (1 of 1 parts validated, ")
    assert line[0].endswith(f"is kept in {tmp_path / kept[0]}: the same command resumes from it; deleting that "
                            "folder discards it")
    # No worker process outlives the launcher (its workers share its session; other tests' runs do not).
    time.sleep(1)
    workers = subprocess.run(["pgrep", "-s", str(proc.pid), "-f", "beam_jobs.runtime.local_worker"], capture_output=True,
                             text=True).stdout
    assert workers.strip() == ""


def _tree(root, files):
    for rel, data in files.items():
        path = os.path.join(str(root), *rel.split("/")) if isinstance(rel, str) else os.path.join(os.fsencode(str(root)), *rel.split(b"/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)


@pytest.mark.e2e
def test_a_file_whose_name_is_not_utf8_is_converted_with_its_name_escaped(tmp_path, sample_images, converter):
    from tests.conftest import read_records

    jpeg = sample_images["jpeg_rgb"]
    _tree(tmp_path / "src", {"cat/a.jpg": jpeg, "dog/b.jpg": jpeg, b"cat/caf\xe9.jpg": jpeg, b"dog/\xff.png": b"junk"})
    out = tmp_path / "out"
    converter("--src", str(tmp_path / "src"), "--out", str(out), "--shards", "1", "--max-bad-fraction", "0.5", *FAST,
              check=True)
    names = {row[record_schema.FILENAME] for row in read_records(str(out / record_schema.shard_filename("train", 0, 1)))}
    assert names == {b"cat/a.jpg", b"dog/b.jpg", b"cat/caf\\xe9.jpg"}
    rejected = [json.loads(line) for line in open(out / record_schema.REJECTED_FILE, encoding="utf-8")]
    assert [(r["path"], r["reason"]) for r in rejected] == [("dog/\\xff.png", "not-an-image")]


@pytest.mark.e2e
def test_a_class_folder_whose_name_is_not_utf8_is_an_input_error_naming_it(tmp_path, sample_images, converter):
    _tree(tmp_path / "src", {"cat/a.jpg": sample_images["jpeg_rgb"], b"b\xe4r/b.jpg": sample_images["jpeg_rgb"]})
    proc = converter("--src", str(tmp_path / "src"), "--out", str(tmp_path / "out"), *FAST)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"error: class folder {tmp_path / 'src'}/b\\xe4r has a name that is not valid "
                                   "UTF-8, so it cannot be a class name (class names are stored as text in every "
                                   "record); rename it")


@pytest.mark.e2e
def test_out_inside_src_is_refused_and_the_default_out_sits_beside_a_dot_src(tmp_path, demo_src, converter):
    src = tmp_path / "imgs"
    shutil.copytree(demo_src, src)
    proc = converter("--src", str(src), "--out", str(src / "out"), *FAST)
    assert proc.returncode == 2 and "is inside --src" in proc.stderr and not (src / "out").exists()
    proc = converter("--src", str(src / "circle"), "--out", str(src), *FAST)
    assert proc.returncode == 2 and "is inside --out" in proc.stderr
    # --src . from inside the image folder: the dataset lands beside it, not hidden inside it.
    proc = cli_in_process(["--src", ".", *FAST], cwd=str(src), env={})  # run from the folder, in this process
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["imgs", "imgs-tfrecords"]
    assert sorted(os.listdir(src)) == ["circle", "square", "triangle"]


@pytest.mark.e2e
def test_images_at_the_top_of_src_get_the_layout_expected(tmp_path, sample_images, converter):
    _tree(tmp_path / "src", {"a.jpg": sample_images["jpeg_rgb"], "b.jpg": sample_images["jpeg_rgb"]})
    proc = converter("--src", str(tmp_path / "src"), *FAST)
    assert proc.returncode == 1
    assert "2 files sit at its top level (a.jpg, b.jpg); expected" in proc.stderr


@pytest.mark.e2e
def test_oddities_are_warned_about_on_stderr(tmp_path, demo_src, converter):
    labels = tmp_path / "labels.txt"
    labels.write_text("circle\nsquare\ntriangle\nhexagon\n")
    proc = converter("--src", demo_src, "--out", str(tmp_path / "out"), "--labels", str(labels), *FAST, check=True)
    assert proc.stderr.strip() == "warning: --labels names 1 class with no images: hexagon"
    shutil.copytree(os.path.join(demo_src, "circle"), tmp_path / "one" / "circle")
    proc = converter("--src", str(tmp_path / "one"), "--shards", "2", *FAST)
    assert proc.returncode == 0 and "has a single class (circle)" in proc.stderr


@pytest.mark.e2e
def test_a_dataset_folder_holding_a_user_file_is_named_as_such(tmp_path, demo_src, converter):
    out = tmp_path / "out"
    converter("--src", demo_src, "--out", str(out), *FAST, check=True)
    (out / "notes.txt").write_text("mine")
    proc = converter("--src", demo_src, "--out", str(out), "--overwrite", *FAST)
    assert proc.returncode == 1
    assert "holds a dataset and also 1 files that are not part of it (['notes.txt'])" in proc.stderr
    assert (out / "notes.txt").read_text() == "mine"
    # The report and the card are made from the dataset: a conversion over it replaces them with it.
    (out / "notes.txt").unlink()
    for name in record_schema.REPORT_FILES:
        (out / name).write_text("made by python -m converter report")
    converter("--src", demo_src, "--out", str(out), "--overwrite", *FAST, check=True)
    assert not any((out / name).exists() for name in record_schema.REPORT_FILES)
    assert (out / "croissant.json").exists()


@pytest.mark.e2e
def test_an_unwritable_parent_of_out_is_named_as_the_parent(tmp_path, demo_src, converter):
    mount = tmp_path / "ro"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {proc.stderr.decode().strip()}")
    try:
        result = converter("--src", demo_src, "--out", str(mount / "out"), *FAST)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert result.returncode == 1
    assert f"the folder that holds it, '{mount}', is not writable" in result.stderr


@pytest.mark.e2e
def test_verify_and_inspect_print_no_tensorflow_noise_and_grid_paths_are_checked(demo_dataset, tmp_path, converter):
    proc = run_converter_process("verify", demo_dataset, check=True)
    assert proc.stderr == ""  # what reaches the process's stderr: TensorFlow's C++ start-up lines would
    proc = run_converter_process("inspect", demo_dataset, "--grid", str(tmp_path / "sheet.jpg"), check=True)
    assert proc.stderr == ""
    assert (tmp_path / "sheet.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG, as its name says
    proc = converter("inspect", demo_dataset, "--grid", str(tmp_path / "missing" / "sheet.png"))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (f"error: cannot write the contact sheet {tmp_path / 'missing' / 'sheet.png'}: "
                                   f"the folder {tmp_path / 'missing'} does not exist")


def test_reading_the_image_folder_itself_advises_converting_it(demo_src):
    import reader

    with pytest.raises(reader.DatasetNotFoundError, match=r"looks like a folder of images. Convert it with: "
                                                          r"python -m converter --src .*shapes \(the dataset"):
        reader.dataset_info(demo_src)
