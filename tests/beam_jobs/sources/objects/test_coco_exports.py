"""COCO as the labelling tools export it: Roboflow, CVAT's COCO 1.0, Label Studio, and COCO's own test split.

Each tree is laid out as the tool writes it (Roboflow's and CVAT's docs, Datumaro's ``roboflow_coco`` and
``coco`` importers, Label Studio's converter), with the fields those exports carry.
"""

from __future__ import annotations

import json

import pytest

from beam_jobs import annotations, sources
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from tests.object_data import jpeg, object_records, picture, red_fraction, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _plan(root, **options):
    return sources.plan_inputs(ConvertOptions(src=str(root), out=str(root) + "-out", **options))


def _objects_of(plan):
    return {ref.relpath: (ref.split, [box.label for box in annotations.decode(ref.annotation).boxes])
            for ref in plan.refs}


def _roboflow_split(root, split, files):
    """``<split>/_annotations.coco.json`` beside its images, as Roboflow writes it: image and annotation ids from
    0, category 0 the project's name (``supercategory: none``) with no objects, the classes 1..N under it."""
    images, anns = [], []
    for index, (name, boxes) in enumerate(files):
        write_file(str(root / split / name), jpeg(picture(64, 48, [b for b, _ in boxes], seed=index)))
        images.append({"id": index, "license": 1, "file_name": name, "height": 48, "width": 64,
                       "date_captured": "2024-05-01T10:00:00+00:00"})
        for (x0, y0, x1, y1), category in boxes:
            anns.append({"id": len(anns), "image_id": index, "category_id": category, "bbox": [x0, y0, x1 - x0, y1 - y0],
                         "area": (x1 - x0) * (y1 - y0), "segmentation": [], "iscrowd": 0})
    categories = [{"id": 0, "name": "pets", "supercategory": "none"}, {"id": 1, "name": "cat", "supercategory": "pets"},
                  {"id": 2, "name": "dog", "supercategory": "pets"}]
    write_file(str(root / split / "_annotations.coco.json"), json.dumps({
        "info": {"year": "2024", "version": "1", "description": "Exported from roboflow.com"},
        "licenses": [{"id": 1, "url": "https://creativecommons.org/licenses/by/4.0/", "name": "CC BY 4.0"}],
        "categories": categories, "images": images, "annotations": anns}))


def test_cvat_coco_1_0_export_reads_instances_default_beside_images(tmp_path):
    root = tmp_path / "task_1-coco"
    write_file(str(root / "images/frame_000000.jpg"), jpeg(picture(32, 32, [(2, 2, 20, 20)])))
    write_file(str(root / "annotations/instances_default.json"), json.dumps({
        "licenses": [{"name": "", "id": 0, "url": ""}], "info": {"contributor": "", "version": ""},
        "categories": [{"id": 1, "name": "car", "supercategory": ""}, {"id": 2, "name": "person", "supercategory": ""}],
        "images": [{"id": 1, "width": 32, "height": 32, "file_name": "frame_000000.jpg", "license": 0,
                    "flickr_url": "", "coco_url": "", "date_captured": 0}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 2, "segmentation": [], "area": 324.0,
                         "bbox": [2.0, 2.0, 18.0, 18.0], "iscrowd": 0,
                         "attributes": {"occluded": False, "rotation": 0.0}}]}))
    plan = _plan(root)
    assert plan.classes == ("", "car", "person")
    assert _objects_of(plan) == {"images/frame_000000.jpg": ("train", [2])}
    write_file(str(tmp_path / "labels.txt"), "car\nperson\n")  # the classes in id order: checked, and accepted
    assert _plan(root, labels_file=str(tmp_path / "labels.txt")).classes == plan.classes


