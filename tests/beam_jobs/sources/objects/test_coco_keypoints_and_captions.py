"""COCO's person_keypoints_*.json and captions_*.json beside instances_*.json: converted into the keys the TF Object
Detection API's and Model Garden's COCO scripts write, keypoints placed as the boxes are (issue #57 §2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import record_schema
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from tests.object_data import CAR, coco_with_keypoints as _coco

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
KEYPOINTS_FILE = "annotations/person_keypoints_val2017.json"


def _coco_with(root, change) -> None:
    """The COCO sample (:func:`tests.object_data.coco_with_keypoints`) at ``root`` with its keypoints file's JSON
    changed in place by ``change(data)``."""
    _coco(root)
    path = root / KEYPOINTS_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _not_triples(data: dict) -> None:
    """a.jpg's person (annotation 10) gets 5 keypoint values: not x, y, visibility triples."""
    data["annotations"][0]["keypoints"] = [4, 3, 2, 6, 5]


def test_keypoints_are_written_normalized_and_turned_with_their_boxes_and_captions_as_an_images_list(tmp_path):
    import tensorflow as tf

    root = tmp_path / "coco"
    _coco(root)
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(root), out=str(out), shards=1), FAST, show_progress=False)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    assert {key: manifest["features"][key] for key in record_schema.KEYPOINT_FEATURES} == \
        record_schema.KEYPOINT_FEATURES
    assert manifest["num_skipped"] == 0  # both files read, none skipped
    assert manifest["keypoints"] == {"count": 3, "names": ["nose", "left_eye", "right_eye"], "flip": [0, 2, 1]}
    # Parsed as the OD API's TfExampleDecoder parses them: K points an object, reshaped [objects, K].
    spec = {key: tf.io.VarLenFeature(tf.float32 if kind == "float_list" else tf.int64)
            for key, kind in record_schema.KEYPOINT_FEATURES.items()}
    spec.update({record_schema.CAPTION: tf.io.VarLenFeature(tf.string),
                 record_schema.FILENAME: tf.io.FixedLenFeature([], tf.string),
                 **{key: tf.io.VarLenFeature(tf.float32) for key in (record_schema.BBOX_XMIN, record_schema.BBOX_YMIN,
                                                                     record_schema.BBOX_XMAX, record_schema.BBOX_YMAX)}})
    records = {}
    for raw in tf.data.TFRecordDataset(sorted(str(p) for p in out.glob("validation-*.tfrecord"))):
        parsed = tf.io.parse_single_example(raw, spec)
        values = {key: tf.sparse.to_dense(value).numpy() if isinstance(value, tf.SparseTensor) else value.numpy()
                  for key, value in parsed.items()}
        records[values[record_schema.FILENAME].decode()] = values
    a, b = records["val2017/a.jpg"], records["val2017/b.jpg"]
    xy = np.stack([a[record_schema.KEYPOINT_X], a[record_schema.KEYPOINT_Y]], -1).reshape(2, 3, 2)
    assert np.allclose(xy[0], [(4 / 40, 3 / 30), (6 / 40, 5 / 30), (0, 0)])  # the person's; unlabelled stays 0, 0
    assert np.allclose(xy[1], 0)  # the car has none: zeros, visibility 0 (the OD API's layout)
    assert a[record_schema.KEYPOINT_VISIBILITY].tolist() == [2, 1, 0, 0, 0, 0]
    assert a[record_schema.KEYPOINT_NUM].tolist() == [2, 0]
    assert [c.decode() for c in a[record_schema.CAPTION]] == ["A person beside a car.", "Someone and a red car"]
    assert b[record_schema.CAPTION].size == 0
    # b.jpg turned upright (EXIF 6: x' = 1 - y, y' = x): the point turns with its box and stays inside it.
    x, y = b[record_schema.KEYPOINT_X][0], b[record_schema.KEYPOINT_Y][0]
    assert np.allclose((x, y), (1 - 3 / 30, 4 / 40))
    assert b[record_schema.BBOX_XMIN][0] <= x <= b[record_schema.BBOX_XMAX][0]
    assert b[record_schema.BBOX_YMIN][0] <= y <= b[record_schema.BBOX_YMAX][0]


