"""A converter killed (SIGKILL: no handler runs) mid-run while it replaces a dataset converted from one of the
layouts #57 added leaves that dataset as it was, byte for byte, and publishes nothing.

OUT holds a dataset converted from Roboflow's flat Pascal VOC export (in this process); a real ``python -m
converter --overwrite`` (a process of its own) then converts CVAT for images with its images under ``dataset/`` into OUT and is killed
once a shard is written (``IMGSHARDS_FAULT=kill@shard-written``, tests/converter/test_crash_safety.py's points).
One small subprocess: the hostile inputs themselves are planned in-process
(tests/beam_jobs/sources/objects/test_damaged_exports_of_the_new_layouts.py).
"""

from __future__ import annotations

import os
import signal

import pytest

from beam_jobs import faults
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from tests.beam_jobs.sources.objects.test_damaged_exports_of_the_new_layouts import cvat_anywhere, roboflow_voc
from tests.in_process import cli_in_forked_process

pytestmark = pytest.mark.e2e  # runs the command line in a subprocess

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _files(folder) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_a_kill_mid_run_over_a_roboflow_voc_dataset_leaves_it_byte_for_byte(tmp_path):
    voc, cvat, out = tmp_path / "animals.voc", tmp_path / "task", tmp_path / "ds"
    roboflow_voc(voc)
    cvat_anywhere(cvat)
    run(ConvertOptions(src=str(voc), out=str(out), shards=1), FAST, show_progress=False)
    before = _files(out)
    # In a process of its own forked from a server that imported Beam once (tests/in_process.py).
    proc = cli_in_forked_process(["--src", str(cvat), "--out", str(out), "--shards", "1", "--overwrite", "--no-progress",
                                  *FAST], env={faults.ENV: "kill@shard-written", "TMPDIR": str(tmp_path)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert _files(out) == before
    leftovers = sorted(name for name in os.listdir(tmp_path) if name not in ("animals.voc", "task", "ds"))
    assert all(name.startswith(".ds.") for name in leftovers), leftovers  # at most its resumable staging
