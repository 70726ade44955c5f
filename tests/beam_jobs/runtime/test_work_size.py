"""The work estimate before any plan (work_size.glance), and the forkserver started only for runs that use workers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from beam_jobs.runtime import work_size
from tests.conftest import REPO


def _tree(root, files: int, size: int) -> str:
    """``files`` files of ``size`` bytes in two folders (sparse: only their size is looked at)."""
    os.makedirs(root / "a" / "b")
    for index in range(files):
        with open(root / ("a" if index % 2 else "a/b") / f"{index}.jpg", "wb") as handle:
            handle.truncate(size)
    return str(root)


def test_a_small_folder_is_weighed_whole_and_stays_in_one_process(tmp_path):
    work = work_size.glance(_tree(tmp_path, 10, 1000))
    assert work == work_size.Work(10, 10_000)
    assert not work_size.wants_workers(work)


def test_a_glance_stops_once_the_work_pays_for_workers(tmp_path):
    big = 40_000_000  # 40 MB at 35 MB/s: past 1 s each, so the glance stops after a handful of files
    work = work_size.glance(_tree(tmp_path, 12, big))
    assert work_size.wants_workers(work) and work.images < 12
    assert work_size.glance(str(tmp_path), downsizing=True).images < work.images  # decoding: fewer images pay


def test_what_a_glance_cannot_weigh_is_none(tmp_path):
    (tmp_path / "train.tar").write_bytes(b"")
    assert work_size.glance(str(tmp_path)) is None  # an archive: its images are not counted by their size
    assert work_size.glance(str(tmp_path / "train.tar")) is None
    assert work_size.glance("s3://bucket/photos") is None
    assert work_size.glance(str(tmp_path / "missing")) is None


def test_a_tree_past_the_glances_budget_is_not_weighed(tmp_path):
    src = _tree(tmp_path, 30, 10)  # 30 files and 2 folders: tiny work, but more entries than the budget
    assert work_size.glance(src, entries_at_most=20) is None
    assert work_size.glance(src, entries_at_most=40) == work_size.Work(30, 300)


_STARTED = ("import sys\nfrom beam_jobs.runtime import worker_start\n"
            "worker_start.start_for(sys.argv[1], sys.argv[2:])\n"
            "print(worker_start.running())\n")


def _started(src: str, *flags: str, tmp_path) -> bool:
    """Whether start_for started the forkserver in a fresh process (its output in a file: the forkserver holds the
    process's stdout until its import of Beam ends, and a pipe would wait for it)."""
    out = tmp_path / "started.txt"
    with open(out, "w") as handle:
        subprocess.run([sys.executable, "-c", _STARTED, src, *flags], cwd=REPO, stdout=handle,
                       stderr=subprocess.DEVNULL, timeout=60, check=True)
    return out.read_text().strip() == "True"


@pytest.mark.e2e
def test_the_forkserver_starts_only_for_a_run_that_will_use_workers(tmp_path):
    small = _tree(tmp_path / "small", 5, 100)
    assert not _started(small, tmp_path=tmp_path)  # the size rule keeps it in one process: no forkserver
    assert _started(small, "--direct_num_workers=2", tmp_path=tmp_path)  # workers asked for
    large = _tree(tmp_path / "large", 3, 120_000_000)
    assert _started(large, tmp_path=tmp_path)
