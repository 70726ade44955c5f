"""``inspect`` on a COCO set converted with its person_keypoints_ and captions_ files: the points' names and flip,
the objects that carry points and the captions, as it shows boxes and classes (issue #57)."""

from __future__ import annotations

import pytest

from reader.tools import inspect
from tests.object_data import converted_coco_with_keypoints


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> str:
    return converted_coco_with_keypoints(tmp_path_factory.mktemp("inspect_keypoints"))


def test_inspect_shows_the_keypoints_names_flip_objects_with_points_and_the_captions(converted):
    lines = inspect.summarize(converted).splitlines()
    # a.jpg: a person with 2 of 3 points labelled and a car (none); b.jpg: a person with 1. Two captions, on a.jpg.
    assert "keypoints: 3 points an object (nose, left_eye, right_eye); a flip swaps them as 0 2 1 (the manifest's, " \
        "from their names)" in lines, lines
    assert "  objects with labelled keypoints: validation 2 of 3 (3 points labelled)" in lines, lines
    assert "captions: validation 2 on 1 of 2 images; e.g. 'A person beside a car.'" in lines, lines


def test_inspect_says_when_it_counted_keypoints_and_captions_in_a_splits_first_records_only(converted, monkeypatch):
    monkeypatch.setattr(inspect, "SCANNED", 1)  # a split of more records than inspect reads
    lines = inspect.summarize(converted).splitlines()
    counts = [line for line in lines if "objects with labelled keypoints" in line or line.startswith("captions:")]
    assert all(line.count(" in its first 1 of 2 images") == 1 for line in counts) and len(counts) == 2, counts
