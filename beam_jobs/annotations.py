"""An image's objects (or several labels), as one typed value from the source that lists them to the writer.

    source (coco, yolo) --Objects in the annotation's frame--> ImageRef.annotation (compact JSON)
    validate: place() on the stored image --Objects normalized, upright, bad ones named--> Accepted
    write: the record's per-object features (beam_jobs.stages.write)

A source attaches an :class:`Objects` to each image it lists, in the frame its annotation file gives:
pixels of a width and height the file declares (COCO, VOC), or coordinates normalized to the image
(YOLO). It travels with its image through the work files, so a worker gets an image's objects with
the image and no process holds the dataset's annotations. Once a worker has decoded the image,
:func:`place` puts the objects on the stored image: turned as EXIF orientation turned the pixels,
normalized to [0, 1], clipped within a pixel, and each object that cannot be placed (an empty box, a box
outside the image, a frame that is not this image's) rejected with a reason and its name. Nothing else
looks inside the value.

Which frame are the boxes in? The annotation's width and height say it: equal to the upright image
(what CVAT, Label Studio and Roboflow write), the boxes are upright already; equal to the pixels as
stored (what COCO's own tools and Model Garden's scripts read, ignoring EXIF), they turn with the image.
When the two frames have the same size (no EXIF turn, a mirror, a square image) or the coordinates are
normalized, the source says which it means (``upright``): YOLO's labels are upright, since Ultralytics
reads images with EXIF applied. Where that choice turned an image's boxes (an EXIF orientation other than 1),
the placed value names the frame taken (``assumed``), and ``--annotation-frame stored|upright`` overrides
the source's word.
"""

from __future__ import annotations

import dataclasses
import json
import math
import unicodedata
from typing import NamedTuple, Optional, Union

import numpy as np

from beam_jobs import masks
from beam_jobs.options import DEFAULT_MAX_PIXELS

# Reasons an object is rejected (rejected.jsonl, with the object's name in "annotation").
BOX_EMPTY = "box-empty"  # zero or negative width or height
BOX_OUTSIDE = "box-outside-image"  # past the image's edge by more than a pixel
BOX_NOT_A_NUMBER = "box-not-a-number"  # a coordinate that is NaN, infinite or not a number
UNKNOWN_CLASS = "unknown-class"  # a class id the dataset's class list does not have
FRAME_MISMATCH = "frame-mismatch"  # the annotation's image size is neither the stored nor the upright image's
BAD_ANNOTATION = "bad-annotation"  # a line or entry that does not parse
BAD_MASK = "bad-mask"  # --masks: a segmentation that cannot be rasterized on its image (beam_jobs.masks)
# An object without an extent (a box of zero width or height: nothing to learn, nothing to teach as background) is
# dropped from its image and counted, as Model Garden's and Detectron2's loaders drop them. Any other rejected object
# has an extent that cannot be written, and rejects its image (:func:`unwritable`).
NO_EXTENT = (BOX_EMPTY,)
OBJECT_REASONS = (BOX_EMPTY, BOX_OUTSIDE, BOX_NOT_A_NUMBER, UNKNOWN_CLASS, FRAME_MISMATCH, BAD_ANNOTATION, BAD_MASK)

# Objects.assumed: which frame place() took boxes to be in when the image's size fits both.
ASSUMED_STORED, ASSUMED_UPRIGHT = "stored", "upright"
AUTO_FRAME = "auto"  # --annotation-frame: the source's word where the size cannot tell (else ASSUMED_*)

NORMALIZED = (0, 0)  # the frame of coordinates given as fractions of the image's width and height
STORED = (-1, -1)  # pixels of the image as stored, whatever its size (an annotation that gives no size)


