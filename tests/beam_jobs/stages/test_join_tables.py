"""The records tables a real conversion writes: a row per record, in record order, holding what the record holds
(its place and offset, class ids, size, image bytes, SHA-256, file name) and its perceptual hash; listed in the
manifest with their size and SHA-256; the same bytes when converted again."""

from __future__ import annotations

import hashlib
import json
import os

import tensorflow as tf
import pytest

import record_schema
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from record_files.records_table import RecordsTable
from tests.object_data import jpeg, picture, write_coco

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _records(path: str) -> list[dict]:
    rows = []
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
        feature = tf.train.Example.FromString(raw).features.feature
        rows.append({key: (list(value.int64_list.value) or list(value.bytes_list.value))
                     for key, value in feature.items()})
    return rows


def _check_tables(out: str, object_labels: bool = False) -> dict:
    manifest = json.load(open(os.path.join(out, record_schema.MANIFEST_FILE)))
    for split, entry in manifest["splits"].items():
        listed = entry["records_table"]
        path = os.path.join(out, listed["file"])
        assert listed["file"] == record_schema.records_table_filename(split)
        data = open(path, "rb").read()
        assert listed["num_bytes"] == len(data) and listed["sha256"] == hashlib.sha256(data).hexdigest()
        table = RecordsTable(path)
        rows = [row for group in table.row_groups() for row in group.to_pylist()]
        assert len(rows) == listed["num_rows"] == entry["num_examples"]
        expected = []
        for shard, shard_entry in enumerate(entry["shards"]):
            offsets = [int(line.split()[0]) for line in open(os.path.join(out, shard_entry["dali_index"]))]
            for index, record in enumerate(_records(os.path.join(out, shard_entry["file"]))):
                classes = record[record_schema.OBJECT_LABEL if object_labels else record_schema.LABEL] \
                    if (record_schema.OBJECT_LABEL if object_labels else record_schema.LABEL) in record else []
                expected.append({
                    "shard": shard, "index": index, "offset": offsets[index], "classes": classes,
                    "width": record[record_schema.WIDTH][0], "height": record[record_schema.HEIGHT][0],
                    "image_bytes": len(record[record_schema.IMAGE_ENCODED][0]),
                    "sha256": bytes.fromhex(record[record_schema.SHA256][0].decode()),
                    "path": record[record_schema.FILENAME][0].decode()})
        assert [{k: v for k, v in row.items() if k != "perceptual_hash"} for row in rows] == expected
        assert table.stats(split).images == entry["num_examples"]
    return manifest


def test_a_conversion_writes_each_splits_records_table_listed_in_its_manifest(demo_dataset):
    manifest = _check_tables(demo_dataset)
    assert set(manifest["splits"]) == {"train", "validation"}
    rows = RecordsTable(os.path.join(demo_dataset, "train.records.parquet")).row_group(0, ["perceptual_hash"])
    assert None not in rows.column("perceptual_hash").to_pylist()  # the run took perceptual hashes


@pytest.mark.slow
def test_object_records_list_each_objects_class_and_reruns_write_the_same_bytes(tmp_path):
    boxes = {"a.jpg": [(10, 10, 30, 30, 1), (100, 50, 150, 90, 2), (0, 0, 20, 20, 2)], "b.jpg": [], "c.jpg": [(5, 5, 60, 60, 3)]}
    images, annotations, files = [], [], {}
    for index, (name, objects) in enumerate(boxes.items()):
        images.append({"id": index + 1, "file_name": name, "width": 192, "height": 144})
        files[name] = jpeg(picture(192, 144, [box[:4] for box in objects], seed=index))
        for x0, y0, x1, y1, category in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": index + 1, "category_id": category,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    write_coco(str(tmp_path / "coco"), "train2017", images, annotations,
               [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}, {"id": 3, "name": "owl"}], files)
    digests = []
    for out in ("one", "two"):
        run(ConvertOptions(src=str(tmp_path / "coco"), out=str(tmp_path / out), shards=2,
                           encode=EncodeOptions(perceptual_hash=False)), FAST, show_progress=False)
        _check_tables(str(tmp_path / out), object_labels=True)
        digests.append(hashlib.sha256(open(tmp_path / out / "train.records.parquet", "rb").read()).hexdigest())
    assert digests[0] == digests[1]
    table = RecordsTable(str(tmp_path / "one" / "train.records.parquet"))
    assert sorted(map(sorted, (r["classes"] for r in table.row_group(0).to_pylist() + table.row_group(1).to_pylist()))) \
        == [[], [1, 2, 2], [3]]
    assert set(table.row_group(0, ["perceptual_hash"]).column(0).to_pylist()) == {None}  # --no-near-duplicates
