"""The Hub's objects (cppe-5's layout) and Sequence(ClassLabel) columns, written by ``datasets`` itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from tests.object_data import jpeg, object_records, picture, red_fraction

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
NAMES = ["Coverall", "Face_Shield", "Gloves"]


def _write(folder, rows: list[dict], tags: bool = False) -> None:
    import datasets

    features = {"image_id": datasets.Value("int64"), "image": datasets.Image(), "width": datasets.Value("int32"),
                "height": datasets.Value("int32")}
    if tags:
        features["tags"] = datasets.Sequence(datasets.ClassLabel(names=NAMES))
    else:
        features["objects"] = datasets.Sequence({"id": datasets.Value("int64"), "area": datasets.Value("int64"),
                                                 "bbox": datasets.Sequence(datasets.Value("float32"), length=4),
                                                 "category": datasets.ClassLabel(names=NAMES)})
    columns = {key: [row[key] for row in rows] for key in features}
    folder.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(columns, features=datasets.Features(features)).to_parquet(
        str(folder / "train-00000-of-00001.parquet"))


def _row(image_id: int, boxes, categories, size=(80, 48)) -> dict:
    data = jpeg(picture(*size, [tuple(int(v) for v in (x, y, x + w, y + h)) for x, y, w, h in boxes], seed=image_id))
    return {"image_id": image_id, "image": {"bytes": data, "path": f"{image_id}.jpg"}, "width": size[0],
            "height": size[1], "objects": {"id": list(range(len(boxes))), "area": [int(w * h) for *_, w, h in boxes],
                                           "bbox": [list(map(float, b)) for b in boxes], "category": categories}}


@pytest.mark.slow
def test_cppe5_style_objects_keep_the_hubs_ids_and_their_boxes(tmp_path):
    _write(tmp_path / "cppe5" / "data", [_row(7, [(10, 5, 20, 15), (50, 30, 20, 14)], [2, 0]),
                                         _row(8, [], []), _row(9, [(1, 1, 500, 5)], [1])])
    out = tmp_path / "ds"
    # Row 9 is written without its box past the edge (--keep-partial-images; by default it is rejected).
    run(ConvertOptions(src=str(tmp_path / "cppe5"), out=str(out), shards=1, max_bad_fraction=0.5,
                       encode=EncodeOptions(keep_partial_images=True)), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    # The ClassLabel's ids, one higher: the records' id 0 is the background.
    assert manifest["task"] == "objects" and manifest["classes"] == [""] + NAMES
    assert manifest["class_id_offset"] == 1
    records = {r["image/source_id"][0]: r for r in object_records(out).values()}
    first = records[b"7"]
    assert first["image/object/class/label"] == [3, 1]
    assert np.allclose(first["boxes"], [(10 / 80, 5 / 48, 30 / 80, 20 / 48), (50 / 80, 30 / 48, 70 / 80, 44 / 48)])
    for box in first["boxes"]:
        assert red_fraction(first["pixels"], box) > 0.9
    assert records[b"8"]["boxes"] == []
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["reason"], r["annotation"]) for r in rejected] == [
        ("box-outside-image", "data/train-00000-of-00001.parquet row group 0 row 2 object 1")]


@pytest.mark.slow
def test_yolo_boxes_are_read_with_bbox_format(tmp_path):
    row = _row(7, [(10, 5, 20, 15)], [1])
    row["objects"]["bbox"] = [[20 / 80, 12.5 / 48, 20 / 80, 15 / 48]]  # cx, cy, w, h normalized
    _write(tmp_path / "y" / "data", [row])
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(tmp_path / "y"), out=str(out), shards=1, bbox_format="yolo"), FAST, show_progress=False)
    record = next(iter(object_records(out).values()))
    assert np.allclose(record["boxes"], [(10 / 80, 5 / 48, 30 / 80, 20 / 48)])


@pytest.mark.slow
def test_a_sequence_of_class_labels_is_several_labels_an_image(tmp_path):
    rows = [{**_row(i, [], []), "tags": tags} for i, tags in enumerate([[2, 0], [], [1, 1]])]
    _write(tmp_path / "t" / "data", rows, tags=True)
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(tmp_path / "t"), out=str(out), shards=1), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "multilabel" and manifest["classes"] == NAMES
    labels = sorted(r.get("image/class/label", []) for r in object_records(out).values())
    assert labels == [[], [0, 2], [1]]


def test_bbox_format_on_a_dataset_without_objects_is_an_error_naming_it(tmp_path):
    rows = [{**_row(i, [], []), "tags": [0]} for i in range(2)]
    _write(tmp_path / "t" / "data", rows, tags=True)
    with pytest.raises(InputError, match="--bbox-format"):
        run(ConvertOptions(src=str(tmp_path / "t"), out=str(tmp_path / "ds"), bbox_format="yolo"), FAST,
            show_progress=False)
