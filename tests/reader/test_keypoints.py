"""ObjectTargets(keypoints=K): each object's points moved with the pixels as its box is, and swapped left for right
by a flip given the points it pairs (issue #57 §2)."""

from __future__ import annotations

import numpy as np
import pytest

import reader
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from tests.object_data import coco_with_keypoints, converted_coco_with_keypoints

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="module")
def keypoints_dataset(tmp_path_factory) -> str:
    return converted_coco_with_keypoints(tmp_path_factory.mktemp("keypoints"))


def _by_count(dataset) -> dict:
    """Each example's targets by its count of objects (a.jpg has two, b.jpg one)."""
    found = {}
    for _, targets in dataset:
        for boxes, labels, points in zip(*(targets[k].numpy() for k in ("boxes", "labels", "keypoints"))):
            count = int((labels >= 0).sum())
            found[count] = (boxes[:count], points[:count])
    return found


def test_evaluation_keypoints_are_in_the_output_images_pixels_with_their_boxes(keypoints_dataset):
    dataset = reader.build_dataset(keypoints_dataset, "validation", batch_size=2, image_size=(60, 80), training=False,
                                   targets=reader.ObjectTargets(bounding_box_format="xyxy", keypoints=3))
    found = _by_count(dataset)
    boxes, points = found[2]  # a.jpg, 40x30 stored, scaled 2x
    assert np.allclose(points[0], [(8, 6, 2), (12, 10, 1), (0, 0, 0)])
    assert np.allclose(points[1], 0)  # the car: no keypoints
    assert np.allclose(boxes[0], (4, 4, 24, 20))
    boxes, points = found[1]  # b.jpg upright 30x40, scaled 1.5x: its point turned upright by the converter
    assert np.allclose(points[0, 0], (0.9 * 45, 0.1 * 60, 2)) and np.allclose(points[0, 1:], 0)
    assert boxes[0, 0] <= points[0, 0, 0] <= boxes[0, 2] and boxes[0, 1] <= points[0, 0, 1] <= boxes[0, 3]


@pytest.mark.slow
def test_a_flip_mirrors_the_points_and_swaps_the_pairs_it_is_given(keypoints_dataset):
    # keypoints="auto": K (3) and the flip (0, 2, 1: nose, left_eye, right_eye) from the manifest
    targets = reader.ObjectTargets(bounding_box_format="xyxy", keypoints="auto")
    augment = reader.BoxAugmentation(scale_range=(1.0, 1.0))
    dataset = reader.build_dataset(keypoints_dataset, "validation", batch_size=2, image_size=(60, 80), seed=1,
                                   augment=augment, targets=targets, num_epochs=6)
    flips = set()
    for _, batch in dataset:
        for boxes, labels, points in zip(*(batch[k].numpy() for k in ("boxes", "labels", "keypoints"))):
            if (labels >= 0).sum() != 2:
                continue  # b.jpg
            flipped = bool(np.isclose(boxes[0, 0], 80 - 24))
            flips.add(flipped)
            expected = [(80 - 8, 6, 2), (0, 0, 0), (80 - 12, 10, 1)] if flipped else [(8, 6, 2), (12, 10, 1),
                                                                                       (0, 0, 0)]
            assert np.allclose(points[0], expected) and np.allclose(points[1], 0)
    assert flips == {True, False}


def test_the_manifest_records_k_the_points_names_and_the_flip_their_names_give(keypoints_dataset):
    """What ObjectTargets(keypoints=...) to ask for is in the manifest and DatasetInfo, not only in the JSON the
    dataset came from."""
    import json

    manifest = json.loads(open(f"{keypoints_dataset}/manifest.json").read())
    assert manifest["keypoints"] == {"count": 3, "names": ["nose", "left_eye", "right_eye"], "flip": [0, 2, 1]}
    info = reader.dataset_info(keypoints_dataset)
    assert info.keypoint_names == ("nose", "left_eye", "right_eye") and info.keypoint_flip == (0, 2, 1)


def test_a_keypoint_count_other_than_the_records_is_refused_when_the_pipeline_is_built(keypoints_dataset):
    """keypoints=17 on records of 3 points: a ValueError naming both counts and the manifest when the pipeline is
    built (it was a raw TF assertion at the first batch), saying COCO_KEYPOINT_FLIP fits 17 points only."""
    with pytest.raises(ValueError) as raised:
        reader.build_dataset(keypoints_dataset, "validation", batch_size=2, image_size=64, training=False,
                             targets=reader.ObjectTargets(keypoints=17))
    said = str(raised.value)
    assert "ObjectTargets(keypoints=17)" in said and "records hold 3 keypoints an object (nose, left_eye, " \
        "right_eye" in said and f"{keypoints_dataset}/manifest.json" in said, said
    assert 'pass keypoints=3 or keypoints="auto"' in said and "(0, 2, 1)" in said, said
    assert "reader.COCO_KEYPOINT_FLIP fits COCO's 17 person keypoints only" in said, said
    # The flip of COCO's 17 on those records: named as 17 points against the records' 3, where they are checked.
    with pytest.raises(ValueError, match=r"keypoint_flip orders 17 points, and .*'s records \(nose, left_eye, "
                       r"right_eye\) hold 3: .*COCO_KEYPOINT_FLIP fits COCO's 17 person keypoints only"):
        reader.build_dataset(keypoints_dataset, "validation", batch_size=2, image_size=64, training=False,
                             targets=reader.ObjectTargets(keypoints="auto", keypoint_flip=reader.COCO_KEYPOINT_FLIP))