def test_keypoints_that_are_not_triples_of_numbers_reject_their_object_by_name(tmp_path):
    root = tmp_path / "coco"
    _coco_with(root, _not_triples)
    plan = plan_inputs(ConvertOptions(src=str(root)))
    from beam_jobs import annotations

    found = {ref.relpath: annotations.decode(ref.annotation) for ref in plan.refs}
    [rejected] = found["val2017/a.jpg"].rejected
    assert rejected[:2] == ("instances_val2017.json annotation 10", "bad-annotation")
    assert "person_keypoints_val2017.json annotation 10: keypoints [4, 3, 2, 6, 5] are not x, y, visibility" \
        in rejected[2]


def test_a_keypoints_file_whose_categories_name_no_points_is_refused_naming_it(tmp_path):
    root = tmp_path / "coco"
    _coco_with(root, lambda data: data.update(categories=[CAR]))
    with pytest.raises(InputError, match=r"person_keypoints_val2017.json: no category names its keypoints"):
        plan_inputs(ConvertOptions(src=str(root)))


def test_keypoints_of_no_object_of_the_instances_file_are_named_in_a_warning(tmp_path):
    root = tmp_path / "coco"
    _coco_with(root, lambda data: data["annotations"].append({**data["annotations"][0], "id": 99}))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert any(w.endswith("person_keypoints_val2017.json: 1 keypoints annotation names no object its instances file "
                          "lists, and was not written (ids 99)") for w in plan.warnings), plan.warnings


def test_keypoints_attach_only_by_int_ids_on_both_sides_and_the_others_are_counted_by_file(tmp_path):
    """The car (place 1 in instances_val2017.json) has no "id"; a keypoints annotation has id 1: they are not the
    same object (a place is no id), so the car gets unlabelled points, keypoints 1 is named as taken by no
    object, and a keypoints annotation without an id is counted, each warning naming its file (review #57 §5)."""
    from beam_jobs import annotations

    root = tmp_path / "coco"
    _coco_with(root, lambda data: data["annotations"].extend(
        [{**data["annotations"][0], "id": 1, "keypoints": [9, 9, 2, 9, 9, 2, 9, 9, 2]},
         {key: value for key, value in data["annotations"][0].items() if key != "id"}]))
    instances = root / "annotations/instances_val2017.json"
    data = json.loads(instances.read_text())
    del data["annotations"][1]["id"]
    instances.write_text(json.dumps(data))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    found = {ref.relpath: annotations.decode(ref.annotation) for ref in plan.refs}
    person, car = found["val2017/a.jpg"].boxes
    assert car.keypoints == (0.0, 0.0, 0) * 3 and any(person.keypoints)
    said = "\n".join(plan.warnings)
    assert "person_keypoints_val2017.json: 1 keypoints annotation names no object its instances file lists, and " \
        "was not written (ids 1)" in said, said
    assert 'person_keypoints_val2017.json: 1 keypoints annotation has no int "id" and was not written' in said, said
    assert 'instances_val2017.json: 1 annotation has no int "id": written with 3 keypoints of visibility 0' in said


def test_the_flip_of_the_points_comes_from_their_names_and_is_none_where_they_say_no_side():
    """COCO's 17 names give the OD API's keypoint_flip_permutation (the reader's COCO_KEYPOINT_FLIP); names of no
    side give no flip (the manifest records none rather than a guess)."""
    from beam_jobs.sources.objects.coco_extras import flip_of, manifest_entry
    from reader.keypoints import COCO_FLIP

    coco = ("nose", *(f"{side}_{part}" for part in ("eye", "ear", "shoulder", "elbow", "wrist", "hip", "knee", "ankle")
                      for side in ("left", "right")))
    assert flip_of(coco) == COCO_FLIP
    assert flip_of(("Left Eye", "Right Eye", "tail")) == (1, 0, 2)
    assert flip_of(("head", "tail")) == () and flip_of(("left_eye", "left_ear")) == ()  # no pair: no flip
    assert manifest_entry(("head", "tail")) == {"count": 2, "names": ["head", "tail"]}


