"""``--update`` of OUT in S3 and GCS (issue #59), against real servers on loopback (tests/object_stores.py).

The rule: an update of OUT in a store publishes the version a local update of a twin OUT publishes, byte for
byte (shards, records and sources tables, lists, the manifest's content); killed after its upload and before its
pointer, version 1 stays the latest and readable, and the same command removes the orphan objects and
publishes that version. The data: 16 small images through one update that adds, rewrites, moves one into a new
class, masks two shards and compacts one, so that every read of OUT is a read in the store (tables,
rejections, a masked shard's records by offset, a compacted shard's frames by its index). The updates run in
this process (the killed one in a process of its own) on the in-memory runner.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal

import pytest

import reader
import record_schema
from beam_jobs import faults
from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from record_files import versions
from tests.conftest import run_converter
from tests.converter.test_update import FAST, _files, _image, _records, _source
from tests.in_process import cli_in_forked_process

pytestmark = pytest.mark.e2e  # servers on loopback, and the command line

# No near search: its work files are a conversion's in a store (tests/converter/test_object_store.py), a hundred
# requests of the server's here; the kept records still feed the exact search through the store.
FLAGS = ["--val-fraction", "0.25", "--near-distance", "off", "--shards", "3", "--update", "--no-progress"]


def _options(src: str, out: str) -> ConvertOptions:
    """FLAGS as options (the conversion of version 1, and the updates run in this process)."""
    options = ConvertOptions(src=src, out=out, val_fraction=0.25, shards=3)
    return dataclasses.replace(options, encode=dataclasses.replace(options.encode, perceptual_hash=False))


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[str, str, dict]:
    """SRC and its conversion (local, in this process), made once; and version 1's records."""
    root = tmp_path_factory.mktemp("remote-update")
    src = _source(str(root))
    out = str(root / "out")
    conversion.run(_options(src, out), FAST, show_progress=False)
    return src, out, _records(out)


@pytest.fixture(scope="module")
def changed(converted, tmp_path_factory) -> tuple[str, str]:
    """SRC changed (:func:`_changed_src`, read only by the tests) and its twin: a copy of version 1 on disk
    updated to it in this process, the version every update in a store must equal."""
    folder = str(tmp_path_factory.mktemp("changed"))
    src, twin = _changed_src(converted, folder), os.path.join(folder, "twin")
    shutil.copytree(converted[1], twin)
    summary = update.run(_options(src, twin), FAST)
    assert summary.version == 2 and summary.changes["masked_shards"] and summary.changes["compacted_shards"]
    return src, twin


def _changed_src(converted, folder: str) -> str:
    """A copy of SRC (its files' times kept) with a change that makes every kind of shard: one train shard loses
    three of its four images (compacted), another one (masked), two images added, one rewritten (another
    shard masked), one moved into a new class ``bird``."""
    src, _, first = converted
    copy = os.path.join(folder, "src")
    shutil.copytree(src, copy)
    by_shard: dict[str, list[str]] = {}
    for path, (split, _, shard) in sorted(first.items()):
        if split == "train":
            by_shard.setdefault(shard, []).append(path)
    (one, two, three) = sorted(by_shard.values(), key=len, reverse=True)[:3]
    for path in one[:3] + two[:1]:
        os.remove(os.path.join(copy, path))
    _image(os.path.join(copy, three[0]), 4242)
    os.makedirs(os.path.join(copy, "bird"))
    os.rename(os.path.join(copy, three[1]), os.path.join(copy, "bird", "moved.jpg"))
    for i in range(2):
        _image(os.path.join(copy, "cat", f"new{i}.jpg"), 7000 + i)
    return copy


def _same_version(remote: dict[str, bytes], local: str) -> None:
    """The store's objects are the local twin's files, byte for byte, but for the manifest's record of where and
    when (its content, what a reader reads, compared whole)."""
    files = _files(local)
    assert sorted(remote) == sorted(files)
    for name, data in files.items():
        if os.path.basename(name) == record_schema.MANIFEST_FILE:
            mine, theirs = json.loads(remote[name]), json.loads(data)
            assert versions.manifest_content(mine) == versions.manifest_content(theirs), name
            for manifest in (mine, theirs):
                manifest.pop("created", None)
                manifest["options"].pop("out")
            assert mine == theirs, name
        else:
            assert remote[name] == data, name


