"""Our handler of local workers in Beam's private registry: registered only where Beam is what it was written
for, Beam's own (with a warning naming why) elsewhere; and the forkserver stopped when the run returns."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from apache_beam.portability import python_urns
from apache_beam.runners.portability.fn_api_runner.worker_handlers import SubprocessSdkWorkerHandler
from PIL import Image

from beam_jobs.runtime import worker_handler
from tests.conftest import REPO


@pytest.mark.parametrize("thing", [worker_handler.REGISTRY, *worker_handler.REIMPLEMENTED])
def test_beam_still_holds_what_the_forked_workers_lean_on(thing):
    """Fails by the thing's name when a new Beam moves it: read Beam's new code, carry its change into
    worker_handler / worker_start.ForkedSdkWorker, update REIMPLEMENTED and setup.py's pin."""
    assert thing not in worker_handler.problems(), worker_handler.problems()[thing]


def test_our_handler_is_registered_in_beams_registry():
    assert worker_handler.install()
    assert worker_handler.problems() == {}  # ours in the registry's place counts as the registry expected


@pytest.mark.parametrize("registry, named", [
    ([], "a list, not the dict"),
    ({}, f"its handler of {python_urns.SUBPROCESS_SDK} is None"),
    ({python_urns.SUBPROCESS_SDK: (SubprocessSdkWorkerHandler, str)}, "not (SubprocessSdkWorkerHandler, bytes)"),
])
def test_a_registry_not_as_expected_keeps_beams_handler_and_warns_naming_why(registry, named, caplog):
    before = registry.copy()
    with caplog.at_level(logging.WARNING, logger="beam_jobs.runtime.worker_handler"):
        assert not worker_handler.install(registry)
    assert registry == before  # nothing registered: Beam's handler starts the workers as commands
    (record,) = caplog.records
    assert worker_handler.REGISTRY in record.getMessage() and named in record.getMessage()
    assert "apache-beam" in record.getMessage()  # which Beam it found


def test_a_registry_as_expected_gets_our_handler():
    registry = {python_urns.SUBPROCESS_SDK: (SubprocessSdkWorkerHandler, bytes)}
    assert worker_handler.install(registry)
    assert registry[python_urns.SUBPROCESS_SDK] == (worker_handler.ForkedOrSubprocessHandler, bytes)


_CONVERT = """
import json, multiprocessing.forkserver, os, sys
from beam_jobs import pipeline
from beam_jobs.options import ConvertOptions
from beam_jobs.runtime import worker_start
worker_start.start_early()
pid = worker_start._started_pid
pipeline.run(ConvertOptions(src=sys.argv[1], out=sys.argv[2], shards=1), ["--direct_num_workers=2"],
             show_progress=False)
runner = json.load(open(os.path.join(sys.argv[2], "manifest.json")))["written_by"]["runner"]
gone = not os.path.exists(f"/proc/{pid}")
print(pid is not None, "multi_processing" in runner, worker_start.running(), gone,
      multiprocessing.forkserver._forkserver._forkserver_pid)
"""


@pytest.mark.e2e
def test_the_forkserver_is_stopped_when_the_run_returns(tmp_path):
    """A notebook's kernel that converts must not keep a process with Beam loaded for its life."""
    src = tmp_path / "src"
    for cls in ("a", "b"):
        os.makedirs(src / cls)
        for index in range(3):
            Image.new("RGB", (16, 12), (40 * index, 90, 0)).save(src / cls / f"{index}.jpg")
    out = tmp_path / "result.txt"
    with open(out, "w") as handle:  # a file, not a pipe: a forkserver left running would hold a pipe open
        subprocess.run([sys.executable, "-c", _CONVERT, str(src), str(tmp_path / "out")], cwd=REPO, stdout=handle,
                       timeout=300, check=True)
    assert out.read_text().split() == ["True", "True", "False", "True", "None"]
