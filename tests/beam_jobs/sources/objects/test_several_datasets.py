"""A folder holding several datasets is refused naming each and the command that converts it (issue #57 case 4).

A Parquet file beside COCO, CVAT and YOLO datasets made the folder a Parquet dataset ("no ClassLabel column ...
--label-column"); following that advice published its rows alone, exit 0, the other datasets' images ignored.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from tests.object_data import jpeg, picture, write_file


@pytest.fixture
def shelf(tmp_path):
    """COCO, CVAT and YOLO datasets side by side, and a pandas-written Parquet file of image bytes and labels."""
    image = jpeg(picture(16, 16, []))
    write_file(str(tmp_path / "coco/annotations/instances_val2017.json"), json.dumps(
        {"images": [{"id": 1, "file_name": "a.jpg", "width": 16, "height": 16}], "annotations": [],
         "categories": [{"id": 1, "name": "cat"}]}))
    write_file(str(tmp_path / "coco/val2017/a.jpg"), image)
    write_file(str(tmp_path / "task/annotations.xml"), "<annotations><meta/></annotations>")
    write_file(str(tmp_path / "task/images/b.jpg"), image)
    write_file(str(tmp_path / "shapes/data.yaml"), "train: images/train\nnames: [square]\n")
    write_file(str(tmp_path / "shapes/images/train/c.jpg"), image)
    write_file(str(tmp_path / "shapes/labels/train/c.txt"), "0 0.5 0.5 0.5 0.5\n")
    pd.DataFrame({"image": [{"bytes": image, "path": "d.jpg"}], "label": ["cat"]}).to_parquet(tmp_path / "rows.parquet")
    return tmp_path


@pytest.mark.parametrize("flags", [{}, {"label_column": "label"}])
def test_a_parquet_file_beside_other_datasets_never_claims_the_folder(shelf, flags):
    with pytest.raises(InputError) as raised:
        plan_inputs(ConvertOptions(src=str(shelf), **flags))
    message = str(raised.value)
    assert "holds datasets, not classes: coco/ (COCO), rows.parquet (Parquet), shapes/ (YOLO), task/ (CVAT for " \
           "images)" in message
    for name in ("coco", "rows.parquet", "shapes", "task"):
        assert f"python -m converter --src {shelf / name}" in message


def test_without_the_parquet_file_the_folder_is_refused_the_same_and_the_parquet_file_alone_converts(shelf):
    parquet = shelf / "rows.parquet"
    moved = shelf.parent / "rows.parquet"
    parquet.rename(moved)
    with pytest.raises(InputError, match=r"holds datasets, not classes: coco/ \(COCO\), shapes/ \(YOLO\), task/"):
        plan_inputs(ConvertOptions(src=str(shelf)))
    assert len(plan_inputs(ConvertOptions(src=str(moved), label_column="label")).refs) == 1
