"""Properties of what reads strangers' annotations: it never raises, and what it accepts the writer can use.

* :func:`beam_jobs.masks.segmentation_problem` on any JSON value: a string or None, never an exception; a
  segmentation it accepts rasterizes at its frame, at the frame's size, as pycocotools counts it.
* :func:`beam_jobs.annotations.place` on any boxes, frame, size and orientation: never raises; each box it
  keeps lies in [0, 1] and has an area in float32 (what the records store); every box is kept or rejected.
* :func:`beam_jobs.sources.objects.voc_xml.parse` on any bytes, and on generated VOC XML: its documented result only.
"""

from __future__ import annotations

import json
import math
import pytest

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_jobs import annotations, masks
from beam_jobs.annotations import Box, Objects
from beam_jobs.sources.objects import voc_xml

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.sampled_from(["size", "counts", "x"]) | st.text(
        max_size=4), inner, max_size=4),
    max_leaves=30)
frames = st.tuples(st.integers(1, 40), st.integers(1, 40))
coordinates = st.one_of(st.integers(-100, 200), st.floats(-100, 200), st.sampled_from([math.nan, math.inf, 1e300]),
                        st.text(max_size=2), st.booleans())


@st.composite
def polygons(draw, frame):
    if draw(st.booleans()):  # hostile
        return [draw(st.lists(coordinates, min_size=0, max_size=12)) for _ in range(draw(st.integers(0, 3)))]
    width, height = frame  # plausible: points about the image, some past its edge
    point = st.tuples(st.integers(-3, width + 3) | st.floats(-3, width + 3), st.integers(-3, height + 3)
                      | st.floats(-3, height + 3))
    return [[v for xy in draw(st.lists(point, min_size=2, max_size=8)) for v in xy]
            for _ in range(draw(st.integers(1, 3)))]


@st.composite
def rles(draw, frame):
    width, height = frame
    size = draw(st.sampled_from([[height, width], [width, height], [height, width + 1], [0, width], [-height, width],
                                 [65535, 65535], [height], [float(height), width]]))
    if draw(st.booleans()):  # uncompressed: runs summing to the frame's pixels, or not
        counts = draw(st.lists(st.integers(-3, height * width + 2), max_size=10))
        if counts and draw(st.booleans()):
            counts[-1] += height * width - sum(counts)
        return {"size": size, "counts": counts}
    if draw(st.booleans()):  # pycocotools' own string of a real mask, perhaps mutated
        from pycocotools import mask as coco_mask

        pixels = np.array(draw(st.lists(st.booleans(), min_size=height * width, max_size=height * width)),
                          np.uint8).reshape(height, width)
        text = coco_mask.encode(np.asfortranarray(pixels))["counts"].decode("ascii")
        if draw(st.booleans()) and text:
            at = draw(st.integers(0, len(text) - 1))
            text = text[:at] + draw(st.characters(min_codepoint=40, max_codepoint=120)) + text[at + 1:]
        return {"size": size, "counts": text}
    return {"size": size, "counts": draw(st.text(alphabet=st.characters(min_codepoint=44, max_codepoint=115),
                                                 max_size=12))}


@st.composite
def segmentations(draw):
    frame = draw(frames)
    kind = draw(st.sampled_from(["json", "polygons", "rle"]))
    if kind == "json":
        return draw(json_values), frame
    return (draw(polygons(frame)) if kind == "polygons" else draw(rles(frame))), frame


@pytest.mark.slow
@PROPERTY
@given(segmentations(), st.booleans())
def test_a_segmentation_is_accepted_only_when_it_rasterizes_at_its_frame(case, known):
    segmentation, frame = case
    problem = masks.segmentation_problem(segmentation, frame if known else None)
    assert problem is None or (isinstance(problem, str) and problem)
    if problem is not None or not known:
        return
    # What the writer does with it (through the JSON the work files carry): no exception, the frame's size.
    binary = masks.rasterize(json.loads(json.dumps(segmentation)), frame, crowd=isinstance(segmentation, dict))
    assert binary.shape == (frame[1], frame[0]) and set(np.unique(binary)) <= {0, 1}
    if isinstance(segmentation, dict) and isinstance(segmentation["counts"], str):
        from pycocotools import mask as coco_mask

        rle = {"size": segmentation["size"], "counts": segmentation["counts"].encode("ascii")}
        assert int(coco_mask.area(rle)) == int(binary.sum())  # the counts pycocotools read are the ones checked


@PROPERTY
@given(json_values, st.one_of(st.none(), frames), st.integers(1, 10_000))
def test_segmentation_problem_never_raises(value, frame, max_pixels):
    problem = masks.segmentation_problem(value, frame, max_pixels)
    assert problem is None or isinstance(problem, str)


