"""Ultralytics YOLO as it ships converts with its class indexes, labels in the upright frame, bad lines named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_jobs.options import ConvertOptions, EncodeOptions
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
    # a.jpg keeps its good objects beside its bad lines (--keep-partial-images; by default it is rejected whole).
    run(ConvertOptions(src=str(yolo_tree), out=str(out), shards=1, max_bad_fraction=0.5,
                       encode=EncodeOptions(keep_partial_images=True)), FAST, show_progress=False)
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


@pytest.mark.slow
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


def _plan(root, **options):
    from beam_jobs import sources

    return sources.plan_inputs(ConvertOptions(src=str(root), out=str(root) + "-out", **options))


def _objects_of(plan):
    from beam_jobs import annotations

    return {ref.relpath: (ref.split, [(box.label, box.name) for box in annotations.decode(ref.annotation).boxes])
            for ref in plan.refs}


def test_ultralytics_coco8_layout_with_its_yaml_named_after_the_dataset(tmp_path):
    """coco8 as Ultralytics ships it: coco8.yaml (path: on the author's machine), images/{train,val}, labels/."""
    root = tmp_path / "coco8"
    write_file(str(root / "coco8.yaml"), "# Ultralytics YOLO, AGPL-3.0 license\npath: ../datasets/coco8\n"
               "train: images/train\nval: images/val\ntest: # test images (optional)\n\n"
               "names:\n  0: person\n  1: bicycle\n  2: car\n"
               "download: https://github.com/ultralytics/assets/releases/download/v0.0.0/coco8.zip\n")
    write_file(str(root / "LICENSE"), "AGPL-3.0\n")
    write_file(str(root / "README.md"), "# coco8\n")
    write_file(str(root / "images/train/000000000009.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(root / "labels/train/000000000009.txt"), "0 0.5 0.5 0.5 0.5\n2 0.25 0.25 0.1 0.1\n")
    write_file(str(root / "images/val/000000000036.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(root / "labels/val/000000000036.txt"), "1 0.5 0.5 0.5 0.5\n")
    plan = _plan(root)
    assert plan.task == "objects" and plan.classes == ("", "person", "bicycle", "car") and plan.class_id_offset == 1
    assert _objects_of(plan) == {
        "images/train/000000000009.jpg": ("train", [(1, "labels/train/000000000009.txt line 1"),
                                                    (3, "labels/train/000000000009.txt line 2")]),
        "images/val/000000000036.jpg": ("validation", [(2, "labels/val/000000000036.txt line 1")])}


def test_roboflow_yolo_export_without_a_test_folder_is_a_note_not_an_error(tmp_path):
    root = tmp_path / "rf"
    write_file(str(root / "data.yaml"), "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\n"
               "nc: 2\nnames: ['cat', 'dog']\n\nroboflow:\n  workspace: w\n  project: p\n  version: 1\n")
    write_file(str(root / "README.roboflow.txt"), "exported via roboflow.com\n")
    for split in ("train", "valid"):
        write_file(str(root / f"{split}/images/a_jpg.rf.0123abcd.jpg"), jpeg(picture(16, 16, [])))
        write_file(str(root / f"{split}/labels/a_jpg.rf.0123abcd.txt"), "1 0.5 0.5 0.5 0.5\n")
    plan = _plan(root)
    assert sorted(split for split, _ in _objects_of(plan).values()) == ["train", "validation"]
    assert any("test: ../test/images is not there" in warning for warning in plan.warnings)


def test_label_studio_yolo_export_reads_classes_txt_beside_images_and_labels(tmp_path):
    root = tmp_path / "ls"
    write_file(str(root / "classes.txt"), "Airplane\nCar\n")
    write_file(str(root / "notes.json"), json.dumps({"categories": [{"id": 0, "name": "Airplane"},
                                                                     {"id": 1, "name": "Car"}], "info": {}}))
    write_file(str(root / "images/1a2b3c4d-photo.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(root / "labels/1a2b3c4d-photo.txt"), "1 0.5 0.5 0.5 0.5\n")
    write_file(str(root / "labels/gone.txt"), "0 0.5 0.5 0.5 0.5\n")  # its image was not exported
    plan = _plan(root, val_fraction=0.0)
    assert plan.classes == ("", "Airplane", "Car")
    assert _objects_of(plan) == {"images/1a2b3c4d-photo.jpg": ("train", [(2, "labels/1a2b3c4d-photo.txt line 1")])}
    assert any("1 label files have no image" in w and "labels/gone.txt" in w for w in plan.warnings)


def test_several_yaml_files_and_no_data_yaml_is_an_error_naming_them(tmp_path):
    root = tmp_path / "two"
    write_file(str(root / "a.yaml"), "train: images/train\nnames: [x]\n")
    write_file(str(root / "b.yaml"), "train: images/train\nnames: [y]\n")
    write_file(str(root / "images/train/i.jpg"), jpeg(picture(8, 8, [])))
    write_file(str(root / "labels/train/i.txt"), "0 0.5 0.5 0.5 0.5\n")
    with pytest.raises(InputError, match=r"several yaml files \(a.yaml, b.yaml\)"):
        _plan(root)


@pytest.mark.parametrize("lines, error", [
    ("square\nbar\ndot\n", None),
    ("square\n", r"at line 2 \('none' where the dataset has 'bar'\)"),
    ("square\nbar\ndot\nmore\n", r"at line 4 \('more' where the dataset has 'none'\)"),
    ("bar\nsquare\ndot\n", r"at line 1 \('bar' where the dataset has 'square'\)"),
])
def test_labels_is_checked_against_the_classes_a_dataset_numbers_itself_whole(yolo_tree, tmp_path, lines, error):
    write_file(str(tmp_path / "labels.txt"), lines)
    if error is None:
        assert _plan(yolo_tree, labels_file=str(tmp_path / "labels.txt")).classes == ("", "square", "bar", "dot")
        return
    with pytest.raises(InputError, match=error):
        _plan(yolo_tree, labels_file=str(tmp_path / "labels.txt"))


def test_label_files_that_belong_to_no_image_fail_the_plan_instead_of_publishing_no_objects(tmp_path):
    """Labels named x.jpg.txt (not Ultralytics' x.txt) matched nothing: the run published 0 objects, exit 0."""
    root = tmp_path / "pets"
    write_file(str(root / "pets.yaml"), "train: images/train\nnames: [cat]\n")
    write_file(str(root / "images/train/x.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(root / "labels/train/x.jpg.txt"), "0 0.5 0.5 0.5 0.5\n")
    with pytest.raises(InputError, match=r"none of the 1 label files belongs to an image: .* the first one found is "
                                         r"labels/train/x.jpg.txt"):
        _plan(root)


def test_images_in_no_folder_the_yaml_names_are_counted_and_named_and_colab_paths_are_found_inside(tmp_path):
    root = tmp_path / "rf"
    write_file(str(root / "data.yaml"), "train: /content/pets-3/train/images\nval: /content/pets-3/valid/images\n"
               "nc: 1\nnames: [cat]\n")
    for split in ("train", "valid", "test"):  # test: not in the yaml (Roboflow leaves it out when empty)
        write_file(str(root / f"{split}/images/a.jpg"), jpeg(picture(16, 16, [])))
        write_file(str(root / f"{split}/labels/a.txt"), "0 0.5 0.5 0.5 0.5\n")
    plan = _plan(root)
    assert sorted(split for split, _ in _objects_of(plan).values()) == ["train", "validation"]
    assert plan.skipped == {"not-in-yaml-folders": 2}  # test/images/a.jpg and its label file, each named
    assert any("1 images are in no folder that" in w and "test/images/a.jpg" in w for w in plan.warnings)
    write_file(str(root / "data.yaml"), "train: train/images\nnc: 2\nnames: [cat]\n")
    with pytest.raises(InputError, match="nc is 2 but names lists 1 classes"):
        _plan(root)
