"""``--update`` (issue #59) on the Dask runner: a real cluster (a scheduler and two workers on loopback, as
tests/converter/test_dask.py starts them) publishes the version a local-runner update publishes, and a
killed update leaves the latest version whole."""

from __future__ import annotations

import os
import shutil

import pytest

from beam_jobs import pipeline as conversion
from beam_jobs.files import version_store
from beam_jobs.options import ConvertOptions
from record_files import versions
from tests.conftest import run_converter
from tests.converter.test_update import FAST, _image, _records, _source

pytestmark = pytest.mark.e2e  # a cluster of processes, and the command line
distributed = pytest.importorskip("distributed", reason="the dask extra is not installed: pip install '.[dask]'")
from tests.converter.test_dask import dask_cluster  # noqa: E402,F401  (the fixture)

FLAGS = ["--val-fraction", "0.25", "--shards", "2", "--near-distance", "3", "--no-progress"]


def test_an_update_on_dask_publishes_the_local_runners_version_and_a_killed_one_leaves_the_latest_whole(
        tmp_path, dask_cluster):  # noqa: F811  (the fixture imported above)
    address, _ = dask_cluster
    src = _source(str(tmp_path))
    local, dask = str(tmp_path / "local"), str(tmp_path / "dask")
    conversion.run(ConvertOptions(src=src, out=local, val_fraction=0.25, shards=2, near_distance=3), FAST,
                   show_progress=False)
    shutil.copytree(local, dask)
    for i in range(3):
        _image(os.path.join(src, "cat", f"new{i}.jpg"), 9000 + i)
    os.remove(os.path.join(src, "dog", "3.jpg"))

    on_dask = ["--runner=dask", f"--dask_client_address={address}"]
    run_converter("--src", src, "--out", dask, "--update", *FLAGS, *on_dask, check=True, timeout=600)
    run_converter("--src", src, "--out", local, "--update", *FLAGS, check=True)
    assert version_store.latest_number(dask) == version_store.latest_number(local) == 2
    assert _records(dask) == _records(local)
    contents = [versions.manifest_content(version_store.read(out, 2).manifest) for out in (local, dask)]
    assert contents[0] == contents[1]  # the same shards, bytes and SHA-256s: the same fingerprint

    # Killed after the cluster wrote the new shards, before the version was published: version 2 stays the
    # latest, whole (that the same command then finishes it is the local runner's tests': the same launcher).
    before = _records(dask)
    _image(os.path.join(src, "dog", "new.jpg"), 9100)
    killed = run_converter("--src", src, "--out", dask, "--update", *FLAGS, *on_dask, timeout=600,
                           env={"IMGSHARDS_FAULT": "kill@pipeline-done"})
    assert killed.returncode != 0
    assert version_store.latest_number(dask) == 2 and _records(dask) == before
