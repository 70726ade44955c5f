"""A YOLO tree whose labels/ folder is named otherwise (annotations/) is told so, naming the folder, whether its
yaml is data.yaml (YOLO claims it) or another name (the masks layout would claim it) (issue #57 §5)."""

from __future__ import annotations

import pytest

from beam_jobs import sources
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError
from tests.object_data import jpeg, picture, write_file

LINE = "0 0.5 0.5 0.5 0.5\n"


def _plan(src):
    return sources.plan_inputs(ConvertOptions(src=str(src), out=str(src) + "-out"))


def test_labels_in_annotations_beside_images_under_data_yaml_are_refused_naming_the_folder(tmp_path):
    """It was planned as a dataset without a single object (a warning only): Ultralytics reads labels/ alone."""
    src = tmp_path / "pets"
    write_file(str(src / "data.yaml"), "train: images/train\nval: images/val\nnames: [cat]\n")
    for split, stem in (("train", "a"), ("train", "b"), ("val", "c")):
        write_file(str(src / f"images/{split}/{stem}.jpg"), jpeg(picture(16, 16, [])))
        write_file(str(src / f"annotations/{split}/{stem}.txt"), LINE)
    with pytest.raises(InputError, match=r"data\.yaml: no image has its label file in labels/, but annotations/ "
                                         r"holds 3 of them \(e\.g\. annotations/train/a\.txt\): Ultralytics reads an "
                                         r"image's labels from labels/ beside images/; rename annotations/ to labels/"):
        _plan(src)


def test_roboflow_split_folders_with_annotations_for_labels_name_the_splits_folder(tmp_path):
    src = tmp_path / "waste"
    write_file(str(src / "data.yaml"), "train: ../train/images\nval: ../valid/images\nnames: [can]\n")
    for split in ("train", "valid"):
        write_file(str(src / f"{split}/images/x.jpg"), jpeg(picture(16, 16, [])))
        write_file(str(src / f"{split}/annotations/x.txt"), LINE)
    with pytest.raises(InputError, match=r"but train/annotations/, valid/annotations/ hold 2 of them "
                                         r"\(e\.g\. train/annotations/x\.txt\): .*rename annotations/ to labels/"):
        _plan(src)


def test_a_yolo_tree_with_labels_and_an_unrelated_annotations_folder_still_reads_its_labels(tmp_path):
    src = tmp_path / "pets"
    write_file(str(src / "data.yaml"), "train: images/train\nnames: [cat]\n")
    write_file(str(src / "images/train/a.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(src / "labels/train/a.txt"), LINE)
    write_file(str(src / "annotations/train/a.txt"), LINE)  # a copy left behind: labels/ is what is read
    plan = _plan(src)
    assert [ref.relpath for ref in plan.refs] == ["images/train/a.jpg"]