class Box(NamedTuple):
    """One object: its box's corners in its frame's units, its class, and the flags datasets give.

    A NamedTuple: a million of them are encoded while a large dataset is planned, and tuples are
    built and serialized many times faster than dataclasses.

    ``name`` is how the rejection report names it: ``annotation 123`` (COCO's id), ``labels/train/a.txt
    line 3`` (YOLO). ``area``: the source's own area in frame pixels (COCO's segment area), -1 when none
    is given (then it is the box's).
    """

    name: str
    label: int
    xmin: float
    ymin: float
    xmax: float
    ymax: float
    area: float = -1.0
    crowd: bool = False
    difficult: bool = False
    truncated: bool = False
    mask: str = ""  # with --masks: its COCO segmentation (polygons, or a crowd's RLE) as JSON, in frame pixels
    keypoints: tuple = ()  # COCO's keypoints: x, y, visibility for each point, in frame units (placed: normalized)


@dataclasses.dataclass(frozen=True)
class Objects:
    """An image's objects, and what its source already refused.

    Attributes:
      source_id: the image's id as decimal text (``image/source_id``: COCO's image id, or one derived
        from the file's path).
      boxes: the objects.
      frame: ``(width, height)`` in pixels that the boxes' coordinates refer to; :data:`NORMALIZED`
        when they are fractions of the image, :data:`STORED` for the stored pixels whatever their size.
      upright: when the frame's size does not tell, whether the boxes are in the upright image's frame.
      rejected: objects refused before the image was read (an unknown class, a line that does not
        parse), and, once placed, those that could not be placed: ``(name, reason, detail)``.
      masks: the record holds each object's mask (``--masks``: from ``Box.mask``).
      mask_frame, mask_turn: once placed, the pixel frame the masks are drawn in and the EXIF orientation
        that turns them as the image was turned (1: none).
      class_mask: the image's semantic mask, ``(path, locator)`` of a PNG of class ids the size of the
        stored image (VOC's ``SegmentationClass/``), ``()`` for none.
      assumed: once placed, the frame the boxes were taken to be in when the image's size could not tell
        (:data:`ASSUMED_STORED` or :data:`ASSUMED_UPRIGHT`: an EXIF-turned image whose stored and upright
        frames have the same size, orientations 2-4 or a square image), "" when it could or nothing turned.
      captions: the image's captions (COCO's ``captions_*.json``), written as ``image/caption``.
      keypoints: when not 0, every box holds that many ``(x, y, visibility)`` points in ``Box.keypoints`` (the
        TF Object Detection API's layout: zeros, visibility 0, for an object that has none), written as
        ``image/object/keypoint/*``.
    """

    source_id: str
    boxes: tuple[Box, ...] = ()
    frame: tuple[int, int] = NORMALIZED
    upright: bool = False
    rejected: tuple[tuple[str, str, str], ...] = ()
    masks: bool = False
    mask_frame: tuple[int, ...] = ()
    mask_turn: int = 1
    class_mask: tuple[str, ...] = ()  # a semantic mask's (path in SRC, locator): a PNG of class ids, pixel by pixel
    orientation: int = 1  # once placed: the image's EXIF orientation, which turns its class mask too
    assumed: str = ""  # once placed: ASSUMED_STORED or ASSUMED_UPRIGHT when the frame's size could not tell
    captions: tuple[str, ...] = ()  # COCO's captions of the image (captions_*.json): image/caption
    keypoints: int = 0  # the points each box's keypoints hold (COCO's person_keypoints_*.json: 17), 0 for none


@dataclasses.dataclass(frozen=True)
class Labels:
    """Several classes of one image (a multi-label dataset: Planet's tags, the Hub's Sequence(ClassLabel)):
    their ids, sorted, each once; none for an image that shows no class."""

    ids: tuple[int, ...]


Annotation = Union[Objects, Labels]


# How sources write a box (--bbox-format names them as the Hub's datasets do): COCO's [x, y, width, height] from
# the top-left, Pascal VOC's [xmin, ymin, xmax, ymax], YOLO's [cx, cy, width, height] (normalized by its source).
BOX_FORMATS = ("coco", "pascal_voc", "yolo")


