"""``python -m converter verify`` and ``inspect`` on healthy and damaged datasets."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import record_schema
from reader.tools.verify import verify
from record_files.tfrecord import frame_record, serialize_example


@pytest.fixture
def damaged(tmp_path, demo_dataset):
    copy = tmp_path / "copy"
    shutil.copytree(demo_dataset, copy)
    return copy


def _shard(folder, split="train", index=0, count=4):
    return folder / record_schema.shard_filename(split, index, count)


@pytest.mark.e2e
def test_a_healthy_dataset_verifies_and_exits_zero(demo_dataset, converter):
    report = verify(demo_dataset)
    assert report.ok and report.records_checked == 90 and report.images_decoded == 90
    proc = converter("verify", demo_dataset, "--sample", "2", check=True)
    assert "OK" in proc.stdout and "5 shards, 90 records, 10 images decoded" in proc.stdout


@pytest.mark.e2e
def test_damage_is_reported_per_shard_and_record(damaged, converter):
    data = bytearray(_shard(damaged, index=1).read_bytes())
    data[len(data) // 2] ^= 0x55  # a flipped bit inside some record
    _shard(damaged, index=1).write_bytes(bytes(data))
    os.remove(_shard(damaged, index=2))  # a listed shard is gone
    shutil.copy(_shard(damaged, index=0), damaged / record_schema.shard_filename("train", 0, 7))  # stale leftover
    report = verify(str(damaged))
    messages = [str(p) for p in report.problems]
    assert any("train-00001-of-00004.tfrecord record" in m and "CRC mismatch" in m for m in messages)
    assert any(m.startswith("train-00002-of-00004.tfrecord: listed in the manifest but missing") for m in messages)
    assert any(m.startswith("train-00000-of-00007.tfrecord: shard file not listed") for m in messages)
    assert report.damaged_files() == ["train-00000-of-00007.tfrecord", "train-00001-of-00004.tfrecord",
                                      "train-00002-of-00004.tfrecord"]
    proc = converter("verify", str(damaged))
    assert proc.returncode == 1 and "train-00001-of-00004.tfrecord" in proc.stdout


def test_a_missing_or_changed_records_table_is_named(damaged):
    tables = {split: damaged / record_schema.records_table_filename(split) for split in ("train", "validation")}
    data = bytearray(tables["train"].read_bytes())
    data[len(data) // 2] ^= 0x55
    tables["train"].write_bytes(bytes(data))
    os.remove(tables["validation"])
    messages = [str(p) for p in verify(str(damaged)).problems]
    assert messages == ["train.records.parquet: records table differs from the manifest (size or SHA-256)",
                        "validation.records.parquet: records table listed in the manifest but missing"]


def test_a_records_table_whose_rows_are_not_its_records_is_named(damaged):
    """A table listed with its own hash but rows of other records (two swapped): verify reads it beside the
    shards and names the first record whose row differs."""
    import hashlib
    import io

    from record_files import records_table

    path = damaged / record_schema.records_table_filename("train")
    table = records_table.RecordsTable(str(path))
    rows = [row for group in table.row_groups() for row in group.to_pylist()]
    rows[3], rows[4] = {**rows[4], "index": 3, "offset": rows[3]["offset"]}, {**rows[3], "index": 4,
                                                                             "offset": rows[4]["offset"]}
    parts = []
    for shard in sorted({row["shard"] for row in rows}):
        part = io.BytesIO()
        writer = records_table.TableWriter(part, shard)
        for row in (r for r in rows if r["shard"] == shard):
            writer.add(*(row[name] for name in records_table.COLUMNS[1:]))
        writer.close("train", table.stats("train"))
        parts.append(io.BytesIO(part.getvalue()))
    out = io.BytesIO()
    written = records_table.join_tables(parts, out, "train")
    path.write_bytes(out.getvalue())
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["splits"]["train"]["records_table"].update(num_bytes=written.num_bytes, sha256=written.sha256)
    assert written.sha256 == hashlib.sha256(out.getvalue()).hexdigest()
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    messages = [str(p) for p in verify(str(damaged)).problems]
    assert len(messages) == 1 and messages[0].startswith(
        "train.records.parquet: its row differs from the record in ") and "(shard " in messages[0], messages
    assert "path" in messages[0] and "sha256" in messages[0]


def test_records_with_bad_labels_hashes_or_images_are_named(damaged, sample_images):
    import hashlib

    def record(image, label, sha=None):
        return serialize_example({
            record_schema.IMAGE_ENCODED: image, record_schema.IMAGE_FORMAT: b"jpeg", record_schema.LABEL: label,
            record_schema.LABEL_TEXT: b"square", record_schema.HEIGHT: 120, record_schema.WIDTH: 160,
            record_schema.CHANNELS: 3, record_schema.FILENAME: b"x",
            record_schema.SHA256: sha or hashlib.sha256(image).hexdigest().encode(),
        })

    jpeg = sample_images["jpeg_rgb"]
    records = [record(jpeg, 1, sha=b"0" * 64), record(b"not a jpeg", 1), record(jpeg, 7),
               serialize_example({"only": 1}), record(jpeg, 2)]
    _shard(damaged, "validation", 0, 1).write_bytes(b"".join(frame_record(r) for r in records))
    found = verify(str(damaged)).problems
    problems = [p for p in found if p.file.startswith("validation-")]  # the shard's records
    table = [p for p in found if p.file == "validation.records.parquet"]  # its records table no longer matches
    assert table and "(shard 0 record 0)" in table[0].message
    assert [(p.record, p.message.split(":")[0]) for p in problems[:4]] == [
        (0, "SHA-256 of image/encoded does not match image/key/sha256"),
        (1, "image does not decode"),
        (2, "label 7 is outside 0..2"),
        (3, "missing keys ['image/encoded', 'image/format', 'image/class/label', 'image/class/text', "
            "'image/height', 'image/width', 'image/channels', 'image/filename', 'image/key/sha256']"),
    ]
    assert [p.message for p in problems[4:]][0] == "5 records, the manifest says 18"


@pytest.mark.e2e
def test_a_folder_without_manifest_is_an_error(tmp_path, converter):
    proc = converter("verify", str(tmp_path))
    assert proc.returncode == 1 and "manifest.json" in proc.stderr


@pytest.mark.e2e
def test_inspect_shows_counts_shards_rejections_duplicates_and_writes_a_contact_sheet(tmp_path, demo_src, converter,
                                                                                       sample_images):
    src = tmp_path / "src"
    for split in ("train", "test"):
        shutil.copytree(os.path.join(demo_src, "circle"), src / split / "circle")
    shutil.copytree(os.path.join(demo_src, "square"), src / "train" / "square")
    shutil.copy(src / "train" / "circle" / "circle_0001.jpg", src / "train" / "square" / "copy.jpg")
    (src / "train" / "square" / "broken.jpg").write_bytes(sample_images["truncated_jpeg"])
    (src / "train" / "square" / "Thumbs.db").write_bytes(b"thumbnail cache")
    out = tmp_path / "out"
    proc = converter("--src", str(src), "--out", str(out), "--shards", "2", "--no-progress",
                     "--direct_running_mode=in_memory", check=True)
    assert "identical images under two labels: 1 group; in two splits: 30 groups" in proc.stdout
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    assert manifest["duplicates"]["num_cross_split"] == 30 and manifest["duplicates"]["num_cross_label"] == 1

    grid = tmp_path / "sheet.png"
    proc = converter("inspect", str(out), "--grid", str(grid), check=True)
    lines = proc.stdout.splitlines()
    assert any(line.split() == ["0", "circle", "30", "30"] for line in lines)
    assert any(line.split() == ["1", "square", "31", "0"] for line in lines)
    assert "skipped without reading: 1 (system-file: 1)" in lines
    assert "  undecodable: 1 (train/square/broken.jpg)" in lines
    assert "  under two labels (label noise): 1" in lines
    assert "  in two splits (train/test leakage): 30" in lines
    from PIL import Image

    sheet = Image.open(grid)
    assert sheet.size[1] == 2 * (96 + 4)  # one row per class


@pytest.mark.e2e
def test_inspect_names_an_unknown_split_before_printing_anything(demo_dataset, converter):
    proc = converter("inspect", demo_dataset, "--split", "test")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == f"error: split 'test' is not in {demo_dataset}; its splits are ['train', 'validation']"


@pytest.mark.e2e
def test_inspect_shows_each_class_text_beside_its_name(damaged, converter):
    manifest = json.loads((damaged / record_schema.MANIFEST_FILE).read_text())
    manifest["class_text"] = ["round thing", "four corners", "three corners"]
    (damaged / record_schema.MANIFEST_FILE).write_text(json.dumps(manifest))
    lines = converter("inspect", str(damaged), check=True).stdout.splitlines()
    assert lines[2].split() == ["label", "class", "text", "train", "validation"]
    assert lines[3].split()[:4] == ["0", "circle", "round", "thing"]


@pytest.mark.e2e
def test_a_contact_sheet_of_a_corrupt_shard_names_the_file_and_the_record(damaged, tmp_path, converter):
    shard = _shard(damaged)
    data = bytearray(shard.read_bytes())
    data[40] ^= 0xFF  # inside the first record's data
    shard.write_bytes(bytes(data))
    proc = converter("inspect", str(damaged), "--grid", str(tmp_path / "sheet.png"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: cannot draw the contact sheet: {shard} record 0: data CRC mismatch. "
        f"python -m converter verify {damaged} checks every shard")


@pytest.mark.e2e  # asks fontconfig (fc-list, a process) for the fonts that draw the names
def test_the_contact_sheet_draws_accented_and_cyrillic_class_names_and_names_what_no_font_has():
    from PIL import ImageFont

    from reader.tools.contact_sheet import LabelFonts, _has_glyph

    assert not _has_glyph(ImageFont.load_default(14), "л")  # Pillow's own font drew лиса as boxes
    fonts = LabelFonts()
    assert all(_has_glyph(fonts.for_char(char), char) for char in "café лиса")
    assert not fonts.missing
    fonts.for_char("\U0010fffd")
    assert fonts.missing == {"\U0010fffd"}  # reported, as 猫 is on a machine without a CJK font
