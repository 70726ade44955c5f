"""Placed objects packed for the writer (beam_jobs.placed_codec) read back equal to what place() made, in every
field the layout carries, and JSON where the layout does not apply (several labels, unplaced objects, a NUL)."""

from __future__ import annotations

import dataclasses
import random
import struct

import pytest

from beam_jobs import annotations
from beam_jobs.annotations import Box, Labels, Objects
from beam_jobs.files import work_records
from beam_jobs.placed_codec import TAG, decode_placed, encode_placed
from beam_jobs.stage_records import Accepted, ImageRef


def _placed(**given) -> Objects:
    """COCO-like objects in a 640x480 frame placed on an EXIF-turned image (orientation 6: boxes and points turn)."""
    rng = random.Random(7)
    boxes = []
    for index in range(given.pop("boxes", 5)):
        x, y = rng.uniform(0, 300), rng.uniform(0, 200)
        points = tuple(v for k in range(17) for v in ((rng.uniform(x, x + 50), rng.uniform(y, y + 50), k % 3)))
        boxes.append(Box(f"annotation {index} é", rng.randrange(1, 91), x, y, x + rng.uniform(1, 300),
                         y + rng.uniform(1, 200), rng.uniform(0, 5000) if index % 2 else -1.0, index == 1,
                         index == 2, index == 3, '[[1,2,3,4,5,6]]' if given.get("masks") else "",
                         points if given.get("keypoints") else ()))
    boxes.append(Box("annotation empty", 3, 10, 10, 10, 20))  # rejected as box-empty: the tail carries it
    objects = Objects("123", tuple(boxes), (640, 480), **given)
    return annotations.place(objects, (640, 480), 6)


@pytest.mark.parametrize("given", [
    {}, {"keypoints": 17}, {"masks": True}, {"captions": ("a cat", "ein Hund")},
    {"class_mask": ("SegmentationClass/a.png", "")}, {"boxes": 0}, {"boxes": 1}, {"upright": True},
])
def test_placed_objects_read_back_equal_field_for_field(given):
    placed = _placed(**given)
    data = encode_placed(placed)
    assert data[:1] == TAG
    assert decode_placed(data) == placed
    assert encode_placed(decode_placed(data)) == data  # deterministic: the same value, the same bytes


def test_values_keep_their_types_where_the_writer_reads_them():
    placed = _placed(keypoints=17)
    for box, read in zip(placed.boxes, decode_placed(encode_placed(placed)).boxes):
        assert [type(v) for v in read.keypoints] == [type(v) for v in box.keypoints]
        assert all(type(v) is float for v in read[2:7]) and type(read.label) is int


def test_labels_and_unplaced_objects_stay_json():
    labels = Labels((1, 4))
    assert encode_placed(labels) == annotations.encode(labels) and decode_placed(encode_placed(labels)) == labels
    unplaced = Objects("1", (Box("a", 1, 1, 2, 3, 4),), (10, 10))
    assert encode_placed(unplaced) == annotations.encode(unplaced)
    assert decode_placed(annotations.encode(unplaced)) == unplaced  # JSON is read too


def test_a_name_holding_a_nul_falls_back_to_json():
    placed = _placed(boxes=2)
    odd = dataclasses.replace(placed, boxes=(placed.boxes[0]._replace(name="a\0b"), *placed.boxes[1:]))
    data = encode_placed(odd)
    assert data[:1] == b"[" and decode_placed(data) == odd


def test_a_packed_annotation_holding_nuls_round_trips_in_an_accepted_record():
    placed = _placed(boxes=3, masks=True)
    packed = encode_placed(placed)
    assert b"\0" in packed
    item = Accepted(ImageRef("train", "a/b.jpg", 0, "archive.zip:5:10", packed), bytes(32), "", 480, 640)
    read = work_records.decode_accepted(work_records.encode_accepted(bytes(16), item), "train")
    assert read.ref == item.ref and decode_placed(read.ref.annotation) == placed


def test_truncated_bytes_are_refused():
    data = encode_placed(_placed(keypoints=17))
    for cut in (4, 8 * 17, len(data) - 20):
        with pytest.raises((ValueError, struct.error)):
            decode_placed(data[:-cut])


def test_normalized_objects_without_a_mask_frame_and_a_square_image_assumed_frame_read_back_equal():
    yolo = Objects("9", (Box("labels/a.txt line 1", 0, 0.1, 0.2, 0.5, 0.6), Box("labels/a.txt line 2", 2, 0, 0, 1, 1)),
                   annotations.NORMALIZED, upright=True)
    placed = annotations.place(yolo, (64, 64), 3)
    assert placed.mask_frame == () and decode_placed(encode_placed(placed)) == placed
    square = annotations.place(Objects("8", (Box("annotation 1", 1, 1, 2, 30, 40),), (64, 64)), (64, 64), 6)
    assert square.assumed and square.mask_frame == (64, 64)
    assert decode_placed(encode_placed(square)) == square