def test_auto_keypoints_need_a_manifest_that_records_them(keypoints_dataset):
    """A manifest written before K was recorded: "auto" is refused naming it and asking for K; an explicit K is
    left to the records' own check."""
    import dataclasses

    from reader.pipeline_checks import keypoint_targets

    info = reader.dataset_info(keypoints_dataset)
    older = dataclasses.replace(info, manifest={k: v for k, v in info.manifest.items() if k != "keypoints"})
    with pytest.raises(ValueError, match=r'keypoints="auto"\) takes K from the manifest, and .*manifest.json '
                       r"records none .*pass keypoints=K"):
        keypoint_targets(reader.ObjectTargets(keypoints="auto"), older)
    assert keypoint_targets(reader.ObjectTargets(keypoints=3), older).keypoints == 3
    resolved = keypoint_targets(reader.ObjectTargets(keypoints="auto", keypoint_flip=(0, 1, 2)), info)
    assert (resolved.keypoints, resolved.keypoint_flip) == (3, (0, 1, 2))  # a flip given is kept


def test_keypoints_with_flips_need_the_points_a_flip_swaps(keypoints_dataset):
    with pytest.raises(ValueError, match=r"3 keypoints an object and flips needs keypoint_flip: the order of the 3 "
                                         r"points after a mirror \(entry i: the point that becomes point i.*"
                                         r"reader.COCO_KEYPOINT_FLIP is COCO's 17 person keypoints' only"):
        reader.build_dataset(keypoints_dataset, "validation", batch_size=2, image_size=64, seed=0,
                             targets=reader.ObjectTargets(keypoints=3))
    with pytest.raises(ValueError, match=r"keypoint_flip must order the 3 points"):
        reader.ObjectTargets(keypoints=3, keypoint_flip=(0, 1, 1))
    with pytest.raises(ValueError, match=r"keypoint_flip orders 17 points, and keypoints=3 asks for 3: .*"
                       r"COCO_KEYPOINT_FLIP fits COCO's 17 person keypoints only; a dataset's own .*keypoint_flip"):
        reader.ObjectTargets(keypoints=3, keypoint_flip=reader.COCO_KEYPOINT_FLIP)
    assert len(reader.COCO_KEYPOINT_FLIP) == 17


@pytest.mark.slow
def test_a_set_without_a_keypoints_file_gets_unlabelled_points_and_reads_with_keypoints(tmp_path):
    """val2017 has person_keypoints_, train2017 instances only: train's objects get K points of visibility 0, a
    warning names train's instances file, and reading train with ObjectTargets(keypoints=3) works (review #57)."""
    from beam_jobs.sources import plan_inputs
    from tests.object_data import CAR, PERSON, jpeg, picture, write_coco

    root = tmp_path / "coco"
    coco_with_keypoints(root)
    write_coco(str(root), "train2017", [{"id": 5, "file_name": "t.jpg", "width": 40, "height": 30}],
               [{"id": 50, "image_id": 5, "category_id": 1, "bbox": [2, 2, 10, 8], "area": 80, "iscrowd": 0}],
               [PERSON, CAR], {"t.jpg": jpeg(picture(40, 30, [(2, 2, 12, 10)], seed=3))})
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert any("instances_train2017.json: no person_keypoints_<set>.json beside it" in w and "3 keypoints of "
               "visibility 0" in w for w in plan.warnings), plan.warnings
    run(ConvertOptions(src=str(root), out=str(tmp_path / "ds"), shards=1), FAST, show_progress=False)
    dataset = reader.build_dataset(str(tmp_path / "ds"), "train", batch_size=1, image_size=(60, 80), training=False,
                                   targets=reader.ObjectTargets(bounding_box_format="xyxy", keypoints=3))
    [(_, points)] = _by_count(dataset).values()
    assert points.shape == (1, 3, 3) and not points.any()  # unlabelled: zeros, visibility 0


def test_a_record_with_objects_and_no_keypoints_is_named_as_such():
    """A record written without keypoints (an older conversion of a set without its keypoints file) is named as
    that, not blamed on the count asked for."""
    import tensorflow as tf

    from reader import keypoints

    with pytest.raises(tf.errors.InvalidArgumentError, match="a record has objects but no keypoints"):
        keypoints.per_object(tf.zeros([0, 3]), 3, tf.zeros([2, 4]))
    assert keypoints.per_object(tf.zeros([0, 3]), 3, tf.zeros([0, 4])).shape == (0, 3, 3)  # no objects: fine


def test_a_mixture_takes_auto_keypoints_when_its_sources_agree_and_refuses_two_counts(keypoints_dataset):
    import dataclasses

    from reader.pipeline_checks import check_mixture_targets

    info = reader.dataset_info(keypoints_dataset)
    resolved = check_mixture_targets(reader.ObjectTargets(keypoints="auto"), [info, info])
    assert (resolved.keypoints, resolved.keypoint_flip) == (3, (0, 2, 1))
    other = dataclasses.replace(info, data_dir="other", manifest={
        **info.manifest, "keypoints": {"count": 2, "names": ["head", "tail"]}})
    with pytest.raises(ValueError, match=r"the sources' manifests record 2 and 3 keypoints an object"):
        check_mixture_targets(reader.ObjectTargets(keypoints="auto"), [info, other])
