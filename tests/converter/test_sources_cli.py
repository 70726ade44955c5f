"""``python -m converter`` on label files and on an ImageNet-shaped tree, with real images."""

from __future__ import annotations

import json
import os

import pytest

import record_schema
from tests.conftest import read_records, write_imagenet_tree

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]


def _records(out):
    with open(os.path.join(out, record_schema.MANIFEST_FILE), encoding="utf-8") as handle:
        manifest = json.load(handle)
    rows = []
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            rows += [(split, row) for row in read_records(os.path.join(out, shard["file"]))]
    return manifest, rows


def test_a_csv_label_file_converts_with_splits_and_a_missing_file_is_rejected(tmp_path, sample_images, converter):
    src = tmp_path / "images"
    (src / "batch1").mkdir(parents=True)
    for name in ("a.jpg", "b.png", "c.jpg", "d.webp"):
        kind = {"a.jpg": "jpeg_rgb", "b.png": "png_rgb", "c.jpg": "jpeg_gray", "d.webp": "webp"}[name]
        (src / "batch1" / name).write_bytes(sample_images[kind])
    (src / "unlisted.jpg").write_bytes(sample_images["jpeg_rgb"])  # not in the label file: not converted
    table = tmp_path / "train.csv"
    table.write_text("path,label,split\nbatch1/a.jpg,dog,train\nbatch1/b.png,cat,train\nbatch1/c.jpg,dog,val\n"
                     "batch1/d.webp,cat,test\nbatch1/typo.jpg,cat,train\n")
    out = tmp_path / "out"
    converter("--src", str(src), "--annotations", str(table), "--out", str(out), "--shards", "1",
              "--max-bad-fraction", "0.5", *FAST, check=True)
    manifest, rows = _records(out)
    assert manifest["classes"] == ["cat", "dog"]
    got = {(split, row[record_schema.FILENAME].decode(), row[record_schema.LABEL]) for split, row in rows}
    assert got == {("train", "batch1/a.jpg", 1), ("train", "batch1/b.png", 0), ("validation", "batch1/c.jpg", 1),
                   ("test", "batch1/d.webp", 0)}
    assert manifest["rejected_by_reason"] == {"missing-file": 1}


def test_a_malformed_label_file_is_an_error_naming_the_line(tmp_path, converter):
    (tmp_path / "src").mkdir()
    table = tmp_path / "labels.csv"
    table.write_text("path,label\na.jpg,x\na.jpg,y\n")
    proc = converter("--src", str(tmp_path / "src"), "--annotations", str(table), *FAST)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: --annotations {table} lists 'a.jpg' twice: lines 2 and 3"


def test_an_imagenet_shaped_tree_converts_with_every_label_right(tmp_path, sample_images, converter):
    """train/<wnid>/*.JPEG, a flat val/ labelled by LOC_val_solution.csv, text from LOC_synset_mapping.txt,
    and ImageNet's odd files: a PNG named .JPEG, a CMYK JPEG, a grayscale JPEG."""
    src = tmp_path / "CLS-LOC"
    wnids, expected = write_imagenet_tree(src, tmp_path, sample_images)
    out = tmp_path / "imagenet-tfrecords"
    converter("--src", str(src), "--out", str(out), "--val-labels", str(tmp_path / "LOC_val_solution.csv"),
              "--synsets", str(tmp_path / "LOC_synset_mapping.txt"), "--shards", "2", *FAST, check=True)
    manifest, rows = _records(out)
    assert manifest["classes"] == sorted(wnids)
    assert manifest["class_text"] == [wnids[w] for w in sorted(wnids)]
    got = {row[record_schema.FILENAME].decode(): (split, row[record_schema.LABEL]) for split, row in rows}
    assert got == expected
    for _, row in rows:
        assert row[record_schema.LABEL_TEXT].decode() == wnids[sorted(wnids)[row[record_schema.LABEL]]]
    assert manifest["num_rejected"] == 0
    assert manifest["splits"]["train"]["reencoded_by_reason"] == {"cmyk": 1, "exif-rotated": 1, "png": 1}


def test_tiny_images_are_reported_and_min_side_rejects_them(tmp_path, sample_images, converter):
    import io

    from PIL import Image

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    for name, size in (("a/dot.png", (2, 3)), ("a/ok.png", (64, 48)), ("b/line.png", (40, 1)), ("b/ok.jpg", None)):
        if size is None:
            (src / name).write_bytes(sample_images["jpeg_rgb"])
            continue
        buffer = io.BytesIO()
        Image.new("RGB", size, "red").save(buffer, "PNG")
        (src / name).write_bytes(buffer.getvalue())
    proc = converter("--src", str(src), "--out", str(tmp_path / "kept"), "--shards", "1", *FAST, check=True)
    assert "warning: 2 images with a side under 32 px" in proc.stdout and "--min-side 32 rejects them" in proc.stdout
    assert "small images (a side under 32 px" in converter("inspect", str(tmp_path / "kept"), check=True).stdout
    proc = converter("--src", str(src), "--out", str(tmp_path / "strict"), "--shards", "1", "--min-side", "32",
                     "--max-bad-fraction", "0.5", *FAST, check=True)
    manifest, rows = _records(tmp_path / "strict")
    assert manifest["rejected_by_reason"] == {"too-small": 2} and len(rows) == 2
    assert "under 32 px" not in proc.stdout


