"""Objects placed on the stored image: turned with EXIF orientation in either frame, normalized, bad ones named.

Checked by content: every generated object is a red rectangle on gray noise, so a placed box is right
when the written image is red inside it.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from beam_jobs import annotations, placed_codec
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


def test_a_box_with_area_in_float64_but_none_in_float32_is_rejected_as_empty():
    """The records store float32: a box 1e-9 wide would reach them with no area, and verify would flag it."""
    boxes = (Box("annotation 1", 1, 40, 10, 40 + 8e-8, 20), Box("annotation 2", 1, 10, 10, 20, 10 + 1e-7))
    placed = annotations.place(Objects("7", boxes + _boxes(BOXES[:1]), frame=(80, 48)), (80, 48), 1)
    assert [(name, reason) for name, reason, _ in placed.rejected] == [
        ("annotation 1", annotations.BOX_EMPTY), ("annotation 2", annotations.BOX_EMPTY)]
    assert "float32" in placed.rejected[0][2] and len(placed.boxes) == 1


def test_a_normalized_box_outside_the_image_is_told_in_pixels_of_the_image_its_fractions_are_of():
    box = Box("labels/train/a.txt line 2", 1, 0.5, 0.25, 1.5, 0.5)
    placed = annotations.place(Objects("7", (box,), upright=True), (640, 480), 6)  # upright: 480x640
    [(name, reason, detail)] = placed.rejected
    assert (name, reason) == ("labels/train/a.txt line 2", annotations.BOX_OUTSIDE)
    assert "1x1 (normalized)" in detail and "x 240.0..720.0, y 160.0..320.0 of 480x640" in detail


def test_a_segmentation_that_cannot_be_drawn_on_this_image_rejects_its_object_as_bad_mask():
    polygon = json.dumps([[10, 5, 30, 5, 30, 20, 10, 20]])
    boxes = (Box("annotation 1", 1, 10, 5, 30, 20, mask=polygon),
             Box("annotation 2", 1, 10, 5, 30, 20, mask=json.dumps({"size": [48, 80], "counts": [3840]})),
             Box("annotation 3", 1, 10, 5, 30, 20, mask=json.dumps({"size": [80, 48], "counts": [3840]})),
             Box("annotation 4", 1, 10, 5, 30, 20, mask=json.dumps([["1", "2", "3", "4", "5", "6"]])),
             Box("annotation 5", 1, 10, 5, 30, 20, mask="{not json"))
    placed = annotations.place(Objects("7", boxes, frame=(80, 48), masks=True), (80, 48), 1)
    assert [box.name for box in placed.boxes] == ["annotation 1", "annotation 2"]
    assert [(name, reason) for name, reason, _ in placed.rejected] == [
        (f"annotation {i}", annotations.BAD_MASK) for i in (3, 4, 5)]
    assert "[80, 48]" in placed.rejected[0][2] and "80x48" in placed.rejected[0][2]
    assert annotations.BAD_MASK in annotations.OBJECT_REASONS


@pytest.mark.parametrize("orientation, size, upright, assumed", [
    (1, (80, 48), False, ""), (3, (80, 48), False, "stored"), (3, (80, 48), True, "upright"),
    (2, (80, 48), False, "stored"), (6, (80, 48), False, ""), (6, (64, 64), True, "upright")])
def test_the_frame_taken_when_the_images_size_cannot_tell_is_named(orientation, size, upright, assumed):
    """EXIF 2-4 (or a square image) keep the size: stored and upright frames fit alike, and the frame taken shows."""
    placed = annotations.place(Objects("7", _boxes([(1, 1, 10, 10)]), frame=size, upright=upright), size, orientation)
    assert placed.assumed == assumed
    assert annotations.decode(annotations.encode(placed)) == placed


@pytest.mark.parametrize("name", ["do\ng", "dog\r", "a\x00b", "x\x1fy", "nel\x85", "ls\u2028", "ps\u2029", "del\x7f"])
def test_a_class_name_with_a_control_character_or_a_line_break_is_refused_naming_where(name):
    problem = annotations.class_name_problem(name, "data.yaml names 2")
    assert problem.startswith(f"data.yaml names 2: the class name {name!r} holds a control character")
    for fine in ("dog", "Hund mit Hütte", "犬", "a b\u00a0c", "👍🏽"):
        assert annotations.class_name_problem(fine, "x") is None


@pytest.mark.parametrize("given, on_the_object", [("auto", False), ("upright", True), ("stored", False)])
def test_annotation_frame_decides_the_frame_where_the_size_cannot_tell(tmp_path, given, on_the_object):
    """A COCO box drawn on the upright view of a 180-degree-turned photo (EXIF 3: the size tells nothing). COCO's
    convention turns it, onto the wrong content, and says it assumed so; --annotation-frame upright puts it right."""
    from beam_jobs.stage_records import ImageRef
    from beam_jobs.stages.validate import validate_ref

    (tmp_path / "a.jpg").write_bytes(jpeg(picture(80, 48, BOXES[:1]), 3))
    objects = Objects("7", _boxes(BOXES[:1]), frame=(80, 48), upright=False)  # COCO: the stored frame, when ambiguous
    ref = ImageRef("train", "a.jpg", 0, "", annotations.encode(objects))
    accepted, encoded, _ = validate_ref(str(tmp_path), ref, EncodeOptions(annotation_frame=given))
    placed = placed_codec.decode_placed(accepted.ref.annotation)  # packed for the writer
    pixels = np.asarray(Image.open(io.BytesIO(encoded.data)).convert("RGB"))
    [box] = placed.boxes
    assert (red_fraction(pixels, (box.xmin, box.ymin, box.xmax, box.ymax)) > 0.9) == on_the_object
    assert placed.assumed == ("stored" if given == "auto" else "")


def test_annotation_frame_upright_reads_an_annotation_without_a_size_as_upright_pixels():
    box = Box("object 1", 1, 10, 5, 30, 20)  # drawn on the upright 48x80 view of an EXIF-6 image stored 80x48
    auto = annotations.place(Objects("7", (box,), frame=annotations.STORED), (80, 48), 6)
    upright = annotations.place(Objects("7", (box,), frame=annotations.STORED), (80, 48), 6, "upright")
    assert auto.assumed == "stored" and auto.mask_turn == 6
    assert upright.boxes[0][2:6] == (10 / 48, 5 / 80, 30 / 48, 20 / 80) and upright.mask_turn == 1


def test_the_annotation_frame_flag_reaches_the_options_and_refuses_other_words():
    from converter.cli import build_convert_parser

    args, _ = build_convert_parser().parse_known_args(["--src", "x", "--annotation-frame", "upright"])
    assert args.annotation_frame == "upright"
    with pytest.raises(ValueError, match="--annotation-frame must be one of auto, stored, upright"):
        EncodeOptions(annotation_frame="sideways")