def test_the_flip_pairs_the_common_side_conventions_of_point_names():
    """Beside left_/right_ words: l/r suffixes and prefixes (hand_L, L_eye, eye_r), camelCase (leftEye, LEye,
    eyeL) and capitals (LEFT_EYE), each pairing with its name of the other side; a lone l or r pairs nothing."""
    from beam_jobs.sources.objects.coco_extras import flip_of, pairing

    assert flip_of(("nose", "hand_L", "hand_R")) == (0, 2, 1)
    assert flip_of(("L_eye", "R_eye", "L_ear", "R_ear")) == (1, 0, 3, 2)
    assert flip_of(("eye_r", "eye_l")) == (1, 0)
    assert flip_of(("leftEye", "rightEye", "LeftEar", "RightEar", "nose")) == (1, 0, 3, 2, 4)
    assert flip_of(("LEye", "REye")) == (1, 0) and flip_of(("eyeL", "eyeR")) == (1, 0)
    assert flip_of(("LEFT_EYE", "RIGHT_EYE")) == (1, 0)
    assert flip_of(("l", "r")) == () and pairing(("l", "r")) == ((), [])  # letters alone: no side said
    # Mixed conventions do not pair (hand_L is not R_hand's other side): both named as unpaired.
    assert pairing(("hand_L", "R_hand")) == ((), ["hand_L", "R_hand"])
    assert pairing(("left_eye", "right_eye", "left_paw")) == ((1, 0, 2), ["left_paw"])


def test_points_named_with_a_side_and_no_partner_are_warned_of_with_how_to_give_the_flip(tmp_path):
    """A keypoints file naming hand_L and R_hand: no flip can be read from its names; the plan's warning names
    the points and the reader's keypoint_flip, as Ultralytics' flip_idx and the OD API's permutation say it."""
    root = tmp_path / "coco"
    _coco_with(root, lambda data: data["categories"][0].update(keypoints=["nose", "hand_L", "R_hand"]))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert plan.keypoints == {"count": 3, "names": ["nose", "hand_L", "R_hand"]}  # no flip recorded
    [said] = [w for w in plan.warnings if "hand_L" in w]
    assert said.startswith(f"{root / KEYPOINTS_FILE}: keypoints hand_L, R_hand name a side, and no point is named the "
                           "same with the other side (left/right, l/r): a horizontal flip keeps them in place and "
                           "the manifest records no flip. Give the flip when reading: reader.ObjectTargets("
                           'keypoints="auto", keypoint_flip=(...)), the 3 points\' order after a mirror'), said
    assert "flip_idx" in said and "keypoint_flip_permutation" in said
    _coco_with(root, lambda data: data["categories"][0].update(keypoints=["nose", "hand_L", "hand_R"]))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert plan.keypoints["flip"] == [0, 2, 1] and not any("hand_L" in w for w in plan.warnings), plan.warnings


def test_keypoints_files_naming_their_points_otherwise_are_warned_of(tmp_path):
    """Two sets whose keypoints files name their K points differently: the manifest records the first file's
    names and a warning names both files."""
    from tests.object_data import PERSON, jpeg, picture, write_coco, write_file

    root = tmp_path / "coco"
    _coco(root)
    write_coco(str(root), "train2017", [{"id": 5, "file_name": "t.jpg", "width": 40, "height": 30}],
               [{"id": 50, "image_id": 5, "category_id": 1, "bbox": [2, 2, 10, 8], "area": 80, "iscrowd": 0}],
               [PERSON, CAR], {"t.jpg": jpeg(picture(40, 30, [(2, 2, 12, 10)], seed=3))})
    write_file(str(root / "annotations/person_keypoints_train2017.json"), json.dumps(
        {"images": [], "annotations": [], "categories": [{**PERSON, "keypoints": ["head", "tail", "paw"]}]}))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert plan.keypoints == {"count": 3, "names": ["head", "tail", "paw"]}  # train2017's file sorts first
    assert any("person_keypoints_val2017.json names its 3 keypoints nose, left_eye, right_eye;" in w and
               "the manifest records person_keypoints_train2017.json's names" in w for w in plan.warnings), plan.warnings