def corners(box_format: str, a: float, b: float, c: float, d: float) -> tuple[float, float, float, float]:
    """``(xmin, ymin, xmax, ymax)`` of a box written in ``box_format`` (one of :data:`BOX_FORMATS`): the one
    place a source's box becomes corners."""
    if box_format == "coco":
        return a, b, a + c, b + d
    if box_format == "yolo":
        return a - c / 2, b - d / 2, a + c / 2, b + d / 2
    if box_format == "pascal_voc":
        return a, b, c, d
    raise ValueError(f"{box_format!r} is not one of {', '.join(BOX_FORMATS)}")


def encode(annotation: Annotation) -> bytes:
    """Compact JSON (deterministic): what ``ImageRef.annotation`` carries between stages."""
    if isinstance(annotation, Labels):
        value: list = ["labels", list(annotation.ids)]
    else:
        value = ["objects", annotation.source_id, [list(box) if box.keypoints else list(box)[:-1]
                                                   for box in annotation.boxes], list(annotation.frame),
                 annotation.upright, [list(item) for item in annotation.rejected], annotation.masks,
                 list(annotation.mask_frame), annotation.mask_turn, list(annotation.class_mask),
                 annotation.orientation, *([annotation.assumed] if annotation.assumed or annotation.captions
                                           or annotation.keypoints else []),
                 *([list(annotation.captions), annotation.keypoints] if annotation.captions or annotation.keypoints
                   else [])]
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode(data: bytes) -> Annotation:
    """Inverse of :func:`encode`."""
    kind, *value = json.loads(data)
    if kind == "labels":
        return Labels(tuple(value[0]))
    source_id, boxes, frame, upright, rejected, with_masks, mask_frame, mask_turn, class_mask, orientation, *rest = value
    assumed, captions, keypoints = [*rest, *["", [], 0][len(rest):]]  # older work files end sooner
    return Objects(source_id, tuple(_box(box) for box in boxes), tuple(frame), upright,
                   tuple(tuple(item) for item in rejected), with_masks, tuple(mask_frame), mask_turn, tuple(class_mask),
                   orientation, assumed, tuple(captions), keypoints)


_FIELDS = len(Box._fields)
_new_tuple = tuple.__new__  # a Box from its values without NamedTuple's keyword-handling __new__: half the cost


def _box(values: list) -> Box:
    if len(values) == _FIELDS - 1:  # keypoints (the last field) written only where there are some
        return _new_tuple(Box, (*values, ()))
    box = Box(*values)
    return box._replace(keypoints=tuple(box.keypoints)) if box.keypoints else box


def _turn(x: float, y: float, orientation: int) -> tuple[float, float]:
    """Where the normalized point ``(x, y)`` of the stored pixels lands in the upright image.

    The EXIF orientations, as Pillow's ``exif_transpose`` applies them: 2 mirror, 3 rotate 180,
    4 flip, 5 transpose, 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise.
    """
    return {1: (x, y), 2: (1 - x, y), 3: (1 - x, 1 - y), 4: (x, 1 - y), 5: (y, x), 6: (1 - y, x),
            7: (1 - y, 1 - x), 8: (y, 1 - x)}[orientation]


def upright_size(stored: tuple[int, int], orientation: int) -> tuple[int, int]:
    """``(width, height)`` of the stored pixels once turned upright: swapped by orientations 5-8."""
    return (stored[1], stored[0]) if orientation in (5, 6, 7, 8) else stored


