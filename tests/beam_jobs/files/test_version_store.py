"""Pruning versions: a dropped version's own files go, its subfolders too (compacted shards), a folder a stopped
prune left goes with the next one, and a folder past the pointer (an update still to publish) stays."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

import record_schema
from beam_jobs.files import version_store


def _dataset(out) -> None:
    def manifest(folder, files, number=None):
        (out / folder).mkdir(parents=True, exist_ok=True)
        body = {"format_version": 1, "classes": [], "splits": {"train": {"shards": [{"file": f} for f in files]}}}
        (out / folder / record_schema.MANIFEST_FILE).write_text(json.dumps(dict(body, version=number)))

    for name in ("a.tfrecord", "versions/00002/compacted/c.tfrecord", "versions/00002/compacted/d.tfrecord",
                 "versions/00002/sources.parquet", "versions/00003/compacted/e.tfrecord",
                 "versions/00003/sources.parquet", "versions/00004/compacted/f.tfrecord",
                 "versions/00005/compacted/g.tfrecord"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(hashlib.sha256(name.encode()).digest())
    manifest(".", ["a.tfrecord"])
    manifest("versions/00002", ["a.tfrecord", "versions/00002/compacted/c.tfrecord",
                                "versions/00002/compacted/d.tfrecord"], 2)
    manifest("versions/00003", ["versions/00002/compacted/c.tfrecord", "versions/00003/compacted/e.tfrecord"], 3)
    manifest("versions/00004", ["versions/00002/compacted/c.tfrecord", "versions/00004/compacted/f.tfrecord"], 4)
    manifest("versions/00005", ["versions/00005/compacted/g.tfrecord"], 5)  # an update not yet published
    version_store.write_pointer(str(out), 4)


def _left(out) -> list[str]:
    return sorted(os.path.relpath(os.path.join(f, n), out) for f, _, names in os.walk(out) for n in names)


def test_prune_removes_a_dropped_versions_subfolders_but_what_a_kept_version_reads(tmp_path):
    out = tmp_path / "out"
    _dataset(out)
    pruned = version_store.prune(str(out), keep=1)
    assert pruned.versions == (1, 2, 3)
    assert _left(out) == ["versions/00002/compacted/c.tfrecord", "versions/00004/compacted/f.tfrecord",
                          "versions/00004/manifest.json", "versions/00005/compacted/g.tfrecord",
                          "versions/00005/manifest.json", "versions/latest"]
    assert not (out / "versions" / "00003").exists()


def test_a_prune_stopped_after_the_manifests_is_finished_by_the_next(tmp_path):
    out = tmp_path / "out"
    _dataset(out)
    os.remove(out / "versions" / "00003" / record_schema.MANIFEST_FILE)  # as a prune stopped there leaves it
    version_store.prune(str(out), keep=2)
    assert not (out / "versions" / "00003").exists()
    assert "versions/00005/compacted/g.tfrecord" in _left(out)


def _version_folders(out, numbers) -> None:
    for number in numbers:
        folder = out / "versions" / f"{number:05d}"
        folder.mkdir(parents=True)
        (folder / record_schema.MANIFEST_FILE).write_text("{}")


def test_the_one_version_after_the_pointer_is_an_interrupted_updates_and_removed(tmp_path):
    _version_folders(tmp_path, (2, 3))
    (tmp_path / "versions" / "latest").write_text("2\n")
    version_store.remove_unpublished(str(tmp_path))
    assert sorted(os.listdir(tmp_path / "versions")) == ["00002", "latest"]


def test_versions_past_a_lost_pointer_are_refused_never_removed(tmp_path):
    """A pointer lost or a copy of OUT cut short (a store's sync copies versions/latest after the folders): the
    versions above it were published, and removing them as an interrupted update's would erase the history."""
    _version_folders(tmp_path, (2, 3, 4, 5))
    with pytest.raises(version_store.VersionError, match=r"versions/latest is missing \(version 1\), but versions "
                                                          r"2, 3, 4, 5 are there.*nothing was removed"):
        version_store.remove_unpublished(str(tmp_path))
    (tmp_path / "versions" / "latest").write_text("3\n")
    with pytest.raises(version_store.VersionError, match="says version 3, but versions 4, 5 are there"):
        version_store.remove_unpublished(str(tmp_path))
    assert sorted(os.listdir(tmp_path / "versions")) == ["00002", "00003", "00004", "00005", "latest"]
