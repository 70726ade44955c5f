"""Conversions into and out of S3, through Beam's own S3 filesystem, against a real S3 server on loopback.

moto's server mode answers the S3 HTTP API; the converter runs as a user runs
it (a subprocess, the default local runner, ``--s3_*`` flags), and its output is
compared byte for byte with a run on local disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
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
from record_files import croissant, versions
from tests.conftest import REPO, run_converter
from tests.in_process import cli_in_forked_process

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


def _local_snapshot(folder) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def _comparable(files: dict[str, bytes]) -> dict[str, bytes]:
    """Every file as is, except the manifest's record of where and when the run happened."""
    files = dict(files)
    manifest = json.loads(files.pop(record_schema.MANIFEST_FILE))
    for key in ("created", "written_by"):
        manifest.pop(key)
    manifest.pop("source_archives", None)  # an archive run also names the archives it read
    manifest.pop("source_parquet", None)  # and a Parquet run its files (their times differ in a bucket)
    for key in ("src", "out", "overwrite", "archive_scan"):
        manifest["options"].pop(key)
    files[record_schema.MANIFEST_FILE] = json.dumps(manifest, sort_keys=True).encode()
    card = json.loads(files.pop(croissant.CROISSANT_FILE))
    card.pop("name")  # the dataset folder's name: each run compared writes another OUT
    files[croissant.CROISSANT_FILE] = json.dumps(card, sort_keys=True).encode()
    if versions.SOURCES_TABLE in files:  # version 1's (#59): a file in a bucket has no stamp, a local one its own
        rows = versions.read_sources(files.pop(versions.SOURCES_TABLE), versions.SOURCES_TABLE)
        files[versions.SOURCES_TABLE] = repr([dataclasses.replace(row, size=0, mtime_ns=0) for row in rows]).encode()
    return files


@pytest.fixture(scope="module")
def images(tmp_path_factory, demo_src, sample_images):
    """The demo shapes plus files that are re-encoded (PNG, CMYK) and rejected (truncated, empty)."""
    folder = tmp_path_factory.mktemp("s3src") / "images"
    shutil.copytree(demo_src, folder)
    (folder / "circle" / "flat.png").write_bytes(sample_images["png_rgb"])
    (folder / "square" / "cmyk.jpg").write_bytes(sample_images["jpeg_cmyk"])
    (folder / "triangle" / "broken.jpg").write_bytes(sample_images["truncated_jpeg"])
    (folder / "triangle" / "empty.jpg").write_bytes(b"")  # an empty object: S3 reads of it are a corner case
    return str(folder)


