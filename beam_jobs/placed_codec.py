"""Placed objects in the work files: a fixed-width binary layout instead of JSON, for the validation -> writer leg.

    validate: place() --Objects, placed--> encode_placed --ACCEPTED record's annotation--> decode_placed: write

The plan's annotations stay :func:`beam_jobs.annotations.encode`'s JSON (what LISTED records carry and what
``--update`` digests). Once validation has placed an image's objects, they travel to the shard writer in the
ACCEPTED record's annotation field, written once and read once per image: as JSON that was about a tenth of the
workers' CPU on COCO-sized photos (docs/benchmarks.md, #57 §6). This layout packs each box's numbers with
:mod:`struct` (little-endian, fixed width: a documented format that does not depend on the Python release that
wrote it, unlike ``marshal``, since a resumed run or another worker may run another one) and keeps JSON only for
the fields that are rare and free-form (rejected objects, class mask, assumed frame, captions).

Layout (little-endian)::

    tag       1 byte, 0x01 (JSON annotations start with ``[``: decode_placed reads both)
    head      upright u8, masks u8, mask_turn u8, orientation u8, keypoints u32, boxes u32, mask_frame's
              length u8 (0 or 2) and values u32 u32 (zeros for none), then the byte lengths (u32) of source_id,
              tail, names and masks
    source_id UTF-8
    tail      JSON [rejected, class_mask, assumed, captions], empty when all are empty
    names     the boxes' names, UTF-8, NUL between them
    masks     the boxes' masks (with --masks: COCO segmentation JSON), UTF-8, NUL between them
    boxes     per box: label i64, xmin ymin xmax ymax area f64, flags u8 (crowd 1, difficult 2, truncated 4),
              its keypoint values u32
    points    every box's keypoint values in turn, f64 (every third, the visibility, read back as an int)

Only placed objects (:func:`beam_jobs.annotations.place`: frame normalized, corners and area floats, keypoints'
visibilities ints) are packed; anything else, and several labels (:class:`beam_jobs.annotations.Labels`), is
written as JSON, so the layout never narrows a value. Decoded values equal the placed ones (the flags as bools).
"""

from __future__ import annotations

import json
import struct

from beam_jobs.annotations import NORMALIZED, Annotation, Box, Objects, decode, encode

TAG = b"\x01"
_HEAD = struct.Struct("<BBBBIIBIIIIII")
_BOX = struct.Struct("<q5dBI")
_TEXT = "surrogatepass"  # a name from a file's path may hold a lone surrogate, as paths in the work files do
_new_tuple = tuple.__new__  # a Box from its values without NamedTuple's keyword-handling __new__: half the cost
_SEPARATOR = "\0"  # between the boxes' names, and their masks: neither a path nor JSON holds a NUL


def encode_placed(annotation: Annotation) -> bytes:
    """The bytes an ACCEPTED record carries for ``annotation``: the packed layout for placed objects, else JSON."""
    if not isinstance(annotation, Objects) or annotation.frame != NORMALIZED or len(annotation.mask_frame) not in (0, 2):
        return encode(annotation)
    objects, boxes = annotation, annotation.boxes
    mask_frame = objects.mask_frame or (0, 0)  # a pixel-framed source's, set whether or not there are masks
    rare = (objects.rejected, objects.class_mask, objects.assumed, objects.captions)
    tail = json.dumps(rare, separators=(",", ":"), ensure_ascii=False).encode("utf-8", _TEXT) if any(rare) else b""
    source_id = objects.source_id.encode("utf-8", _TEXT)
    names, masks = _SEPARATOR.join(box.name for box in boxes), _SEPARATOR.join(box.mask for box in boxes)
    if names.count(_SEPARATOR) + masks.count(_SEPARATOR) != 2 * max(len(boxes) - 1, 0):
        return encode(annotation)  # a name or mask holding a NUL (JSON escapes it)
    names, masks = names.encode("utf-8", _TEXT), masks.encode("utf-8", _TEXT)
    points = [value for box in boxes for value in box.keypoints]
    head = _HEAD.pack(objects.upright, objects.masks, objects.mask_turn, objects.orientation, objects.keypoints,
                      len(boxes), len(objects.mask_frame), *mask_frame, len(source_id), len(tail), len(names),
                      len(masks))
    fixed = [_BOX.pack(box.label, box.xmin, box.ymin, box.xmax, box.ymax, box.area,
                       bool(box.crowd) | bool(box.difficult) << 1 | bool(box.truncated) << 2, len(box.keypoints))
             for box in boxes]
    return b"".join((TAG, head, source_id, tail, names, masks, *fixed,
                     struct.pack(f"<{len(points)}d", *points) if points else b""))


def decode_placed(data: bytes) -> Annotation:
    """Inverse of :func:`encode_placed` (JSON too: what it writes for anything but placed objects)."""
    if data[:1] != TAG:
        return decode(data)
    upright, with_masks, mask_turn, orientation, keypoints, count, frame_length, frame_width, frame_height, \
        id_length, tail_length, names_length, masks_length = _HEAD.unpack_from(data, 1)
    at = 1 + _HEAD.size
    source_id = data[at:at + id_length].decode("utf-8", _TEXT)
    at += id_length
    rejected, class_mask, assumed, captions = json.loads(data[at:at + tail_length]) if tail_length else ((), (), "", ())
    at += tail_length
    names = data[at:at + names_length].decode("utf-8", _TEXT).split(_SEPARATOR) if count else []
    at += names_length
    masks = data[at:at + masks_length].decode("utf-8", _TEXT).split(_SEPARATOR) if masks_length else [""] * count
    at += masks_length
    end = at + count * _BOX.size
    fixed = _BOX.iter_unpack(data[at:end])
    if end == len(data):  # no keypoints
        boxes = tuple(_new_tuple(Box, (name, label, xmin, ymin, xmax, ymax, area, bool(flags & 1), bool(flags & 2),
                                       bool(flags & 4), mask, ()))
                      for name, mask, (label, xmin, ymin, xmax, ymax, area, flags, _) in zip(names, masks, fixed))
    else:
        boxes, at = _with_points(names, masks, list(fixed), data, end)
        if at != len(data):
            raise ValueError(f"a placed annotation of {len(data)} bytes ends at byte {at}: not this layout")
    return Objects(source_id, boxes, NORMALIZED, bool(upright), tuple(tuple(item) for item in rejected),
                   bool(with_masks), (frame_width, frame_height) if frame_length else (), mask_turn, tuple(class_mask), orientation, assumed,
                   tuple(captions), keypoints)


def _with_points(names: list, masks: list, fixed: list, data: bytes, at: int) -> tuple[tuple[Box, ...], int]:
    """The boxes, each with its keypoints (``x, y`` floats, the visibility an int, as place() leaves them), and
    where the keypoints end."""
    boxes = []
    for name, mask, (label, xmin, ymin, xmax, ymax, area, flags, point_count) in zip(names, masks, fixed):
        values = list(struct.unpack_from(f"<{point_count}d", data, at))
        at += 8 * point_count
        values[2::3] = [int(value) for value in values[2::3]]
        boxes.append(Box(name, label, xmin, ymin, xmax, ymax, area, bool(flags & 1), bool(flags & 2),
                         bool(flags & 4), mask, tuple(values)))
    return tuple(boxes), at
