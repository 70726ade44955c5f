"""End-to-end: ``python -m converter`` in real subprocesses on generated image trees."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil

import pytest
import tensorflow as tf

import record_schema
from tests.conftest import REJECTED_KINDS, read_records

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


def _files(folder):
    return sorted(os.listdir(folder))


def _shard_bytes(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in _files(folder) if name.endswith(".tfrecord")}


def _manifest(folder):
    with open(os.path.join(folder, record_schema.MANIFEST_FILE), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.mark.e2e
def test_design_card_command_converts_into_the_default_out(tmp_path, demo_src, converter):
    shutil.copytree(demo_src, tmp_path / "imgs")
    proc = converter("--src", str(tmp_path / "imgs"), "--shards", "64", check=True)
    out = tmp_path / "imgs-tfrecords"
    assert "published" in proc.stdout and "images/s" in proc.stdout
    shards = [n for n in _files(out) if n.endswith(".tfrecord")]
    assert shards == [record_schema.shard_filename("train", i, 64) for i in range(64)]
    counts = [s["num_examples"] for s in _manifest(out)["splits"]["train"]["shards"]]
    assert sum(counts) == 90 and max(counts) - min(counts) <= 1 and min(counts) >= 1
    # Nothing but the dataset beside or inside OUT, and no Beam temp folders.
    assert sorted(os.listdir(tmp_path)) == ["imgs", "imgs-tfrecords"]


def test_records_match_the_manifest_and_decode_to_their_declared_size(demo_dataset, demo_src):
    manifest = _manifest(demo_dataset)
    assert manifest["format_version"] == record_schema.FORMAT_VERSION
    assert manifest["classes"] == ["circle", "square", "triangle"]
    labels = open(os.path.join(demo_dataset, record_schema.LABELS_FILE), encoding="utf-8").read().splitlines()
    assert labels == manifest["classes"]
    seen = set()
    for info in manifest["splits"].values():
        label_counts = collections.Counter()
        for shard in info["shards"]:
            path = os.path.join(demo_dataset, shard["file"])
            data = open(path, "rb").read()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (shard["num_bytes"], shard["sha256"])
            rows = read_records(path)
            assert len(rows) == shard["num_examples"]
            for row in rows:
                image = tf.io.decode_jpeg(row[record_schema.IMAGE_ENCODED], channels=3)
                assert image.shape == (row[record_schema.HEIGHT], row[record_schema.WIDTH], 3)
                assert hashlib.sha256(row[record_schema.IMAGE_ENCODED]).hexdigest().encode() == row[record_schema.SHA256]
                name = row[record_schema.FILENAME].decode()
                assert row[record_schema.LABEL_TEXT].decode() == name.split("/")[0]
                assert labels[row[record_schema.LABEL]] == name.split("/")[0]
                assert row[record_schema.IMAGE_FORMAT] == b"jpeg" and row[record_schema.CHANNELS] == 3
                # Stored byte for byte: the demo's JPEGs are clean.
                assert row[record_schema.IMAGE_ENCODED] == open(os.path.join(demo_src, name), "rb").read()
                label_counts[row[record_schema.LABEL]] += 1
                seen.add(name)
        assert [label_counts[i] for i in range(3)] == info["label_counts"]
    assert len(seen) == 90 and manifest["splits"]["validation"]["label_counts"] == [6, 6, 6]


@pytest.mark.e2e
def test_every_input_kind_is_stored_reencoded_or_rejected_with_a_reason(tmp_path, sample_images, converter):
    src = tmp_path / "mixed"
    for index, (kind, data) in enumerate(sorted(sample_images.items())):
        folder = src / ("alpha" if index % 2 else "beta")
        folder.mkdir(parents=True, exist_ok=True)
        # Misleading extensions on purpose: the format comes from the content.
        (folder / f"{kind}.jpg").write_bytes(data)
    (src / "alpha" / "Thumbs.db").write_bytes(b"x")
    (src / ".hidden").mkdir()
    (src / "README.txt").write_text("stray file at the top")
    out = tmp_path / "out"
    converter("--src", str(src), "--out", str(out), "--shards", "3", "--max-bad-fraction", "0.5", *FAST, check=True)

    rejected = [json.loads(line) for line in open(out / record_schema.REJECTED_FILE, encoding="utf-8")]
    assert {os.path.basename(r["path"])[:-4]: r["reason"] for r in rejected} == REJECTED_KINDS
    manifest = _manifest(out)
    written = len(sample_images) - len(REJECTED_KINDS)
    assert manifest["splits"]["train"]["num_examples"] == written
    assert manifest["num_rejected"] == len(REJECTED_KINDS)
    assert manifest["skipped_by_reason"] == {"stray-file": 1, "system-file": 1}
    assert manifest["splits"]["train"]["num_reencoded"] == written - 4  # four clean JPEGs pass through
    channels = {}
    for shard in manifest["splits"]["train"]["shards"]:
        for row in read_records(str(out / shard["file"])):
            image = tf.io.decode_jpeg(row[record_schema.IMAGE_ENCODED], channels=3)
            assert image.shape == (row[record_schema.HEIGHT], row[record_schema.WIDTH], 3)
            # The record tells the truth: TensorFlow's default decode gives image/channels channels.
            stored = tf.io.decode_jpeg(row[record_schema.IMAGE_ENCODED])
            assert stored.shape[-1] == row[record_schema.CHANNELS]
            channels[row[record_schema.FILENAME].decode().rsplit("/", 1)[-1][:-4]] = row[record_schema.CHANNELS]
    assert channels["jpeg_gray"] == 1 and manifest["splits"]["train"]["num_grayscale"] == 1
    assert {kind for kind, n in channels.items() if n == 3} == set(channels) - {"jpeg_gray"}
    assert converter("verify", str(out)).returncode == 0


@pytest.mark.e2e
def test_output_is_byte_identical_across_runs_and_worker_counts(tmp_path, demo_src, demo_dataset, converter):
    outs = []
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        converter(
            "--src", demo_src, "--out", str(out), "--shards", "4", "--val-fraction", "0.2", "--seed", "1",
            f"--direct_num_workers={workers}", "--no-progress", check=True,
        )
        outs.append(out)
    first = _shard_bytes(outs[0])
    assert len(first) == 5  # 4 train + 1 validation
    assert first == _shard_bytes(outs[1]) == _shard_bytes(demo_dataset)  # the fixture ran in-process


@pytest.mark.e2e
def test_a_different_seed_gives_a_different_order(tmp_path, demo_src, demo_dataset, converter):
    out = tmp_path / "seed2"
    converter("--src", demo_src, "--out", str(out), "--shards", "4", "--val-fraction", "0.2", "--seed", "2", *FAST, check=True)
    assert _shard_bytes(out) != _shard_bytes(demo_dataset)


@pytest.mark.e2e
def test_existing_dataset_is_refused_without_overwrite_and_replaced_with_it(tmp_path, demo_src, converter):
    out = tmp_path / "out"
    converter("--src", demo_src, "--out", str(out), "--shards", "2", *FAST, check=True)
    before = _shard_bytes(out)
    proc = converter("--src", demo_src, "--out", str(out), "--shards", "3", *FAST)
    assert proc.returncode == 1
    assert str(out) in proc.stderr and "--overwrite" in proc.stderr
    assert _shard_bytes(out) == before

    converter("--src", demo_src, "--out", str(out), "--shards", "3", "--overwrite", *FAST, check=True)
    assert sorted(_shard_bytes(out)) == [record_schema.shard_filename("train", i, 3) for i in range(3)]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging, lock or old copy left beside OUT


@pytest.mark.e2e
def test_a_folder_that_is_not_a_dataset_is_never_replaced(tmp_path, demo_src, converter):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("weeks of work")
    proc = converter("--src", demo_src, "--out", str(out), "--overwrite", *FAST)
    assert proc.returncode == 1 and "not a dataset" in proc.stderr
    assert _files(out) == ["thesis.tex"]


@pytest.mark.e2e
def test_error_budget_fails_publishes_nothing_and_points_to_the_report(tmp_path, demo_src, sample_images, converter):
    src = tmp_path / "src"
    shutil.copytree(demo_src, src)
    for index in range(7):
        (src / "circle" / f"broken{index}.jpg").write_bytes(sample_images["truncated_jpeg"])
    for index in range(3):
        (src / "circle" / f"text{index}.jpg").write_bytes(sample_images["text"])
    out = tmp_path / "out"
    proc = converter("--src", str(src), "--out", str(out), "--max-bad-fraction", "0.05", *FAST)
    assert proc.returncode == 1
    report = f"{out}.rejected.jsonl"
    assert "10 of 100 files (10.0%) were rejected (undecodable 7, not-an-image 3)" in proc.stderr
    assert report in proc.stderr
    assert not out.exists()
    assert len(open(report).readlines()) == 10
    # Within budget, the same tree converts and the stale report is cleared.
    proc = converter("--src", str(src), "--out", str(out), "--max-bad-fraction", "0.2", *FAST, check=True)
    assert _manifest(out)["num_rejected"] == 10 and not os.path.exists(report)
    assert "no records" not in proc.stderr

    # A class whose every file is rejected is still a class (its label id stays), with a warning naming it.
    (src / "zebra").mkdir()
    for index in range(3):
        (src / "zebra" / f"text{index}.jpg").write_bytes(sample_images["text"])
    proc = converter("--src", str(src), "--out", str(out), "--overwrite", "--max-bad-fraction", "0.2", *FAST,
                     check=True)
    assert "warning: 1 class has no records: every file listed for it was rejected (rejected.jsonl): zebra" \
        in proc.stderr
    assert _manifest(out)["classes"][-1] == "zebra"


@pytest.mark.e2e
def test_split_folders_and_pinned_labels(tmp_path, demo_src, converter):
    src = tmp_path / "src"
    for split, shapes in (("train", ("circle", "square", "triangle")), ("val", ("square",)), ("test", ("circle", "triangle"))):
        for shape in shapes:
            shutil.copytree(os.path.join(demo_src, shape), src / split / shape)
    labels = tmp_path / "labels.txt"
    labels.write_text("triangle\nsquare\ncircle\n")
    out = tmp_path / "out"
    converter("--src", str(src), "--out", str(out), "--shards", "6", "--labels", str(labels), *FAST, check=True)
    manifest = _manifest(out)
    assert manifest["classes"] == ["triangle", "square", "circle"]
    assert {s: i["num_shards"] for s, i in manifest["splits"].items()} == {"train": 6, "validation": 2, "test": 4}
    assert manifest["splits"]["validation"]["label_counts"] == [0, 30, 0]
    rows = read_records(str(out / record_schema.shard_filename("test", 0, 4)))
    assert {(r[record_schema.LABEL_TEXT], r[record_schema.LABEL]) for r in rows} <= {(b"triangle", 0), (b"circle", 2)}


@pytest.mark.e2e
def test_help_explains_every_option_with_its_default(converter):
    proc = converter("--help", check=True)
    for flag in ("--src", "--out", "--shards", "--val-fraction", "--seed", "--labels", "--max-side",
                 "--quality", "--max-bad-fraction", "--overwrite", "--runner"):
        assert flag in proc.stdout
    assert proc.stdout.count("default") >= 9


@pytest.mark.parametrize(
    "args,message",
    [
        (["--shard", "4"], "did you mean --shards"),
        (["--shards", "0"], "--shards must be a positive integer"),
        (["--quality", "120"], "--quality must be"),
        (["--val-fraction", "1.5"], "--val-fraction must be"),
        (["--direct_num_workers=-2"], "--direct_num_workers must be a whole number"),
        (["--direct_num_workers", "two"], "--direct_num_workers must be a whole number"),
    ],
)
@pytest.mark.e2e
def test_bad_flags_exit_2_naming_the_flag(demo_src, converter, args, message, tmp_path):
    proc = converter("--src", demo_src, "--out", str(tmp_path / "out"), *args)
    assert proc.returncode == 2 and message in proc.stderr
    assert os.listdir(tmp_path) == []  # nothing kept: no dataset, no staging folder


@pytest.mark.e2e
def test_missing_src_and_empty_class_are_clear_errors(tmp_path, converter):
    proc = converter("--src", str(tmp_path / "nope"), *FAST)
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "dog").mkdir()
    (tmp_path / "src" / "cat" / "a.jpg").write_bytes(b"x")
    proc = converter("--src", str(tmp_path / "src"), *FAST)
    assert proc.returncode == 1 and "src/dog holds no images" in proc.stderr


@pytest.mark.e2e
def test_reencoded_and_downsized_images_are_byte_identical_across_runs_and_worker_counts(tmp_path, sample_images,
                                                                                           converter):
    """Re-encoded images are spilled once at validation and copied by the writer; the bytes never depend on who."""
    src = tmp_path / "mixed"
    for index, (kind, data) in enumerate(sorted(sample_images.items())):
        if kind not in REJECTED_KINDS:
            folder = src / ("alpha" if index % 2 else "beta")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{kind}.img").write_bytes(data)
    outs = []
    for workers in ("1", "2", "2"):
        out = tmp_path / f"out-{len(outs)}"
        converter("--src", str(src), "--out", str(out), "--shards", "3", "--max-side", "64",
                  f"--direct_num_workers={workers}", "--no-progress", check=True)
        outs.append(out)
        assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []  # spill files went with staging
    manifest = _manifest(outs[0])
    assert manifest["splits"]["train"]["num_reencoded"] == manifest["splits"]["train"]["num_examples"]
    assert _shard_bytes(outs[0]) == _shard_bytes(outs[1]) == _shard_bytes(outs[2])


@pytest.mark.e2e
def test_shards_auto_sizes_shards_from_the_bytes_and_an_explicit_count_of_tiny_shards_is_warned_about(
        tmp_path, converter):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(90):  # ~24 MB of incompressible JPEGs
        folder = tmp_path / "src" / f"c{index % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (420, 560, 3), dtype=np.uint8)).save(folder / f"{index}.jpg", quality=95)
    fast = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]
    auto = converter("--src", str(tmp_path / "src"), "--out", str(tmp_path / "auto"), "--shards", "auto",
                     "--val-fraction", "0.1", *fast, check=True)
    manifest = _manifest(tmp_path / "auto")
    assert manifest["options"]["shards"] == "auto" and "average" not in auto.stderr
    assert {name: split["num_shards"] for name, split in manifest["splits"].items()} == {"train": 1, "validation": 1}
    many = converter("--src", str(tmp_path / "src"), "--out", str(tmp_path / "many"), "--shards", "16", *fast,
                     check=True)
    assert "split train's shards average 1.5 MB, under 10 MB" in many.stderr and "--shards auto" in many.stderr
    bad = converter("--src", str(tmp_path / "src"), "--shards", "some")
    assert bad.returncode == 2 and "--shards: must be a positive integer or 'auto', got 'some'" in bad.stderr