@pytest.fixture(scope="module")
def local_run(images, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "out"
    run_converter("--src", images, "--out", str(out), "--shards", "3", "--val-fraction", "0.2", *FAST, check=True)
    return _local_snapshot(out)


def test_src_and_out_in_s3_alone_or_mixed_with_local_give_a_local_runs_bytes(images, local_run, s3_server, tmp_path):
    bucket = s3_server.new_bucket()
    src = s3_server.upload(images, bucket, "images")
    common = ["--shards", "3", "--val-fraction", "0.2", *s3_server.flags]
    assert b"broken.jpg" in local_run[record_schema.REJECTED_FILE] and b"empty.jpg" in local_run[record_schema.REJECTED_FILE]

    # Both in S3, on the runner users get by default (worker processes reach S3 with the same flags).
    proc = run_converter("--src", src, "--out", f"s3://{bucket}/both", "--no-progress", *common, check=True)
    assert "no lock is taken" in proc.stderr  # object stores have no locks: the user is told
    assert _comparable(s3_server.snapshot(bucket, "both")) == _comparable(local_run)

    run_converter("--src", src, "--out", str(tmp_path / "from-s3"), *common, *FAST, check=True)
    assert _comparable(_local_snapshot(tmp_path / "from-s3")) == _comparable(local_run)

    run_converter("--src", images, "--out", f"s3://{bucket}/to-s3", *common, *FAST, check=True)
    assert _comparable(s3_server.snapshot(bucket, "to-s3")) == _comparable(local_run)


def _observe(s3_server, bucket: str, prefix: str):
    """One consistent look at a dataset in S3, as a reader polling its manifest gets it.

    Returns the manifest's bytes (None: no dataset), or "inconsistent" when the
    manifest stayed the same while its shards did not match it (a mix). When the
    manifest changed during the look, the look proves nothing and None is retried.
    """
    client = s3_server.client()
    key = f"{prefix}/{record_schema.MANIFEST_FILE}"
    try:
        first = client.get_object(Bucket=bucket, Key=key)
    except client.exceptions.NoSuchKey:
        return None
    body = first["Body"].read()
    manifest = json.loads(body)
    complete = True
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            try:
                data = client.get_object(Bucket=bucket, Key=f"{prefix}/{shard['file']}")["Body"].read()
            except client.exceptions.NoSuchKey:
                complete = False
                continue
            complete &= hashlib.sha256(data).hexdigest() == shard["sha256"]
    try:
        again = client.head_object(Bucket=bucket, Key=key)
    except client.exceptions.ClientError:
        return "changed"
    if again["ETag"] != first["ETag"]:
        return "changed"
    return body if complete else "inconsistent"


def test_overwriting_in_s3_shows_a_polling_reader_old_then_nothing_then_new_never_a_mix(images, s3_server):
    bucket = s3_server.new_bucket()
    out = f"s3://{bucket}/data"
    run_converter("--src", images, "--out", out, "--shards", "2", *s3_server.flags, *FAST, check=True)
    old = s3_server.snapshot(bucket, "data")[record_schema.MANIFEST_FILE]
    # A pause half-way through moving the new files, so the poller sees the publish in progress. The run is a process
    # of its own forked from one that imported Beam once (tests/in_process.py), waited for by a thread meanwhile:
    # what the poller sees depends on the order of the writes, not on how the process started.
    done: dict = {}
    runner = threading.Thread(target=lambda: done.update(proc=cli_in_forked_process(
        ["--src", images, "--out", out, "--shards", "3", "--overwrite", *s3_server.flags, *FAST],
        env={faults.ENV: "sleep:3@moving"})))
    runner.start()
    seen = []
    while runner.is_alive():
        state = _observe(s3_server, bucket, "data")
        if state != "changed" and (not seen or seen[-1] != state):
            seen.append(state)
    runner.join()
    proc = done["proc"]
    assert proc.returncode == 0, proc.stderr
    seen.append(_observe(s3_server, bucket, "data"))
    new = s3_server.snapshot(bucket, "data")[record_schema.MANIFEST_FILE]
    assert "inconsistent" not in seen
    states = [{old: "old", None: "none", new: "new"}[state] for state in seen]
    assert states[0] == "old" and states[-1] == "new" and "none" in states
    assert states == sorted(states, key=["old", "none", "new"].index)  # never back to an earlier state
    assert not any(name.startswith(".staging-") for name in s3_server.snapshot(bucket, "data"))


def test_runs_killed_during_the_s3_publish_are_finished_by_the_next_run(images, local_run, s3_server):
    """Killed after retracting the old manifest; the next run finishes that publish, then is itself
    killed while moving its own files; the run after that finishes it and publishes: a local run's bytes."""
    bucket = s3_server.new_bucket()
    out = f"s3://{bucket}/data"
    command = ["--src", images, "--out", out, "--shards", "3", "--val-fraction", "0.2", "--overwrite",
               *s3_server.flags, *FAST]
    run_converter("--src", images, "--out", out, "--shards", "2", *s3_server.flags, *FAST, check=True)
    for point, finishes_an_earlier_publish in zip(faults.REMOTE_POINTS, (False, True)):
        # A process of its own, forked from one that imported Beam once (tests/in_process.py).
        killed = cli_in_forked_process(command, env={faults.ENV: f"kill@{point}"})
        assert killed.returncode == -9
        assert ("finishing the publish" in killed.stderr) == finishes_an_earlier_publish
        assert record_schema.MANIFEST_FILE not in s3_server.snapshot(bucket, "data")  # "no dataset", never a mix
    proc = run_converter(*command, check=True)
    assert "finishing the publish" in proc.stderr
    files = s3_server.snapshot(bucket, "data")
    assert not any(name.startswith(".staging-") for name in files)
    assert _comparable(files) == _comparable(local_run)


def test_a_stopped_run_keeps_its_work_in_s3_and_inspect_and_the_same_command_find_it(images, local_run, s3_server):
    """SIGTERM (a preempted VM) once every part is validated: the work stays in OUT/.staging-<run>/, inspect
    names it, and the same command resumes from it to a local run's bytes."""
    bucket = s3_server.new_bucket()
    out = f"s3://{bucket}/data"
    command = [sys.executable, "-m", "converter", "--src", images, "--out", out, "--shards", "3",
               "--val-fraction", "0.2", *s3_server.flags, *FAST]
    stopped = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": REPO, faults.ENV: "sleep:60@bucket-ordered"})
    for _ in range(1200):
        if any("/_work/counts/part-" in name for name in s3_server.snapshot(bucket, "data")):
            break
        assert stopped.poll() is None, stopped.communicate()
        time.sleep(0.1)
    stopped.send_signal(signal.SIGTERM)
    _, stderr = stopped.communicate(timeout=60)
    assert stopped.returncode == 143, stderr
    kept = sorted({name.split("/")[0] for name in s3_server.snapshot(bucket, "data")})
    assert len(kept) == 1 and kept[0].startswith(".staging-")
    assert f"is kept in {out}/{kept[0]}: the same command resumes from it" in stderr, stderr
    inspect = run_converter("inspect", out, *s3_server.flags)
    assert inspect.returncode == 1 and f"finished work is kept in {out}/{kept[0]}" in inspect.stderr, inspect.stderr
    proc = run_converter(*command[3:], check=True)
    assert "resuming the interrupted run" in proc.stderr
    files = s3_server.snapshot(bucket, "data")
    assert not any(name.startswith(".staging-") for name in files)
    assert _comparable(files) == _comparable(local_run)


def test_src_and_out_in_gcs_give_a_local_runs_bytes(images, local_run, gcs_emulator):
    """GCS through Beam's own GCS file system, pointed at the emulator by STORAGE_EMULATOR_HOST.

    (The refusal without --overwrite is store-agnostic and tested on S3.)"""
    pytest.importorskip("apache_beam.io.gcp.gcsio", reason="the gcp extra is not installed: pip install '.[gcp]'")
    bucket = gcs_emulator.new_bucket()
    src = gcs_emulator.upload(images, bucket, "images")
    common = ["--shards", "3", "--val-fraction", "0.2", *FAST]

    def run(*extra):
        return run_converter("--src", src, "--out", f"gs://{bucket}/out", *common, *extra, env=gcs_emulator.env)

    proc = run()
    assert proc.returncode == 0, proc.stderr
    assert _comparable(gcs_emulator.snapshot(bucket, "out")) == _comparable(local_run)
    proc = run("--overwrite")  # the object-store publish on GCS: prefixes deleted, files moved, manifest last
    assert proc.returncode == 0, proc.stderr
    files = gcs_emulator.snapshot(bucket, "out")
    assert _comparable(files) == _comparable(local_run)
    assert not any(name.startswith(".staging-") for name in files)


def _archived(images, folder) -> str:
    """``images`` packed as users upload them: ``packed/`` holding ``circle.tar``, ``square.zip`` (under
    ``square/``) and ``triangle.tar.gz``, beside ``shipped.tar``, a tar of class tars (ImageNet's shape)."""
    from tests.archive_data import tar_folder, tar_of_tars, zip_folder

    packed = os.path.join(folder, "upload", "packed")
    os.makedirs(packed)
    tar_folder(os.path.join(images, "circle"), os.path.join(packed, "circle.tar"))
    zip_folder(os.path.join(images, "square"), os.path.join(packed, "square.zip"), top="square")
    tar_folder(os.path.join(images, "triangle"), os.path.join(packed, "triangle.tar.gz"), "w:gz")
    tar_of_tars(images, os.path.join(folder, "upload", "shipped.tar"))
    return os.path.join(folder, "upload")


def test_archives_in_s3_and_gcs_convert_to_the_local_runs_bytes(images, local_run, s3_server, gcs_emulator, tmp_path):
    """A folder of class archives (tar, zip, tar.gz) and a tar of class tars in a bucket, read by ranges through
    Beam's S3 and GCS file systems: the bytes of the local run of the extracted folder."""
    pytest.importorskip("apache_beam.io.gcp.gcsio", reason="the gcp extra is not installed: pip install '.[gcp]'")
    upload = _archived(images, tmp_path)
    common = ["--shards", "3", "--val-fraction", "0.2", "--no-progress"]
    bucket = s3_server.new_bucket()
    s3_src = s3_server.upload(upload, bucket, "upload")
    # The default runner: worker processes read the tars' headers into tables in the S3 staging folder, and the
    # members by ranged GETs.
    proc = run_converter("--src", f"{s3_src}/packed", "--out", f"s3://{bucket}/packed-out", *common,
                         "--archive-scan", "workers", "-v", *s3_server.flags, check=True)
    assert "the workers read the headers of 1 tar(s)" in proc.stderr
    files = s3_server.snapshot(bucket, "packed-out")
    assert _comparable(files) == _comparable(local_run)
    assert not any(name.startswith(".staging-") for name in files)
    run_converter("--src", f"{s3_src}/shipped.tar", "--out", str(tmp_path / "shipped-out"), *common, *FAST,
                  *s3_server.flags, check=True)
    assert _comparable(_local_snapshot(tmp_path / "shipped-out")) == _comparable(local_run)

    gcs_bucket = gcs_emulator.new_bucket()
    gcs_src = gcs_emulator.upload(upload, gcs_bucket, "upload")
    for name, scan in (("packed", "launcher"), ("shipped.tar", "workers")):
        out = tmp_path / f"gcs-{name}"
        proc = run_converter("--src", f"{gcs_src}/{name}", "--out", str(out), "--archive-scan", scan, *common, *FAST,
                             env=gcs_emulator.env)
        assert proc.returncode == 0, proc.stderr
        assert _comparable(_local_snapshot(out)) == _comparable(local_run)


def test_an_archive_in_s3_is_read_by_runs_of_members_not_by_requests_per_member(images, local_run, s3_server,
                                                                                    tmp_path):
    """The requests moto answers for a tar of the images, against those for the same images as a folder.

    Validation reads each part's members by one ranged GET per run of consecutive members (at most 16 MiB);
    the writer re-reads each pass-through image by exactly one ranged GET, in shard order, opening the archive
    once per shard. A folder costs a HEAD and a GET per file at each of the two reads. (README: "S3 and GCS".)
    """
    from tests.archive_data import tar_folder

    upload = tmp_path / "upload"
    shutil.copytree(images, upload / "images")
    tar_folder(upload / "images", upload / "images.tar")
    bucket = s3_server.new_bucket()
    s3_server.upload(str(upload), bucket, "upload")
    files = sum(len(names) for _, _, names in os.walk(upload / "images"))
    reads = {}
    for name in ("images", "images.tar"):
        out = tmp_path / f"out-{name}"
        s3_server.record()
        run_converter("--src", f"s3://{bucket}/upload/{name}", "--out", str(out), "--shards", "3",
                      "--val-fraction", "0.2", *FAST, *s3_server.flags, check=True)
        assert _comparable(_local_snapshot(out)) == _comparable(local_run)
        source = f"/{bucket}/upload/{name}"
        reads[name] = [(method, rng) for method, path, rng in s3_server.recorded()
                       if path == source or path.startswith(source + "/")]
    manifest = json.loads(local_run[record_schema.MANIFEST_FILE])
    shards = sum(split["num_shards"] for split in manifest["splits"].values())
    passed_through = sum(split["num_examples"] - split["num_reencoded"] for split in manifest["splits"].values())
    archive = reads["images.tar"]
    heads, gets = (sum(1 for method, _ in archive if method == kind) for kind in ("HEAD", "GET"))
    # Listing: a few HEADs (is it a file, its size for --archive-scan auto, its size and date, the open) and one
    # GET of the headers (16 MiB at a time). Validation (one part): a HEAD and one GET for the run. Writing: a
    # HEAD per shard, a GET per pass-through image (a re-encoded one is read from the run's spill file).
    assert heads <= 6 + 1 + shards and gets <= 1 + 1 + passed_through, archive
    assert len(reads["images"]) >= 3.5 * files  # a folder: a HEAD and a GET per file, at validation and writing


def test_webdataset_shards_in_s3_convert_as_locally_and_labels_cost_no_request_per_sample(demo_src, s3_server,
                                                                                         tmp_path):
    """img2dataset's shards in a bucket, labelled by their ``.cls`` members: the local run's bytes. The launcher
    reads the labels of a shard through one open handle and its read-ahead window: one GET a shard here, not
    one per sample (each had opened the shard and fetched 16 MiB)."""
    from tests.archive_data import webdataset_shards

    upload = tmp_path / "upload"
    expected = webdataset_shards(demo_src, upload / "shards", shards=3)
    bucket = s3_server.new_bucket()
    s3_src = s3_server.upload(str(upload), bucket, "upload")
    common = ["--label-member", "cls", "--shards", "2", *FAST]
    run_converter("--src", str(upload / "shards"), "--out", str(tmp_path / "local"), *common, check=True)
    s3_server.record()
    run_converter("--src", f"{s3_src}/shards", "--out", str(tmp_path / "from-s3"), *common, *s3_server.flags,
                  check=True)
    gets = [rng for method, path, rng in s3_server.recorded()
            if method == "GET" and path.startswith(f"/{bucket}/upload/shards/")]
    assert _comparable(_local_snapshot(tmp_path / "from-s3")) == _comparable(_local_snapshot(tmp_path / "local"))
    manifest = json.loads((tmp_path / "from-s3" / record_schema.MANIFEST_FILE).read_text())
    passed_through = sum(split["num_examples"] - split["num_reencoded"] for split in manifest["splits"].values())
    # Per shard: one GET to list it, one for its labels, one for validation's run of members; then a GET per
    # image the writer copies. A GET per label added one per sample: 186 GETs for these 90 samples.
    assert len(expected) == 90 and len(gets) <= 3 * 3 + passed_through, gets


def test_a_hub_snapshot_in_s3_converts_to_the_local_runs_bytes_by_ranged_reads(s3_server, tmp_path):
    """The launcher reads each file's footer and its label and path columns; workers read each row group's
    images once. Counted with moto's recorder: no request fetches a whole Parquet file."""
    from tests import hub_data

    snapshot = tmp_path / "snapshot"
    hub_data.hub_snapshot(str(snapshot))
    run_converter("--src", str(snapshot), "--out", str(tmp_path / "local"), "--shards", "2", *FAST, check=True)
    bucket = s3_server.new_bucket()
    src = s3_server.upload(str(snapshot), bucket, "beans")
    s3_server.record()
    run_converter("--src", src, "--out", str(tmp_path / "from-s3"), "--shards", "2", *s3_server.flags, *FAST,
                  check=True)
    requests = s3_server.recorded()
    assert _comparable(_local_snapshot(tmp_path / "from-s3")) == _comparable(_local_snapshot(tmp_path / "local"))
    reads = [(path, ranged) for method, path, ranged in requests if method == "GET" and path.endswith(".parquet")]
    assert reads and all(ranged for _, ranged in reads), reads  # every read of a Parquet file is ranged
    # 4 files of one row group: the launcher's footers and small columns, the workers' footer and image column.
    assert len(reads) <= 8 * 4, reads



def test_a_hub_snapshot_in_gcs_converts_to_the_local_runs_bytes(gcs_emulator, tmp_path):
    pytest.importorskip("apache_beam.io.gcp.gcsio", reason="the gcp extra is not installed: pip install '.[gcp]'")
    from tests import hub_data

    snapshot = tmp_path / "snapshot"
    hub_data.hub_snapshot(str(snapshot))
    run_converter("--src", str(snapshot), "--out", str(tmp_path / "local"), "--shards", "2", *FAST, check=True)
    bucket = gcs_emulator.new_bucket()
    src = gcs_emulator.upload(str(snapshot), bucket, "beans")
    run_converter("--src", src, "--out", str(tmp_path / "from-gcs"), "--shards", "2", *FAST, check=True,
                  env=gcs_emulator.env)
    assert _comparable(_local_snapshot(tmp_path / "from-gcs")) == _comparable(_local_snapshot(tmp_path / "local"))
