"""Object datasets hold what classification datasets hold: in S3, inside an archive, the bytes of a local run."""

from __future__ import annotations

import pytest

from converter.demo import write_object_demo
from tests.archive_data import zip_folder
from tests.conftest import run_converter
from tests.converter.test_archives import dataset_contents

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """The COCO and YOLO demos (shapes with their boxes), 40 images each, and each one's local conversion."""
    root = tmp_path_factory.mktemp("objects")
    found = {}
    for layout in ("coco", "yolo"):
        src = root / layout
        write_object_demo(str(src), layout, images=40, seed=5)
        run_converter("--src", str(src), "--out", str(root / f"{layout}-local"), "--shards", "2", *FAST, check=True)
        found[layout] = (src, dataset_contents(root / f"{layout}-local"))
    return found


def test_an_object_dataset_in_s3_converts_to_the_bytes_of_a_local_run(layouts, s3_server, tmp_path):
    layout = "coco"  # its annotation file streamed from S3 (YOLO's label files are read as any member is)
    src, local = layouts[layout]
    bucket = s3_server.new_bucket()
    remote = s3_server.upload(str(src), bucket, layout)
    run_converter("--src", remote, "--out", str(tmp_path / "out"), "--shards", "2", *s3_server.flags, *FAST,
                  check=True)
    assert dataset_contents(tmp_path / "out") == local


def test_an_object_dataset_in_a_zip_converts_to_the_bytes_of_its_extraction(layouts, tmp_path):
    layout = "yolo"  # its data.yaml and label files read as members (COCO's JSON is read the same way)
    src, local = layouts[layout]
    packed = zip_folder(str(src), tmp_path / f"{layout}.zip")
    run_converter("--src", str(packed), "--out", str(tmp_path / "out"), "--shards", "2", *FAST, check=True)
    assert dataset_contents(tmp_path / "out") == local


def test_a_failed_object_run_resumes_from_its_kept_work_to_the_same_bytes(layouts, tmp_path):
    """Objects travel in the kept work files: a resumed COCO run writes what an uninterrupted one does."""
    from beam_jobs import faults

    src, local = layouts["coco"]
    out = tmp_path / "out"
    args = ["--src", str(src), "--out", str(out), "--shards", "2", "--part-size", "8", *FAST]
    failed = run_converter(*args, env={faults.ENV: "fail@shard-written"})
    assert failed.returncode == 1 and not out.exists(), failed.stderr
    rerun = run_converter(*args, check=True)
    assert "resuming the interrupted run" in rerun.stderr
    assert dataset_contents(out) == {**local, "manifest.json": {**local["manifest.json"], "options": {
        **local["manifest.json"]["options"], "part_size": 8}}}