def test_a_label_file_with_its_own_column_names_converts_with_annotation_columns(tmp_path, sample_images, converter):
    """A Kaggle-style CSV (``id,breed,fold``) read as it ships, and the flag's mistakes named."""
    src = tmp_path / "images"
    src.mkdir()
    for name in ("1.jpg", "2.jpg", "3.jpg"):
        (src / name).write_bytes(sample_images["jpeg_rgb"])
    table = tmp_path / "labels.csv"
    table.write_text("id,breed,fold,notes\n1.jpg,beagle,train,x\n2.jpg,pug,train,\n3.jpg,pug,val,y\n")
    out = tmp_path / "out"
    converter("--src", str(src), "--annotations", str(table), "--annotation-columns", "id,breed,fold",
              "--out", str(out), "--shards", "1", *FAST, check=True)
    manifest, rows = _records(out)
    assert manifest["classes"] == ["beagle", "pug"]
    got = {(split, row[record_schema.FILENAME].decode(), row[record_schema.LABEL]) for split, row in rows}
    assert got == {("train", "1.jpg", 0), ("train", "2.jpg", 1), ("validation", "3.jpg", 1)}

    proc = converter("--src", str(src), "--annotations", str(table), *FAST)  # the default names are not there
    assert proc.returncode == 1
    assert "'path' and 'label'" in proc.stderr and str(table) in proc.stderr and "'id', 'breed'" in proc.stderr
    for bad in ("id", "id,id", "id,,fold", "a,b,c,d"):
        proc = converter("--src", str(src), "--annotations", str(table), "--annotation-columns", bad, *FAST)
        assert proc.returncode == 2 and "--annotation-columns takes two or three different column names" in proc.stderr
    proc = converter("--src", str(src), "--annotation-columns", "id,breed", *FAST)
    assert proc.returncode == 2 and "give that file too" in proc.stderr


def test_a_kaggle_csv_of_ids_without_extensions_finds_each_file_and_names_what_it_looked_for(
        tmp_path, sample_images, converter):
    """Kaggle's dog-breed release: ``labels.csv`` of ``id,breed`` for ``train/<id>.jpg``."""
    src = tmp_path / "dog-breed"
    (src / "train").mkdir(parents=True)
    (src / "train" / "000bec180eb18c7604dcecc8fe0dba07.jpg").write_bytes(sample_images["jpeg_rgb"])
    (src / "train" / "001513dfcb2ffafc82cccf4d8bbaba97.JPG").write_bytes(sample_images["jpeg_gray"])
    (src / "train" / "001cdf01b096e06d78e9e5112d419397.png").write_bytes(sample_images["png_rgb"])
    table = tmp_path / "labels.csv"
    table.write_text("id,breed\n000bec180eb18c7604dcecc8fe0dba07,boston_bull\n001513dfcb2ffafc82cccf4d8bbaba97,dingo\n"
                     "001cdf01b096e06d78e9e5112d419397,pekinese\n00214f311d5d2247d5dfe4fe24b2303d,bluetick\n")
    out = tmp_path / "out"
    converter("--src", str(src / "train"), "--annotations", str(table), "--annotation-columns", "id,breed",
              "--out", str(out), "--shards", "1", "--max-bad-fraction", "0.5", *FAST, check=True)
    manifest, rows = _records(out)
    got = {row[record_schema.FILENAME].decode() for _, row in rows}
    assert got == {"000bec180eb18c7604dcecc8fe0dba07.jpg", "001513dfcb2ffafc82cccf4d8bbaba97.JPG",
                   "001cdf01b096e06d78e9e5112d419397.png"}
    (rejected,) = [json.loads(line) for line in (out / record_schema.REJECTED_FILE).read_text().splitlines()]
    assert rejected == {"path": "00214f311d5d2247d5dfe4fe24b2303d", "reason": "missing-file",
                        "detail": "listed, but --src has no file 00214f311d5d2247d5dfe4fe24b2303d, nor one named "
                                  "00214f311d5d2247d5dfe4fe24b2303d plus an image extension (.jpg, .png, ...)"}

    (src / "train" / "000bec180eb18c7604dcecc8fe0dba07.png").write_bytes(sample_images["png_rgb"])
    proc = converter("--src", str(src / "train"), "--annotations", str(table), "--annotation-columns", "id,breed",
                     "--out", str(tmp_path / "again"), *FAST)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: --annotations {table} line 2 lists '000bec180eb18c7604dcecc8fe0dba07', which could be "
        "000bec180eb18c7604dcecc8fe0dba07.jpg and 000bec180eb18c7604dcecc8fe0dba07.png; list the file with its "
        "extension")


def test_a_hub_snapshot_converts_from_the_cli_and_its_flags_are_named_in_errors(tmp_path, converter):
    from tests import hub_data

    hub_data.write_split(str(tmp_path / "snap" / "plain_text"), "train", hub_data.rows(9, 0), image_column="img")
    hub_data.write_split(str(tmp_path / "snap" / "other"), "train", hub_data.rows(3, 9))
    proc = converter("--src", str(tmp_path / "snap"), "--out", str(tmp_path / "out"), "--shards", "1",
                     "--no-progress")
    assert proc.returncode == 1 and "pick one with --config NAME" in proc.stderr, proc.stderr
    proc = converter("--src", str(tmp_path / "snap"), "--out", str(tmp_path / "out"), "--shards", "1",
                     "--config", "plain_text", "--no-progress", check=True)
    assert "train 9 (1 shard)" in proc.stdout
    assert (tmp_path / "out" / "labels.txt").read_text() == "zebra\nant\nmole\n"
    proc = converter("--src", str(tmp_path / "snap"), "--out", str(tmp_path / "o2"), "--config", "other",
                     "--image-column", "nope", "--no-progress")
    assert proc.returncode == 1 and "--image-column 'nope'" in proc.stderr and "its columns are" in proc.stderr
