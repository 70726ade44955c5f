"""Ultralytics YOLO as it ships converts with its class indexes, labels in the upright frame, bad lines named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from tests.object_data import object_records, jpeg, picture, red_fraction, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _label(box, width, height, label):
    x0, y0, x1, y1 = box
    return f"{label} {(x0 + x1) / 2 / width} {(y0 + y1) / 2 / height} {(x1 - x0) / width} {(y1 - y0) / height}\n"


@pytest.fixture(scope="module")
def yolo_tree(tmp_path_factory):
    """Roboflow's layout (``../train/images`` in data.yaml) and a path: on the author's machine."""
    root = tmp_path_factory.mktemp("yolo") / "shapes"
    write_file(str(root / "data.yaml"), "path: ../datasets/shapes  # the author's machine\n"
               "train: ../train/images\nval: valid/images\nnames:\n  0: square\n  1: bar\n  2: dot\n")
    boxes = [(10, 5, 30, 20), (50, 30, 70, 44)]
    write_file(str(root / "train/images/a.jpg"), jpeg(picture(80, 48, boxes, seed=1), orientation=6))
    write_file(str(root / "train/labels/a.txt"), _label(boxes[0], 80, 48, 0) + _label(boxes[1], 80, 48, 2)
               + "7 0.5 0.5 0.1 0.1\n" + "1 0.5 oops\n")
    # A polygon line: its extent is the box.
    write_file(str(root / "train/images/b.jpg"), jpeg(picture(64, 64, [(16, 16, 48, 40)], seed=2)))
    write_file(str(root / "train/labels/b.txt"), "1 0.25 0.25 0.75 0.25 0.75 0.625 0.25 0.625\n")
    write_file(str(root / "valid/images/c.jpg"), jpeg(picture(40, 40, [], seed=3)))  # no label file: background
    return root


def test_yolo_labels_convert_with_their_indexes_on_their_objects(yolo_tree, tmp_path):
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(yolo_tree), out=str(out), shards=1, max_bad_fraction=0.5), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    # YOLO's index 0 is a class; the records' id 0 is the background (Model Garden, the OD API): ids one higher.
    assert manifest["classes"] == ["", "square", "bar", "dot"] and manifest["task"] == "objects"
    assert manifest["class_id_offset"] == 1
    assert "id: 0" not in (out / "label_map.pbtxt").read_text()
    records = object_records(out)
    a = records["train/images/a.jpg"]
    assert a["image/object/class/label"] == [1, 3] and a["image/object/class/text"] == [b"square", b"dot"]
    assert a["pixels"].shape[:2] == (48, 80)
    for box in a["boxes"]:
        assert red_fraction(a["pixels"], box) > 0.9  # labels are upright: EXIF turned the pixels, not the boxes
    b = records["train/images/b.jpg"]
    assert np.allclose(b["boxes"], [(0.25, 0.25, 0.75, 0.625)]) and red_fraction(b["pixels"], b["boxes"][0]) > 0.9
    assert records["valid/images/c.jpg"]["boxes"] == []
    assert int(a["image/source_id"][0]) > 0  # a stable number derived from the path
    lines = {line["annotation"]: line["reason"] for line in map(json.loads, (out / "rejected.jsonl").read_text()
                                                                .splitlines())}
    assert lines == {"train/labels/a.txt line 3": "unknown-class", "train/labels/a.txt line 4": "bad-annotation"}


def test_a_split_folder_the_yaml_names_that_is_not_there_is_an_error_naming_it(tmp_path):
    write_file(str(tmp_path / "ds/data.yaml"), "train: images/train\nnames: [a]\n")
    write_file(str(tmp_path / "ds/images/val/x.jpg"), jpeg(picture(8, 8, [])))
    with pytest.raises(InputError, match="data.yaml: train: images/train is not a folder"):
        run(ConvertOptions(src=str(tmp_path / "ds"), out=str(tmp_path / "out")), FAST, show_progress=False)


def test_val_fraction_carves_validation_out_of_an_object_datasets_train_split(tmp_path):
    """Unstratified (an image holds several classes), by the keyed hash of its path: the same images every run."""
    root = tmp_path / "ds"
    write_file(str(root / "data.yaml"), "train: images/train\nnames: [a, b]\n")
    for i in range(10):
        write_file(str(root / f"images/train/{i}.jpg"), jpeg(picture(16, 16, [], seed=i)))
        write_file(str(root / f"labels/train/{i}.txt"), f"{i % 2} 0.5 0.5 0.5 0.5\n")
    outs = []
    for name in ("one", "two"):
        out = tmp_path / name
        run(ConvertOptions(src=str(root), out=str(out), shards=1, val_fraction=0.3), FAST, show_progress=False)
        outs.append(out)
    manifest = json.loads((outs[0] / "manifest.json").read_text())
    assert {split: s["num_examples"] for split, s in manifest["splits"].items()} == {"train": 7, "validation": 3}
    assert (outs[0] / "validation-00000-of-00001.tfrecord").read_bytes() == \
        (outs[1] / "validation-00000-of-00001.tfrecord").read_bytes()
