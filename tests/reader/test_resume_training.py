"""Training killed with SIGKILL mid-epoch and restarted consumes exactly the batches of an uninterrupted run.

Runs ``tests/reader/resumable_training.py``: once through (in this process: the
reference, which nothing kills, needs no TensorFlow of its own), and in
processes of their own once killed after step 11 of 18 (mid second epoch; the last backup
is at step 8) and restarted: forked from one that imported TensorFlow once (tests/reader/forked.py). Each run logs "STEP DIGEST" per step; the batch a step
trained on is its last logged digest (steps redone after the restart log
again). The restart must begin from the backup, not from step 0.
"""

from __future__ import annotations

import re
import signal
import sys
import time

import pytest

from tests.reader import forked

KILL_AFTER = 11  # steps logged before the SIGKILL


def _command(data, backup, log, mode, pipelines=1, slow=0.0) -> list[str]:
    return [sys.executable, "-m", "tests.reader.resumable_training", "--data", data, "--backup", str(backup),
            "--log", str(log), "--mode", mode, "--pipelines", str(pipelines), "--slow", str(slow)]


def _run(command) -> None:
    proc = forked.run(command, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _run_here(command) -> None:
    """``command``'s run in this process (``resumable_training.main``): the same training, one start-up less."""
    from tests.reader import resumable_training

    resumable_training.main(command[command.index("tests.reader.resumable_training") + 1:])


def _steps(log) -> list[tuple[int, int]]:
    return [tuple(int(field) for field in line.split()) for line in log.read_text().splitlines() if line.strip()]


def _backed_up(backup) -> bool:
    """A backup is on disk: Keras's BackupAndRestore's metadata, or the loop's CheckpointManager's index (the
    position file ExactResume writes as training begins is not one)."""
    return (backup / "training_metadata.json").exists() or (backup / "checkpoint").exists()


def _kill_after(command, log, steps: int, backup) -> None:
    """SIGKILL the run once it has logged ``steps`` steps and saved a backup: on 2 cores busy with other tests a
    save can lag the steps (the restart once found none at step 11, and began at step 0)."""
    proc = forked.start(command)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(_steps(log)) >= steps and _backed_up(backup):
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.result().stderr[-3000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.parametrize(("mode", "restart_pipelines"), [("keras", 1), ("loop", 2)],
                         ids=["keras-BackupAndRestore", "checkpoint-loop-restarted-on-2-pipelines"])
@pytest.mark.e2e
def test_a_killed_run_restarts_on_exactly_the_uninterrupted_batches(demo_dataset, tmp_path, mode, restart_pipelines):
    whole = tmp_path / "whole.log"
    _run_here(_command(demo_dataset, tmp_path / "backup-whole", whole, mode))
    expected = _steps(whole)
    assert [step for step, _ in expected] == list(range(18))

    log = tmp_path / "killed.log"
    backup = tmp_path / "backup"
    _kill_after(_command(demo_dataset, backup, log, mode, slow=0.3), log, KILL_AFTER, backup)
    before = _steps(log)
    assert KILL_AFTER <= len(before) < 18
    _run(_command(demo_dataset, backup, log, mode, pipelines=restart_pipelines))
    after = _steps(log)[len(before):]
    assert 0 < after[0][0] <= before[-1][0]  # resumed from the backup: neither from scratch nor past the kill
    consumed = dict(before + after)  # the restart's digest wins for the steps it redid
    assert sorted(consumed.items()) == expected
    assert [step for step, _ in after] == list(range(after[0][0], 18))


def test_exact_resume_refuses_a_restart_on_another_version_naming_the_dataset_it_trained_on(demo_dataset, tmp_path):
    import json

    import keras

    import reader

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    path = tmp_path / "position.json"
    saved = json.loads(reader.position(demo_dataset, "train", 8, 3, 5).to_json())
    assert saved["data_dir"] == demo_dataset
    saved.update(fingerprint="0123456789ab", data_dir="/data/v1")  # taken on v1; restarted on the demo dataset
    path.write_text(json.dumps(saved))
    callback = reader.ExactResume(str(path), demo_dataset, "train", 8, 3, epochs=2)
    callback.set_model(model)
    now = reader.dataset_info(demo_dataset).fingerprint
    with pytest.raises(ValueError, match=re.escape(f"trained on /data/v1 (version 0123456789ab), and {demo_dataset} "
                                                   f"is version {now}")):
        callback.on_train_begin()
    with pytest.raises(ValueError, match=re.escape(f"saved on /data/v1 (version 0123456789ab) and {demo_dataset} is "
                                                   f"version {now}")):
        reader.build_dataset(demo_dataset, "train", 8, seed=3, start=reader.Position(**saved))
    # A copy of the same version elsewhere resumes it (the folder is for messages).
    saved.update(fingerprint=now, data_dir="/elsewhere/copy")
    path.write_text(json.dumps(saved))
    callback.on_train_begin()
    path.write_text(reader.position(demo_dataset, "train", 8, 4, 5).to_json())
    with pytest.raises(ValueError, match="trained with seed=4 and is restarted with seed=3"):
        callback.on_train_begin()


@pytest.mark.e2e
def test_the_keras_recipe_survives_kills_inside_its_backup_saves(demo_dataset, tmp_path):
    """SIGKILL while BackupAndRestore rewrites ``latest.weights.h5`` (a model of a few MB, saved every step):
    without ``double_checkpoint`` the restart dies on the half-written file (3 of 7 kills in the field); with
    it, every restart goes on from the backup before, and training ends at the uninterrupted run's last step."""
    backup, log = tmp_path / "backup", tmp_path / "steps.log"
    weights = backup / "latest.weights.h5"
    command = _command(demo_dataset, backup, log, "keras") + ["--save-freq", "1", "--hidden", "2048",
                                                               "--epochs", "4"]
    for kill in range(3):
        proc = forked.start(command)
        whole = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            size = weights.stat().st_size if weights.exists() else 0
            if whole is None and size and len(_steps(log)) > (kill + 1) * 3:
                whole = size  # a complete backup's size, once this run has saved a few times
            elif whole and 0 <= size < whole * 0.9:  # being rewritten right now
                break
            time.sleep(0.0005)  # a rewrite lasts milliseconds; polling without a pause held a core for the test
        assert proc.poll() is None, f"run {kill} ended before a kill inside a save: {proc.result().stderr[-3000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    _run(command)
    assert _steps(log)[-1][0] == 4 * 9 - 1  # the last step of the uninterrupted run, and no further