def test_label_studio_coco_export_numbers_categories_from_0_and_is_written_one_higher(tmp_path):
    root = tmp_path / "project-1-at-2024"
    write_file(str(root / "images/5f3a9c1e-street.jpg"), jpeg(picture(32, 32, [])))
    write_file(str(root / "result.json"), json.dumps({
        "images": [{"width": 32, "height": 32, "id": 0, "file_name": "images/5f3a9c1e-street.jpg"}],
        "categories": [{"id": 0, "name": "Airplane"}, {"id": 1, "name": "Car"}],
        "annotations": [{"id": 0, "image_id": 0, "category_id": 0, "segmentation": [], "bbox": [1, 1, 10, 10],
                         "ignore": 0, "iscrowd": 0, "area": 100}],
        "info": {"year": 2024, "version": "1.0", "contributor": "Label Studio"}}))
    plan = _plan(root)
    assert plan.classes == ("", "Airplane", "Car") and plan.class_id_offset == 1
    assert _objects_of(plan) == {"images/5f3a9c1e-street.jpg": ("train", [1])}
    assert any("start at 0" in warning for warning in plan.warnings)


def test_cocos_test_split_is_images_without_objects_and_test_dev_is_not_read_twice(tmp_path):
    root = tmp_path / "coco"
    categories = [{"id": 1, "name": "person", "supercategory": "person"}]
    write_file(str(root / "train2017/000000000009.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(root / "annotations/instances_train2017.json"), json.dumps({
        "images": [{"id": 9, "file_name": "000000000009.jpg", "width": 16, "height": 16}],
        "annotations": [{"id": 1, "image_id": 9, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 0}],
        "categories": categories}))
    for name in ("000000000001.jpg", "000000000016.jpg"):
        write_file(str(root / "test2017" / name), jpeg(picture(16, 16, [])))
    test = [{"id": 1, "file_name": "000000000001.jpg", "width": 16, "height": 16},
            {"id": 16, "file_name": "000000000016.jpg", "width": 16, "height": 16}]
    write_file(str(root / "annotations/image_info_test2017.json"), json.dumps({"images": test,
                                                                               "categories": categories}))
    write_file(str(root / "annotations/image_info_test-dev2017.json"), json.dumps({"images": test[:1],
                                                                                   "categories": categories}))
    plan = _plan(root)
    assert _objects_of(plan) == {"train2017/000000000009.jpg": ("train", [1]),
                                 "test2017/000000000001.jpg": ("test", []), "test2017/000000000016.jpg": ("test", [])}
    assert any("image_info_test-dev2017.json" in w and "read instead" in w for w in plan.warnings)


def test_a_second_entry_for_one_file_is_refused_naming_both_ids_and_a_case_mismatch_names_the_file(tmp_path):
    root = tmp_path / "coco"
    write_file(str(root / "train2017/a.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(root / "train2017/B.JPG"), jpeg(picture(16, 16, [])))
    write_file(str(root / "annotations/instances_train2017.json"), json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 16, "height": 16},
                   {"id": 2, "file_name": "a.jpg", "width": 16, "height": 16},
                   {"id": 3, "file_name": "b.jpg", "width": 16, "height": 16}],
        "annotations": [{"id": 10, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5]},
                        {"id": 11, "image_id": 2, "category_id": 1, "bbox": [2, 2, 5, 5]}],
        "categories": [{"id": 1, "name": "x"}]}))
    plan = _plan(root)
    assert _objects_of(plan) == {"train2017/a.jpg": ("train", [1]), "train2017/b.jpg": ("train", [])}
    assert any("image id 2 names the file of image id 1: refused, with its 1 annotations" in w for w in plan.warnings)
    (missing,) = [ref for ref in plan.refs if ref.relpath == "train2017/b.jpg"]
    assert "train2017/B.JPG is" in missing.source and "missing-file" in missing.source


def test_an_annotations_folder_without_its_image_folder_names_what_is_there(tmp_path):
    root = tmp_path / "coco"
    write_file(str(root / "annotations/instances_val2017.json"), json.dumps({"images": [], "categories": [
        {"id": 1, "name": "x"}]}))
    write_file(str(root / "pictures/a.jpg"), jpeg(picture(8, 8, [])))
    with pytest.raises(InputError, match=r"expected val2017/, images/val2017/ or images/ \(the folders there: "
                                         r"annotations, pictures\)"):
        _plan(root)


