"""A --src one level off an object dataset is answered with what is there and the command that works."""

from __future__ import annotations

import json
import shutil

import pytest

from beam_jobs import sources
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError
from tests.object_data import jpeg, picture, write_file


def _plan(src, **options):
    return sources.plan_inputs(ConvertOptions(src=str(src), out=str(src) + "-out", **options))


@pytest.fixture
def datasets(tmp_path):
    """A folder holding a COCO tree, a VOC tree and a YOLO tree, as people keep them side by side."""
    image = jpeg(picture(16, 16, []))
    write_file(str(tmp_path / "coco/annotations/instances_val2017.json"), json.dumps(
        {"images": [{"id": 1, "file_name": "a.jpg", "width": 16, "height": 16}], "annotations": [],
         "categories": [{"id": 1, "name": "x"}]}))
    write_file(str(tmp_path / "coco/val2017/a.jpg"), image)
    write_file(str(tmp_path / "VOC2012/Annotations/a.xml"), "<annotation/>")
    write_file(str(tmp_path / "VOC2012/JPEGImages/a.jpg"), image)
    write_file(str(tmp_path / "coco8/coco8.yaml"), "train: images/train\nnames: [a]\n")
    write_file(str(tmp_path / "coco8/images/train/a.jpg"), image)
    write_file(str(tmp_path / "coco8/labels/train/a.txt"), "0 0.5 0.5 0.5 0.5\n")
    # Roboflow's YOLO export (data.yaml above its split folders), its COCO export, CVAT's COCO 1.0
    write_file(str(tmp_path / "rf/data.yaml"), "train: ../train/images\nval: ../valid/images\nnames: [a]\n")
    for split in ("train", "valid"):
        write_file(str(tmp_path / f"rf/{split}/images/a.jpg"), image)
        write_file(str(tmp_path / f"rf/{split}/labels/a.txt"), "0 0.5 0.5 0.5 0.5\n")
    write_file(str(tmp_path / "rfc/train/_annotations.coco.json"), json.dumps({"images": [], "categories": []}))
    write_file(str(tmp_path / "rfc/train/a_jpg.rf.1.jpg"), image)
    write_file(str(tmp_path / "cvc/annotations/instances_default.json"), json.dumps({"images": [], "categories": []}))
    write_file(str(tmp_path / "cvc/images/frame_000000.jpg"), image)
    return tmp_path


@pytest.mark.parametrize("inner, parent, what", [
    ("coco/val2017", "coco", "COCO's image folder"), ("coco/annotations", "coco", "COCO's annotation folder"),
    ("VOC2012/JPEGImages", "VOC2012", "Pascal VOC's image folder"),
    ("coco8/images", "coco8", "YOLO's image folder"), ("coco8/images/train", "coco8", "a split of YOLO's"),
    ("coco8/labels", "coco8", "YOLO's label folder"), ("rf/train/images", "rf", "YOLO's image folder"),
    ("rf/valid", "rf", "one split of a YOLO dataset whose yaml is in"),
    ("rfc/train", "rfc", "one split of Roboflow's COCO export"), ("cvc/images", "cvc", "COCO's image folder"),
])
def test_an_inner_folder_of_a_dataset_names_the_dataset_and_the_command(datasets, inner, parent, what):
    with pytest.raises(InputError) as raised:
        _plan(datasets / inner)
    assert what in str(raised.value)
    assert str(raised.value).endswith(f"python -m converter --src {datasets / parent}")


def test_a_folder_of_datasets_is_not_read_as_their_classes(datasets):
    shutil.rmtree(datasets / "VOC2012")  # VOCdevkit/VOC2007 beside VOC2012 is one dataset: VOC reads both
    write_file(str(datasets / "task_1/annotations.xml"), "<annotations/>")
    write_file(str(datasets / "task_1/images/a.jpg"), jpeg(picture(16, 16, [])))
    with pytest.raises(InputError, match=r"holds datasets, not classes: coco/ \(COCO\), coco8/ \(YOLO\), cvc/ "
                                         r"\(COCO\), rf/ \(YOLO\), rfc/ \(Roboflow's COCO export\) and 1 more\. "):
        _plan(datasets)


def test_a_yolo_tree_given_a_flag_of_another_layout_is_refused_naming_the_flag(datasets):
    with pytest.raises(InputError, match=r"--label-member: .*coco8 is a dataset whose annotations label its images "
                                         r"\(YOLO\)"):
        _plan(datasets / "coco8", label_member="cls")


def test_a_yolo_tree_without_its_yaml_asks_for_one_instead_of_reading_images_and_labels_as_classes(datasets):
    (datasets / "coco8" / "coco8.yaml").unlink()
    with pytest.raises(InputError, match=r"holds images/ and labels/ as YOLO writes them, but no yaml naming the "
                                         r"classes"):
        _plan(datasets / "coco8")


def test_voc_beside_other_datasets_is_refused_naming_them_all_not_converted_alone(datasets):
    """VOC's roots may lie two levels below SRC, so VOC claimed this folder and the others went unread."""
    write_file(str(datasets / "ls/classes.txt"), "cat\n")
    write_file(str(datasets / "ls/labels/a.txt"), "0 0.5 0.5 0.5 0.5\n")
    write_file(str(datasets / "ls/images/a.jpg"), jpeg(picture(16, 16, [])))
    with pytest.raises(InputError, match=r"holds datasets, not classes: VOC2012/ \(Pascal VOC\), coco/ \(COCO\), "
                                         r"coco8/ \(YOLO\), cvc/ \(COCO\), ls/ \(YOLO\) and 2 more"):
        _plan(datasets)


def test_yolo_labels_in_a_folder_named_annotations_are_not_read_as_masks(tmp_path):
    """images/ beside annotations/ is the masks layout: its .txt files said 'name the classes with --labels'."""
    write_file(str(tmp_path / "pets/pets.yaml"), "train: images/train\nnames: [cat]\n")
    write_file(str(tmp_path / "pets/images/train/a.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(tmp_path / "pets/annotations/train/a.txt"), "0 0.5 0.5 0.5 0.5\n")
    with pytest.raises(InputError, match=r"annotations/ holds 1 .txt files and no mask: YOLO's labels\? .* rename "
                                         r"annotations/ to labels/"):
        _plan(tmp_path / "pets")