def place(objects: Objects, stored: tuple[int, int], orientation: int, given_frame: str = AUTO_FRAME,
          max_pixels: int = DEFAULT_MAX_PIXELS) -> Objects:
    """The objects on the upright image, normalized, with every object that cannot be placed rejected.

    ``stored``: the image file's ``(width, height)`` before any turn or resize; ``orientation``: the EXIF
    orientation the converter applied (1: none). Boxes normalized to the upright image stay right under
    ``--max-side``, which scales both axes alike. A box past the edge by at most a pixel (rounding) is
    clipped; further out, it is rejected, as is an empty one: empty as the records store it, in float32
    (a box a float64 apart would reach the records with no area). With masks, an object whose segmentation
    cannot be rasterized on this image (:func:`beam_jobs.masks.segmentation_problem`) is rejected as
    ``bad-mask``: the writer then never meets one. Where the image's size cannot tell the frame (an EXIF
    turn that keeps the size, or a square image) the result's ``assumed`` names the frame taken.

    ``given_frame`` (``--annotation-frame``): ``auto`` takes the source's word (``objects.upright``) where the
    size cannot tell; ``stored`` or ``upright`` overrides it there, for normalized coordinates, and for an
    annotation that gives no size (then read as pixels of the upright image with ``upright``). Where the
    annotation's size fits only one frame, the size decides. ``max_pixels`` (``--max-pixels``) caps a mask's.
    """
    orientation = orientation if orientation in range(1, 9) else 1
    if given_frame in (ASSUMED_STORED, ASSUMED_UPRIGHT):
        objects = dataclasses.replace(objects, upright=given_frame == ASSUMED_UPRIGHT)
        if objects.frame == STORED and objects.upright:
            objects = dataclasses.replace(objects, frame=upright_size(stored, orientation))
    taken = _frame_taken(objects, stored, orientation, given_frame)
    rejected = list(objects.rejected)
    if isinstance(taken, str):  # the annotation's size is neither frame's
        rejected += [(box.name, FRAME_MISMATCH, taken) for box in objects.boxes]
        return Objects(objects.source_id, (), NORMALIZED, True, tuple(rejected), objects.masks, (), 1,
                       objects.class_mask, orientation, "", objects.captions, objects.keypoints)
    mask_frame = () if objects.frame == NORMALIZED else (int(taken.frame[0]), int(taken.frame[1]))
    scaled = objects.masks and objects.frame == NORMALIZED  # YOLO's polygons: fractions of the image's pixels
    if scaled:
        mask_frame = taken.pixels
    placed = []
    for box in objects.boxes:
        result = _placed(box, taken, orientation)
        if not isinstance(result, Box):
            rejected.append((box.name, *result))
            continue
        mask = _in_pixels(box.mask, taken.pixels) if scaled else box.mask
        problem = _mask_problem(mask, mask_frame, max_pixels) if objects.masks else None
        if problem:
            rejected.append((box.name, BAD_MASK, problem))
            continue
        placed.append(result._replace(mask=mask) if scaled else result)
    return Objects(objects.source_id, tuple(placed), NORMALIZED, True, tuple(rejected), objects.masks, mask_frame,
                   orientation if taken.turn else 1, objects.class_mask, orientation,
                   taken.assumed if placed else "", objects.captions, objects.keypoints)


class _Frame(NamedTuple):
    """The frame boxes are read in: its size in their units, whether they turn with the EXIF orientation, one
    pixel in their units, the image it measures in pixels, and the frame assumed where the size could not tell."""

    frame: tuple[float, float]
    turn: bool
    pixel: tuple[float, float]
    pixels: tuple[int, int]
    assumed: str


def _frame_taken(objects: Objects, stored: tuple[int, int], orientation: int, given_frame: str) -> Union[_Frame, str]:
    """The frame ``objects``' coordinates are in on this image, or why the annotation's size fits neither frame."""
    upright = upright_size(stored, orientation)
    if objects.frame == NORMALIZED:
        turn = not objects.upright
        pixels = stored if turn else upright  # the image the fractions are of
        return _Frame((1.0, 1.0), turn, (1 / pixels[0], 1 / pixels[1]), pixels, "")
    if objects.frame == STORED:
        return _Frame((float(stored[0]), float(stored[1])), True, (1.0, 1.0), stored,
                      ASSUMED_STORED if orientation != 1 and given_frame == AUTO_FRAME else "")
    matches_upright, matches_stored = objects.frame == upright, objects.frame == stored
    if not (matches_upright or matches_stored):
        return (f"the annotation is for a {objects.frame[0]}x{objects.frame[1]} image; this one is "
                f"{stored[0]}x{stored[1]}" + (f" ({upright[0]}x{upright[1]} upright)" if upright != stored else ""))
    turn = matches_stored and (not matches_upright or not objects.upright)
    assumed = ""
    if matches_stored and matches_upright and orientation != 1 and given_frame == AUTO_FRAME:
        assumed = ASSUMED_STORED if turn else ASSUMED_UPRIGHT
    return _Frame((float(objects.frame[0]), float(objects.frame[1])), turn, (1.0, 1.0), objects.frame, assumed)