def test_classes_without_objects_in_the_annotations_are_told_apart_from_classes_whose_objects_were_rejected(
        tmp_path, caplog):
    root = tmp_path / "subset"
    write_file(str(root / "train2017/a.jpg"), jpeg(picture(32, 32, [(2, 2, 20, 20)])))
    write_file(str(root / "annotations/instances_train2017.json"), json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 32, "height": 32}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 18, 18]},
                        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [40, 40, 5, 5]}],
        "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "car"}, {"id": 3, "name": "boat"},
                       {"id": 4, "name": "kite"}]}))
    with caplog.at_level("WARNING"):
        run(ConvertOptions(src=str(root), out=str(tmp_path / "ds"), shards=1, max_bad_fraction=0.9,
                           encode=EncodeOptions(keep_partial_images=True)), FAST, show_progress=False)
    said = "\n".join(record.getMessage() for record in caplog.records)
    assert "2 of the 4 classes have no objects in the annotations, so none in the records: boat, kite" in said
    assert "1 class has no records: every object listed for it was rejected (rejected.jsonl): car" in said


def test_a_class_name_holding_a_line_break_is_refused_at_planning_naming_it(tmp_path):
    """It would be two lines of labels.txt (shifting every later id) and break label_map.pbtxt's quoting."""
    root = tmp_path / "coco"
    write_file(str(root / "train2017/a.jpg"), jpeg(picture(16, 16, [])))
    write_file(str(root / "annotations/instances_train2017.json"), json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 16, "height": 16}], "annotations": [],
        "categories": [{"id": 1, "name": "traffic\nlight"}, {"id": 2, "name": "car\u2028"}]}))
    with pytest.raises(InputError, match=r"the class name 'traffic\\nlight' holds a control character"):
        _plan(root)


def test_a_run_says_which_frame_it_took_for_images_whose_size_cannot_tell(tmp_path, caplog):
    """A 180-degree EXIF turn keeps width and height: the frame is COCO's convention (stored), said once."""
    root = tmp_path / "turned"
    write_file(str(root / "train2017/a.jpg"), jpeg(picture(40, 30, [(2, 2, 20, 20)]), orientation=3))
    write_file(str(root / "train2017/b.jpg"), jpeg(picture(40, 30, [(2, 2, 20, 20)])))
    images = [{"id": i, "file_name": name, "width": 40, "height": 30} for i, name in ((1, "a.jpg"), (2, "b.jpg"))]
    write_file(str(root / "annotations/instances_train2017.json"), json.dumps({
        "images": images, "categories": [{"id": 1, "name": "x"}],
        "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [2, 2, 18, 18]} for i in (1, 2)]}))
    with caplog.at_level("WARNING"):
        run(ConvertOptions(src=str(root), out=str(tmp_path / "ds"), shards=1), FAST, show_progress=False)
    said = [r.getMessage() for r in caplog.records if "EXIF-turned" in r.getMessage()]
    assert said == ["1 images are EXIF-turned with a size that fits both frames (train2017/a.jpg): their boxes were "
                    "taken in the stored frame; pass --annotation-frame stored or upright to say which the "
                    "annotations use"]


def test_a_roboflow_export_of_a_turned_image_keeps_its_box_on_the_object_in_the_upright_frame(tmp_path, caplog):
    """The tools show images upright and annotate them so; a 180-degree turn keeps the size, so only the
    convention tells, and it is the tool's, not COCO's own (stored pixels)."""
    root = tmp_path / "rf"
    _roboflow_split(root, "train", [("a_jpg.rf.1.jpg", [((4, 4, 30, 20), 1)])])
    write_file(str(root / "train/a_jpg.rf.1.jpg"), jpeg(picture(64, 48, [(4, 4, 30, 20)]), orientation=3))
    with caplog.at_level("WARNING"):
        run(ConvertOptions(src=str(root), out=str(tmp_path / "ds"), shards=1), FAST, show_progress=False)
    record = object_records(tmp_path / "ds")["train/a_jpg.rf.1.jpg"]
    assert red_fraction(record["pixels"], record["boxes"][0]) > 0.9
    assert any("taken in the upright frame" in r.getMessage() for r in caplog.records)