def test_the_help_of_the_objects_flags_says_keypoints_and_captions_are_read_and_where_k_is():
    from converter.convert_flags import build_convert_parser

    text = " ".join(build_convert_parser().format_help().split())
    assert "person_keypoints_<set>.json and captions_<set>.json beside instances_<set>.json are read too" in text
    assert 'manifest.json\'s "keypoints", read with reader.ObjectTargets(keypoints="auto")' in text


def test_keypoints_whose_image_id_disagrees_with_their_objects_are_refused_naming_both_ids(tmp_path):
    """Keypoints attach by annotation id; one whose image_id is not its instance annotation's is another object's
    (the files disagree): its object is rejected as a bad annotation naming the file and both image ids, instead
    of getting those points silently, and the other images keep theirs."""
    from beam_jobs import annotations

    root = tmp_path / "coco"
    # annotation 10 is a.jpg's (image 1) person in instances_val2017.json
    _coco_with(root, lambda data: data["annotations"][0].update(image_id=2))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    found = {ref.relpath: annotations.decode(ref.annotation) for ref in plan.refs}
    [rejected] = found["val2017/a.jpg"].rejected
    assert rejected == ("instances_val2017.json annotation 10", "bad-annotation",
                        "person_keypoints_val2017.json annotation 10 is of image_id 2, and instances_val2017.json's "
                        "annotation 10 of image_id 1: the files disagree on whose keypoints these are")
    assert [box.label for box in found["val2017/a.jpg"].boxes] == [3]  # the car stays (the image goes by default)
    [person] = found["val2017/b.jpg"].boxes
    assert person.keypoints[:3] == (4.0, 3.0, 2) and not found["val2017/b.jpg"].rejected
    assert not any("names no object" in w for w in plan.warnings), plan.warnings  # named once, as the rejection


@pytest.mark.slow
def test_a_bad_keypoints_annotation_counts_its_images_objects_and_the_budget_says_what_to_raise(tmp_path):
    """a.jpg's person has keypoints that are not triples (its car is fine). By default the image is rejected and
    its line counts both objects as going with it (it said 1: the refused person was not counted); the run fails
    on --max-bad-fraction saying the fraction that publishes the rest, and that --keep-partial-images keeps such
    images. With --keep-partial-images the person alone is refused, and the object budget says the fraction too."""
    from beam_jobs.options import EncodeOptions
    from beam_jobs.pipeline import TooManyRejectedError
    from beam_jobs.pipeline.budgets import _enough

    root = tmp_path / "coco"
    _coco_with(root, _not_triples)
    with pytest.raises(TooManyRejectedError) as raised:
        run(ConvertOptions(src=str(root), out=str(tmp_path / "ds"), shards=1), FAST, show_progress=False)
    said = str(raised.value)
    assert "1 of 2 files (50.0%) were rejected (bad-annotation 1)" in said, said
    assert "To publish the other images, raise --max-bad-fraction to 0.5" in said, said
    assert "An image rejected for an object that cannot be written (bad-annotation) is written without it with " \
        "--keep-partial-images" in said, said
    [line] = [json.loads(text) for text in (tmp_path / "ds.rejected.jsonl").read_text().splitlines()]
    assert line["detail"].endswith("; its 2 objects went with it"), line
    with pytest.raises(TooManyRejectedError) as raised:
        run(ConvertOptions(src=str(root), out=str(tmp_path / "partial"), shards=1,
                           encode=EncodeOptions(keep_partial_images=True)), FAST, show_progress=False)
    said = str(raised.value)
    assert "1 of 3 objects (33.3%) were rejected (bad-annotation 1)" in said, said
    assert said.endswith("To publish their images without them, raise --max-bad-fraction to 0.34"), said
    assert (_enough(1 / 3), _enough(0.5), _enough(0.07)) == ("0.34", "0.5", "0.07")