def _placed(box: Box, taken: _Frame, orientation: int) -> Union[Box, tuple[str, str]]:
    """``box`` normalized on the upright image, or why it cannot be: ``(reason, detail)``."""
    frame = taken.frame
    problem = _problem(box, frame, taken.pixel, taken.pixels)
    if problem:
        return problem
    x0, y0 = max(0.0, box.xmin / frame[0]), max(0.0, box.ymin / frame[1])
    x1, y1 = min(1.0, box.xmax / frame[0]), min(1.0, box.ymax / frame[1])
    if x1 <= x0 or y1 <= y0:  # within a pixel of the edge, but wholly outside it
        return BOX_OUTSIDE, f"box x {box.xmin:g}..{box.xmax:g}, y {box.ymin:g}..{box.ymax:g} lies outside the image"
    if taken.turn and orientation != 1:
        (ax, ay), (bx, by) = _turn(x0, y0, orientation), _turn(x1, y1, orientation)
        x0, x1, y0, y1 = min(ax, bx), max(ax, bx), min(ay, by), max(ay, by)
    # What the records store (float32): corners in [0, 1] more than _F32_APART apart stay apart once rounded (each
    # moves by at most half an ulp, 2**-25), so only a box that narrow pays for the float32 rounding.
    if (x1 - x0 <= _F32_APART or y1 - y0 <= _F32_APART) and \
            (np.float32(x1) <= np.float32(x0) or np.float32(y1) <= np.float32(y0)):
        return BOX_EMPTY, (f"box x {box.xmin:g}..{box.xmax:g}, y {box.ymin:g}..{box.ymax:g} has no area once stored "
                           "(float32)")
    area = box.area / (frame[0] * frame[1]) if box.area >= 0 else (x1 - x0) * (y1 - y0)
    points = _placed_points(box.keypoints, frame, orientation if taken.turn else 1) if box.keypoints else ()
    # A Box from its fields in order (Box._replace costs as much as the rest of placing it: #57 §6).
    return _new_tuple(Box, (box.name, box.label, x0, y0, x1, y1, area, box.crowd, box.difficult, box.truncated,
                            box.mask, points))


_F32_APART = 1e-6


def _placed_points(points: tuple, frame: tuple[float, float], orientation: int) -> tuple:
    """Keypoints ``(x, y, visibility, ...)`` in frame units, normalized to the upright image as the boxes are
    (clipped to [0, 1], turned by ``orientation``); a point not labelled (visibility 0) stays ``0, 0, 0``, as COCO
    and the TF Object Detection API's script write it."""
    placed = []
    for index in range(0, len(points) - 2, 3):
        x, y, visible = points[index:index + 3]
        if not visible:
            placed += [0.0, 0.0, 0]
            continue
        x, y = _turn(min(max(x / frame[0], 0.0), 1.0), min(max(y / frame[1], 0.0), 1.0), orientation)
        placed += [x, y, int(visible)]
    return tuple(placed)


