"""Objects placed on the stored image: turned with EXIF orientation in either frame, normalized, bad ones named.

Checked by content: every generated object is a red rectangle on gray noise, so a placed box is right
when the written image is red inside it.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from beam_jobs import annotations
from beam_jobs.annotations import Box, Objects
from beam_jobs.options import EncodeOptions
from beam_jobs.stages.encode import Encoded, encode_image
from tests.object_data import jpeg, jpeg_as_stored, picture, red_fraction

BOXES = ((10, 5, 30, 20), (50, 30, 70, 44))  # pixel boxes of an 80x48 picture


def _written(data: bytes, objects: Objects, options: EncodeOptions = EncodeOptions()) -> tuple[np.ndarray, Objects]:
    encoded = encode_image(data, options)
    assert isinstance(encoded, Encoded)
    placed = annotations.place(objects, encoded.input_size, encoded.orientation)
    return np.asarray(Image.open(io.BytesIO(encoded.data)).convert("RGB")), placed


def _boxes(boxes, label: int = 1) -> tuple[Box, ...]:
    return tuple(Box(f"annotation {i}", label, *map(float, box)) for i, box in enumerate(boxes))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("max_side", [None, 40])
def test_boxes_drawn_on_the_upright_image_stay_on_their_objects(orientation, max_side):
    """CVAT's, Label Studio's, Roboflow's frame: the annotation's size is the upright image's."""
    data = jpeg(picture(80, 48, BOXES), orientation)
    objects = Objects("7", _boxes(BOXES), frame=(80, 48), upright=True)
    pixels, placed = _written(data, objects, EncodeOptions(max_side=max_side))
    assert pixels.shape[:2] == ((48, 80) if max_side is None else (24, 40))
    assert len(placed.boxes) == 2 and not placed.rejected
    for box in placed.boxes:
        assert red_fraction(pixels, (box.xmin, box.ymin, box.xmax, box.ymax)) > 0.9


@pytest.mark.parametrize("orientation", range(1, 9))
def test_boxes_drawn_on_the_stored_pixels_turn_with_the_image(orientation):
    """COCO's tools' frame (EXIF ignored): the annotation's size is the stored pixels'; the boxes turn."""
    data = jpeg_as_stored(picture(80, 48, BOXES), orientation)
    objects = Objects("7", _boxes(BOXES), frame=(80, 48), upright=False)
    pixels, placed = _written(data, objects)
    assert pixels.shape[:2] == ((80, 48) if orientation >= 5 else (48, 80))  # written upright
    assert len(placed.boxes) == 2 and not placed.rejected
    for box in placed.boxes:
        assert red_fraction(pixels, (box.xmin, box.ymin, box.xmax, box.ymax)) > 0.9


@pytest.mark.parametrize("orientation", [1, 3, 6])
def test_normalized_boxes_in_the_upright_frame_stay_on_their_objects(orientation):
    """YOLO's labels: normalized, in the upright frame (Ultralytics applies EXIF)."""
    data = jpeg(picture(80, 48, BOXES), orientation)
    normalized = [(x0 / 80, y0 / 48, x1 / 80, y1 / 48) for x0, y0, x1, y1 in BOXES]
    pixels, placed = _written(data, Objects("7", _boxes(normalized), upright=True))
    for box in placed.boxes:
        assert red_fraction(pixels, (box.xmin, box.ymin, box.xmax, box.ymax)) > 0.9


def test_a_box_past_the_edge_within_a_pixel_is_clipped_and_further_out_is_rejected_by_name():
    data = jpeg(picture(80, 48, BOXES))
    boxes = (Box("annotation 1", 1, -0.6, 0, 30, 48.8), Box("annotation 2", 1, 60, 10, 82, 20),
             Box("annotation 3", 1, 10, 10, 10, 20), Box("annotation 4", 1, float("nan"), 1, 2, 3))
    _, placed = _written(data, Objects("7", boxes, frame=(80, 48)))
    assert [(b.xmin, b.ymin, b.xmax, b.ymax) for b in placed.boxes] == [(0.0, 0.0, 30 / 80, 1.0)]
    assert [(name, reason) for name, reason, _ in placed.rejected] == [
        ("annotation 2", annotations.BOX_OUTSIDE), ("annotation 3", annotations.BOX_EMPTY),
        ("annotation 4", annotations.BOX_NOT_A_NUMBER)]


def test_an_annotation_for_another_size_of_image_rejects_its_objects_and_keeps_the_image():
    data = jpeg(picture(80, 48, BOXES))
    _, placed = _written(data, Objects("7", _boxes(BOXES), frame=(640, 480)))
    assert placed.boxes == ()
    assert {reason for _, reason, _ in placed.rejected} == {annotations.FRAME_MISMATCH}
    assert "640x480" in placed.rejected[0][2] and "80x48" in placed.rejected[0][2]


def test_area_is_the_sources_scaled_to_the_image_or_the_boxs():
    data = jpeg(picture(80, 48, BOXES))
    boxes = (Box("a", 1, 0, 0, 40, 24, area=100.0), Box("b", 1, 0, 0, 40, 24))
    _, placed = _written(data, Objects("7", boxes, frame=(80, 48)))
    assert [round(b.area * 80 * 48, 3) for b in placed.boxes] == [100.0, 960.0]


def test_the_value_round_trips_through_its_bytes():
    objects = Objects("42", (Box("annotation 9", 90, 1.5, 2, 3, 4, 5.0, True, True, False),), (640, 480), False,
                      (("annotation 3", annotations.UNKNOWN_CLASS, "category_id 12"),))
    assert annotations.decode(annotations.encode(objects)) == objects
