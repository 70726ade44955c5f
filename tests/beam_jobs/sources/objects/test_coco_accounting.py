"""COCO: every file under SRC accounted for, and nothing lost without a word.

The tree is COCO's own layout (``annotations/`` of ``instances_``, ``person_keypoints_`` and ``captions_``
files as ``annotations_trainval2017.zip`` holds them, beside ``val2017/``), generated small: an image the
JSON lists but SRC lacks (issue #57 case 5), the keypoints and captions files beside the instances file
(case 6: read with it, and a damaged one refused by its byte offset), a README, and a hidden file.
"""

from __future__ import annotations

import json

import pytest

import record_schema
from beam_jobs import sources
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from tests.object_data import jpeg, picture, write_coco, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
CATEGORIES = [{"id": 1, "name": "person", "supercategory": "person"},
              {"id": 3, "name": "car", "supercategory": "vehicle"}]


def _coco_val(root) -> None:
    """val2017 of three listed images, one of them (gone.jpg, 3 objects) not in SRC."""
    images = [{"id": i, "file_name": name, "width": 40, "height": 30}
              for i, name in ((1, "a.jpg"), (2, "b.jpg"), (3, "gone.jpg"))]
    anns = [{"id": 10 + i, "image_id": image, "category_id": category, "bbox": [2, 2, 10, 8], "area": 80,
             "iscrowd": 0} for i, (image, category) in enumerate([(1, 1), (2, 3), (3, 1), (3, 1), (3, 3)])]
    write_coco(str(root), "val2017", images, anns, CATEGORIES,
               {"a.jpg": jpeg(picture(40, 30, [(2, 2, 12, 10)], seed=1)),
                "b.jpg": jpeg(picture(40, 30, [(2, 2, 12, 10)], seed=2))})
    points = [{"id": 10, "image_id": 1, "category_id": 1, "num_keypoints": 2, "keypoints": [4, 3, 2, 6, 5, 1, 0, 0, 0]}]
    write_file(str(root / "annotations/person_keypoints_val2017.json"), json.dumps(
        {"images": images, "annotations": points,
         "categories": [{**CATEGORIES[0], "keypoints": ["nose", "left_eye", "right_eye"]}]}))
    write_file(str(root / "annotations/captions_val2017.json"),
               json.dumps({"images": images, "annotations": [{"id": 1, "image_id": 1, "caption": "a person"}]}))
    write_file(str(root / "README.txt"), "COCO 2017 val, a subset\n")
    write_file(str(root / "val2017/.DS_Store"), b"\0\0\0\1Bud1")


def test_a_missing_images_objects_are_counted_and_named_not_called_rejected_objects(tmp_path, caplog):
    root = tmp_path / "coco"
    _coco_val(root)
    out = tmp_path / "ds"
    with caplog.at_level("WARNING"):
        summary = run(ConvertOptions(src=str(root), out=str(out), shards=1, max_bad_fraction=0.5), FAST,
                      show_progress=False)
    said = "\n".join(record.getMessage() for record in caplog.records)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    rejected = [json.loads(line) for line in (out / record_schema.REJECTED_FILE).read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in rejected] == [("val2017/gone.jpg", "missing-file")]
    assert rejected[0]["detail"] == ("listed in instances_val2017.json, but --src has no file val2017/gone.jpg "
                                     "(its objects: person 2, car 1); its 3 objects went with it")
    assert manifest["num_rejected_objects"] == 0 and manifest["num_objects_of_rejected_images"] == 3
    assert "objects:    2 written, 0 rejected, 3 with their rejected images" in summary.format()
    assert "were rejected" not in said  # no class lost all its objects here, and none was "rejected"
    # Case 6: the keypoints and captions files are read with their instances file; every file accounted.
    assert "does not read" not in said
    assert manifest["features"][record_schema.KEYPOINT_X] == "float_list"
    assert manifest["features"][record_schema.CAPTION] == "bytes_list"
    skipped = {line["path"]: line["reason"] for line in map(json.loads, (out / record_schema.SKIPPED_FILE)
                                                             .read_text().splitlines())}
    assert skipped == {"README.txt": "not-an-image", "val2017/.DS_Store": "system-file"}
    files_under_src = sum(1 for path in root.rglob("*") if path.is_file())
    annotation_files_read, listed_but_not_there = 3, 1
    assert manifest["num_listed"] - listed_but_not_there + manifest["num_skipped"] + annotation_files_read \
        == files_under_src
    assert manifest["num_skipped_listed"] == manifest["num_skipped"]


def test_the_last_class_whose_objects_went_with_a_missing_image_is_not_said_to_be_rejected(tmp_path, caplog):
    root = tmp_path / "coco"
    _coco_val(root)
    (root / "val2017/b.jpg").unlink()  # car's only other object
    with caplog.at_level("WARNING"):
        run(ConvertOptions(src=str(root), out=str(tmp_path / "ds"), shards=1, max_bad_fraction=0.7), FAST,
            show_progress=False)
    said = "\n".join(record.getMessage() for record in caplog.records)
    assert "1 class has no records: every object listed for it was rejected or went with its rejected image " \
           "(rejected.jsonl): car" in said


@pytest.mark.parametrize("kind, cut, expected", [
    ("instances", lambda text: text[:-25], r"it ends at byte \d+ in the middle of its data \(cut short: a partial "
                                           r"download or copy\?\); its last bytes: '.*\"name\": \"car\", \"sup'"),
    ("instances", lambda text: text.replace('"bbox"', '"bbox" oops', 1),
     r"lexical error: invalid char in json text at byte \d+: '.*\"bbox\"  <-- here --> oops: \["),
    ("person_keypoints", lambda text: text[:-40], r"it ends at byte 399 in the middle of its data \(cut short: a "
                                                  r"partial download or copy\?\); its last bytes: '.*\"keypoint'"),
])
def test_a_damaged_annotation_file_is_refused_with_the_byte_offset_and_the_text_around_it(tmp_path, kind, cut,
                                                                                          expected):
    root = tmp_path / "coco"
    _coco_val(root)
    path = root / f"annotations/{kind}_val2017.json"
    path.write_text(cut(path.read_text()))
    with pytest.raises(InputError, match=rf"annotations/{kind}_val2017.json is not valid JSON: " + expected):
        sources.plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "ds")))


def test_the_annotations_file_given_inside_src_is_read_not_skipped_however_the_paths_are_spelled(tmp_path,
                                                                                                   monkeypatch):
    """``--src ./ds --annotations ds/ann.json`` (and a trailing slash): the file read is not also listed in
    skipped.jsonl as an annotation file no source read."""
    from beam_jobs.sources.objects.coco import _inside

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds").mkdir()
    for src, path in (("./ds", "ds/ann.json"), ("ds/", "./ds/ann.json"), ("ds", str(tmp_path / "ds/ann.json")),
                      (str(tmp_path / "ds") + "/", "ds/sub/ann.json")):
        assert _inside(src, path) == {"sub/ann.json" if "sub" in path else "ann.json"}
    assert _inside("ds", "other/ann.json") == set()
    assert _inside("gs://bucket/ds", "gs://bucket/ds/ann.json") == {"ann.json"}