@st.composite
def placements(draw):
    stored = draw(st.tuples(st.integers(1, 64), st.integers(1, 64)))
    frame = draw(st.sampled_from([annotations.NORMALIZED, annotations.STORED, stored, stored, stored[::-1],
                                  (stored[0] + 1, stored[1])]))
    scale = 1.0 if frame == annotations.NORMALIZED else 64.0
    number = st.one_of(st.floats(-0.1 * scale, 1.1 * scale), st.floats(-0.1 * scale, 1.1 * scale),
                       st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 70))
    boxes = []
    for index in range(draw(st.integers(0, 5))):
        x0, y0 = draw(number), draw(number)
        shape = draw(st.sampled_from(["any", "sliver", "box", "box"]))
        if shape != "any" and all(isinstance(v, float) and math.isfinite(v) for v in (x0, y0)):
            grow = st.floats(0, 1e-6) if shape == "sliver" else st.floats(0.01 * scale, 0.5 * scale)  # slivers: empty in float32
            x1, y1 = x0 + draw(grow), y0 + draw(grow)
        else:
            x1, y1 = draw(number), draw(number)
        mask = draw(st.sampled_from(["", "[[1,1,5,1,5,5]]", "[[0,0,64,0,64,64,0,64]]", '{"size":[1,1],"counts":[1]}',
                                     f'{{"size":[{stored[1]},{stored[0]}],"counts":[{stored[0] * stored[1]}]}}', "{",
                                     "[]"]))
        boxes.append(Box(f"object {index}", draw(st.integers(0, 3)), x0, y0, x1, y1, draw(st.floats(-1, 100)),
                         mask=mask))
    objects = Objects("1", tuple(boxes), frame, draw(st.booleans()), masks=draw(st.booleans()))
    return objects, stored, draw(st.integers(-1, 10)), draw(st.sampled_from(["auto", "stored", "upright"]))


@PROPERTY
@given(placements())
def test_place_never_raises_and_keeps_only_boxes_the_records_can_hold(case):
    objects, stored, orientation, given_frame = case
    placed = annotations.place(objects, stored, orientation, given_frame)
    assert len(placed.boxes) + len(placed.rejected) == len(objects.boxes) + len(objects.rejected)
    for box in placed.boxes:
        corners = np.float32([box.xmin, box.ymin, box.xmax, box.ymax])
        assert ((0 <= corners) & (corners <= 1)).all()
        assert corners[2] > corners[0] and corners[3] > corners[1]
    assert all(reason in annotations.OBJECT_REASONS for _, reason, _ in placed.rejected)
    if placed.masks:  # what the writer then draws: never an exception
        for box in placed.boxes:
            masks.mask_png(box.mask, placed.mask_frame, placed.mask_turn, stored, box.crowd)
    assert annotations.decode(annotations.encode(placed)) == placed


def _check_parsed(result) -> None:
    if isinstance(result, str):
        assert result
        return
    frame, objects = result
    assert frame == annotations.STORED or (isinstance(frame, tuple) and min(frame) > 0)
    for name, x0, y0, x1, y1, difficult, truncated in objects:
        assert isinstance(name, str) and name == name.strip() and name
        assert all(isinstance(v, float) for v in (x0, y0, x1, y1))
        assert isinstance(difficult, bool) and isinstance(truncated, bool)


@PROPERTY
@given(st.binary(max_size=300))
def test_voc_parse_of_any_bytes_is_its_result_or_what_is_wrong(data):
    _check_parsed(voc_xml.parse(data, "Annotations/x.xml"))


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\n\t <>&"), max_size=8)


@st.composite
def voc_xmls(draw):
    def element(tag: str, value: st.SearchStrategy) -> str:
        return draw(st.sampled_from(["", f"<{tag}>{_escape(draw(value))}</{tag}>", f"<{tag}/>"]))

    number = st.one_of(st.integers(-5, 500).map(str), st.floats().map(repr), texts)
    size = (f"<size>{element('width', number)}{element('height', number)}</size>" if draw(st.booleans()) else "")
    objects = "".join(
        "<object>" + element("name", st.sampled_from(["dog", " person\n", "Dog"]) | texts)
        + element("difficult", st.sampled_from(["0", "1", "true", "x"])) + element("truncated", texts)
        + (("<bndbox>" + "".join(element(k, number) for k in ("xmin", "ymin", "xmax", "ymax")) + "</bndbox>")
           if draw(st.booleans()) else "") + "</object>"
        for _ in range(draw(st.integers(0, 3))))
    return f"<annotation>{size}{objects}</annotation>".encode("utf-8")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@PROPERTY
@given(voc_xmls())
def test_voc_parse_of_generated_xml_is_its_result_or_what_is_wrong(data):
    _check_parsed(voc_xml.parse(data, "Annotations/x.xml"))