def _problem(box: Box, frame: tuple[float, float], pixel: tuple[float, float],
             pixels: tuple[int, int]) -> Optional[tuple[str, str]]:
    """Why ``box`` cannot be placed in a ``frame`` (width, height), or None; ``pixel``: one pixel in its units,
    ``pixels``: the ``(width, height)`` in pixels of the image the frame measures."""
    corners = (box.xmin, box.ymin, box.xmax, box.ymax)
    # Four floats whose sum is finite are each finite (the common case, one test); anything else is looked at
    # one by one (a sum can overflow, an int or bool be given).
    if not (type(box.xmin) is type(box.ymin) is type(box.xmax) is type(box.ymax) is float
            and math.isfinite(box.xmin + box.ymin + box.xmax + box.ymax)) and \
            not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in corners):
        return BOX_NOT_A_NUMBER, f"box {list(corners)} has a coordinate that is not a finite number"
    if box.xmax <= box.xmin or box.ymax <= box.ymin:
        return BOX_EMPTY, f"box x {box.xmin:g}..{box.xmax:g}, y {box.ymin:g}..{box.ymax:g} has no area"
    tolerance_x, tolerance_y = pixel
    if (box.xmin < -tolerance_x or box.ymin < -tolerance_y or box.xmax > frame[0] + tolerance_x
            or box.ymax > frame[1] + tolerance_y):
        if frame == (1.0, 1.0):  # normalized: the pixels too, of the image the fractions are of
            width, height = pixels
            size = (f"1x1 (normalized) image (pixels x {box.xmin * width:.1f}..{box.xmax * width:.1f}, "
                    f"y {box.ymin * height:.1f}..{box.ymax * height:.1f} of {width}x{height})")
        else:
            size = f"{frame[0]:g}x{frame[1]:g} image"
        return BOX_OUTSIDE, (f"box x {box.xmin:g}..{box.xmax:g}, y {box.ymin:g}..{box.ymax:g} reaches outside "
                             f"the {size} by more than a pixel")
    return None


def _in_pixels(mask: str, pixels: tuple[int, int]) -> str:
    """Normalized polygons (JSON ``[[x1, y1, x2, y2, ...], ...]``, fractions of the image: YOLO's segmentation
    lines) in the pixels of a ``(width, height)`` image, as COCO's are; anything else as it is (the check that
    follows names what is wrong with it)."""
    try:
        polygons = json.loads(mask)
        if not (isinstance(polygons, list) and all(isinstance(polygon, list) for polygon in polygons)):
            return mask
        return json.dumps([[value * pixels[index % 2] for index, value in enumerate(polygon)] for polygon in polygons])
    except (ValueError, TypeError, RecursionError):
        return mask


def _mask_problem(mask: str, frame: tuple[int, ...], max_pixels: int) -> Optional[str]:
    """Why an object's segmentation (JSON text) cannot be rasterized in its pixel ``frame``, or None."""
    if len(frame) != 2:
        return "the segmentation has no pixel frame (its annotation's coordinates are normalized)"
    try:
        segmentation = json.loads(mask)
    except (ValueError, RecursionError) as err:
        return f"the segmentation is not JSON: {err}"
    return masks.segmentation_problem(segmentation, (frame[0], frame[1]), max_pixels)


def unwritable(objects: Objects) -> tuple[tuple[str, str, str], ...]:
    """The rejected objects of ``objects`` (placed, :func:`place`) that have an extent: ``(name, reason, detail)``.

    One rule for every source: such an object (an unknown class, a box past the image's edge that cannot be
    clipped, a frame that is not the image's, a segmentation that cannot be rasterized) rejects its image, since
    the image written without it would teach a detector that the object is background; ``--keep-partial-images``
    writes the image without it instead. An object without an extent (:data:`NO_EXTENT`) only drops out.
    """
    return tuple(item for item in objects.rejected if item[1] not in NO_EXTENT)


def class_name_problem(name: str, where: str) -> Optional[str]:
    """Why ``name`` cannot be a class name (naming ``where`` and the name), or None: a control character or a
    line break, since a class name is one line of ``labels.txt`` and a quoted string of ``label_map.pbtxt``
    and such a character breaks both (a newline shifts every later id in labels.txt). Line breaks are those
    ``str.splitlines`` splits at (NEL, U+2028 and U+2029 too). A planner raises its ``InputError`` with it
    (this layer sits below :mod:`beam_jobs.planning`)."""
    bad = next((char for char in name if unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp")), None)
    if bad is None:
        return None
    return f"{where}: the class name {name!r} holds a control character ({bad!r}); rename the class in the annotations"
