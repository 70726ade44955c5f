"""CVAT for images 1.1 finds its images wherever they lie under SRC, as CVAT's own importer matches its frames.

Issue #57 case 3: a task made of class folders (CVAT keeps each frame's path: ``cat/1.jpg``) exported with its
images in ``dataset/<class>/`` instead of ``images/`` was published as a one-class classification set, exit 0,
annotations.xml counted as a stray file. CVAT's importer (``cvat/apps/dataset_manager/bindings.py``,
``match_frame`` then ``match_frame_fuzzy``) matches a frame by its path without extension, then by the path's
last parts: so here.
"""

from __future__ import annotations

import json
import shutil

import pytest

from beam_jobs import annotations
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from beam_jobs.sources.archives import archive_members
from tests.beam_jobs.sources.objects.test_cvat import PROJECT_EXPORT, _box, _task_xml
from tests.object_data import jpeg, object_records, picture, red_fraction, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _class_folder_task(root) -> None:
    """A task of class folders: frames ``cat/1.jpg``, ``cat/2.jpg``, ``dog/1.jpg``; images in ``dataset/<class>/``."""
    images = [({"name": "cat/1.jpg", "width": 40, "height": 30}, _box("cat", 4, 4, 20, 20)),
              ({"name": "cat/2.jpg", "width": 40, "height": 30}, _box("cat", 10, 2, 30, 28)),
              ({"name": "dog/1.jpg", "width": 40, "height": 30}, _box("dog", 0, 0, 40, 30))]
    write_file(str(root / "annotations.xml"), _task_xml(["cat", "dog"], images, subset="Train"))
    for (attributes, _), box in zip(images, [(4, 4, 20, 20), (10, 2, 30, 28), (0, 0, 40, 30)]):
        write_file(str(root / "dataset" / attributes["name"]), jpeg(picture(40, 30, [box], seed=len(box))))


def test_images_in_class_folders_under_another_folder_convert_as_cvats_objects(tmp_path):
    root = tmp_path / "task"
    _class_folder_task(root)
    write_file(str(root / "dataset/dog/unlabelled.jpg"), jpeg(picture(16, 16, [])))
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(root), out=str(out), shards=1), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "objects" and manifest["classes"] == ["", "cat", "dog"]
    assert manifest["splits"]["train"]["num_examples"] == 3 and manifest["splits"]["train"]["num_objects"] == 3
    assert manifest["skipped_by_reason"]["not-in-annotations"] == 1
    records = object_records(out)
    assert sorted(records) == ["dataset/cat/1.jpg", "dataset/cat/2.jpg", "dataset/dog/1.jpg"]
    cat = records["dataset/cat/2.jpg"]
    assert cat["image/object/class/label"] == [1] and red_fraction(cat["pixels"], cat["boxes"][0]) > 0.9


def test_a_real_project_export_finds_each_subsets_image_in_its_subsets_folder_wherever_it_lies(tmp_path):
    """img0.jpg is in each of the three subsets: the one in the folder named after the subset is the image's."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(PROJECT_EXPORT, root / "annotations.xml")
    for subset in ("Train", "Test", "Validation"):
        write_file(str(root / f"frames/{subset}/img0.jpg"), jpeg(picture(8, 8, [])))
        write_file(str(root / f"frames/{subset}/img1.jpg"), jpeg(picture(10, 10, [])))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    found = {ref.relpath: (ref.split, ref.source) for ref in plan.refs}
    assert list(plan.skipped_files.lines()) == []  # every file under SRC read
    assert found == {f"frames/{subset}/img{i}.jpg": (split, "") for subset, split in
                     (("Train", "train"), ("Test", "test"), ("Validation", "validation")) for i in (0, 1)}


def test_an_image_two_files_could_be_is_rejected_naming_both(tmp_path):
    images = [({"name": "1.jpg", "width": 16, "height": 16}, ""), ({"name": "2.jpg", "width": 16, "height": 16}, "")]
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["cat"], images))
    for path in ("dataset/cat/1.jpg", "dataset/dog/1.jpg", "dataset/dog/2.jpg"):
        write_file(str(tmp_path / path), jpeg(picture(16, 16, [])))
    refs = {ref.relpath: ref.source for ref in plan_inputs(ConvertOptions(src=str(tmp_path))).refs}
    assert refs["dataset/dog/2.jpg"] == ""
    refused = archive_members.parse_locator(refs["images/1.jpg"])
    assert refused.reason == "ambiguous-path"
    assert "dataset/cat/1.jpg" in refused.detail and "dataset/dog/1.jpg" in refused.detail


def test_annotations_xml_whose_images_are_nowhere_is_an_error_naming_it_and_where_it_looked(tmp_path):
    """Never the classification set of the folders beside it."""
    images = [({"name": "cat/1.jpg", "width": 16, "height": 16}, "")]
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["cat"], images))
    write_file(str(tmp_path / "photos/cat/9.jpg"), jpeg(picture(16, 16, [])))
    with pytest.raises(InputError, match=r"annotations.xml lists 1 images, but none of them is under .*images/<subset>/"
                                         r"<name>, images/<name> and <name>.*cat/1.jpg"):
        plan_inputs(ConvertOptions(src=str(tmp_path)))


def test_a_label_typo_is_rejected_with_the_label_it_may_have_meant(tmp_path):
    images = [({"name": "a.jpg", "width": 40, "height": 30}, _box("Car", 1, 1, 9, 9) + _box("bike", 1, 1, 9, 9))]
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["car", "person"], images))
    write_file(str(tmp_path / "images/a.jpg"), jpeg(picture(40, 30, [])))
    [ref] = plan_inputs(ConvertOptions(src=str(tmp_path))).refs
    rejected = annotations.decode(ref.annotation).rejected
    assert [detail for _, _, detail in rejected] == [
        "label 'Car' is not in the labels of <meta>: did you mean 'car'?", "label 'bike' is not in the labels of <meta>"]