def test_an_update_in_gcs_publishes_the_version_a_local_update_publishes(converted, changed, gcs_emulator,
                                                                         monkeypatch):
    pytest.importorskip("apache_beam.io.gcp.gcsio", reason="the gcp extra is not installed: pip install '.[gcp]'")
    for name, value in gcs_emulator.env.items():
        monkeypatch.setenv(name, value)
    (src, twin), bucket = changed, gcs_emulator.new_bucket()
    out = gcs_emulator.upload(converted[1], bucket, "out")
    assert update.run(_options(src, out), FAST).version == 2  # in this process: Beam's GCS file system, anonymous
    _same_version(gcs_emulator.snapshot(bucket, "out"), twin)


def test_an_update_in_s3_killed_before_its_pointer_leaves_version_1_then_the_same_command_publishes_a_local_updates(
        converted, changed, s3_server, tmp_path, monkeypatch):
    (src, twin), bucket = changed, s3_server.new_bucket()
    out = s3_server.upload(converted[1], bucket, "out")
    before = s3_server.snapshot(bucket, "out")
    command = ["--src", src, "--out", out, *FLAGS, *FAST, *s3_server.flags]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # In a process of its own, forked from one that imported Beam once (tests/in_process.py).
    killed = cli_in_forked_process(command, env={"TMPDIR": str(scratch), faults.ENV: "kill@version-moved"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    after = s3_server.snapshot(bucket, "out")
    # Version 2 uploaded whole (its shards and files), unpublished: no pointer; version 1's objects untouched.
    assert {name for name in after if name not in before} == {name for name in _files(twin)
                                                               if name.startswith(versions.version_dir(2) + "/")}
    assert versions.POINTER_FILE not in after and all(after[name] == data for name, data in before.items())
    assert not os.listdir(scratch), "the killed update left its staging on the launcher's disk"
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    info = reader.dataset_info(out)  # the reader resolves the version through versions/latest in the store
    assert info.version == 1 and info.fingerprint == reader.dataset_info(converted[1]).fingerprint

    finished = run_converter(*command, env={"TMPDIR": str(scratch)})
    assert finished.returncode == 0, finished.stderr
    assert "published version 2" in finished.stdout and "never published" in finished.stderr
    _same_version(s3_server.snapshot(bucket, "out"), twin)  # the orphans gone: exactly the twin's files
    assert not os.listdir(scratch)
    info = reader.dataset_info(out)
    assert info.version == 2 and info.fingerprint == reader.dataset_info(twin).fingerprint and "bird" in info.classes


def test_runs_in_s3_name_src_or_out_at_once_when_out_holds_no_dataset_its_bucket_is_missing_or_no_credentials_reach_it(
        converted, s3_server, tmp_path, monkeypatch):
    src = converted[0]

    def refused(out: str, *flags: str) -> str:
        proc = run_converter("--src", src, "--out", out, *FLAGS, *FAST, *flags)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stderr

    empty = f"s3://{s3_server.new_bucket()}/out"
    assert f"{empty} holds no converted dataset to update" in refused(empty, *s3_server.flags)
    missing = f"s3://no-such-bucket-{os.getpid()}/out"
    assert f"error: --out {missing}: " in refused(missing, *s3_server.flags)
    # No credentials anywhere boto3 looks: refused at once (Beam's own calls retry that for minutes).
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    out = s3_server.upload(converted[1], s3_server.new_bucket(), "out")
    no_keys = [f"--s3_endpoint_url={s3_server.endpoint}", "--s3_region_name=us-east-1"]
    stderr = refused(out, *no_keys)
    assert f"error: --out {out}: " in stderr and "Unable to locate credentials" in stderr, stderr
    # A conversion, not an update, refuses at once too: into S3, and from SRC in S3 (Beam retried ~9 minutes).
    conversion_flags = [flag for flag in FLAGS if flag != "--update"]
    proc = run_converter("--src", src, "--out", out + "-new", *conversion_flags, *FAST, *no_keys)
    assert proc.returncode == 1 and f"error: --out {out}-new: " in proc.stderr, proc.stderr
    assert "Unable to locate credentials" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    remote_src = out.rsplit("/", 1)[0] + "/src"
    proc = run_converter("--src", remote_src, "--out", str(tmp_path / "out"), *conversion_flags, *FAST, *no_keys)
    assert proc.returncode == 1 and f"error: --src {remote_src}: " in proc.stderr, proc.stderr
    labels = out.rsplit("/", 1)[0] + "/labels.csv"  # a label file in S3 beside a local SRC
    proc = run_converter("--src", src, "--out", str(tmp_path / "out"), "--annotations", labels, *conversion_flags,
                         *FAST, *no_keys)
    assert proc.returncode == 1 and f"error: --annotations {labels}: " in proc.stderr, proc.stderr
