"""Box geometry of the detection pipeline: where the output image comes from, and boxes moved with its pixels.

Data in: an image's stored size and its boxes as the records hold them
(normalized ``[ymin, xmin, ymax, xmax]`` of the stored image). Data out: the
window of the stored image to decode, the size it is resized to, and the boxes
in pixels of the output image, in any of KerasHub's box formats.

One rule serves training and evaluation, as Model Garden's detection parser
does (``resize_and_crop_image``): the image is scaled to fit the output size
keeping its aspect ratio, times a random ``scale`` in training; the part that
overshoots the output is cropped at a random offset (training) and the rest
is padded at the bottom and right. Evaluation is scale 1, offset 0: a resize
with padding, and ``boxes_to_source`` maps predictions back by one division.

The window is known from the JPEG header before any pixel is decoded, so the
pipeline decodes only the window (crop-before-decode) and, for a large
image, at a reduced libjpeg scale. Boxes are moved by the window and sizes
actually used (integers), so they fit the resized pixels exactly.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import tensorflow as tf

from reader.options import check_box_format, image_hw

PADDING = -1  # the value of the rows past an image's objects, in boxes and labels (KerasHub's convention)


class Placement(NamedTuple):
    """Where an output image comes from: ``window`` [y, x, h, w] of the stored image, resized to ``size`` [h, w]
    and padded at the bottom and right to the output size. All int32 tensors."""

    window: tf.Tensor
    size: tf.Tensor


def place(stored_hw: tf.Tensor, output_hw: tuple[int, int], scale: tf.Tensor, offset: tf.Tensor) -> Placement:
    """The window and resized size for an image of ``stored_hw`` scaled to fit ``output_hw`` times ``scale``.

    ``offset`` (two floats in [0, 1)) places the crop where the scaled image
    overshoots the output; at ``scale`` 1 nothing overshoots.
    """
    stored = tf.cast(stored_hw, tf.float32)
    output = tf.constant(output_hw, tf.float32)
    factor = tf.reduce_min(output / stored) * scale
    scaled = tf.maximum(tf.round(stored * factor), 1.0)
    crop = tf.minimum(scaled, output)  # the resized part that lands in the output
    start = tf.floor(offset * (scaled - crop))  # in scaled pixels
    first = tf.minimum(tf.floor(start / factor), stored - 1.0)
    last = tf.minimum(tf.math.ceil((start + crop) / factor), stored)
    window = tf.cast(tf.concat([first, last - first], 0), tf.int32)
    return Placement(window, tf.cast(crop, tf.int32))


def _per_box(params: tf.Tensor) -> tf.Tensor:
    """Per-image ``params`` [..., k] as [..., 1, k]: broadcast over an image's boxes [..., N, 4]."""
    return tf.expand_dims(tf.cast(params, tf.float32), -2)


def _factor(placement: Placement) -> tf.Tensor:
    """[..., 1, 4]: output pixels per stored pixel, per box coordinate (resized size / window size)."""
    window, size = _per_box(placement.window), _per_box(placement.size)
    return tf.tile(size / window[..., 2:], [1] * (len(window.shape) - 1) + [2])


def move(boxes: tf.Tensor, stored_hw: tf.Tensor, placement: Placement,
         min_visible: float) -> tuple[tf.Tensor, tf.Tensor]:
    """``(boxes in output pixels [..., N, 4] yxyx, keep [..., N] bool)`` for normalized ``boxes`` of the stored
    image; one image (``stored_hw`` [2], the placement's [4] and [2]) or a batch of them ([B, 2], ...).

    Boxes are moved as the window's pixels are: shifted by its corner, scaled
    by resized size / window size per axis, and clipped to the resized part
    (the flip is :func:`mirror`'s). ``keep`` is False for a box whose visible
    area is under ``min_visible`` of its whole area after scaling (mostly
    cropped away), or empty.
    """
    twice = [1] * (len(_per_box(stored_hw).shape) - 1) + [2]
    stored, corner = tf.tile(_per_box(stored_hw), twice), tf.tile(_per_box(placement.window)[..., :2], twice)
    moved = (boxes * stored - corner) * _factor(placement)
    clipped = tf.clip_by_value(moved, 0.0, tf.tile(_per_box(placement.size), twice))
    visible = _area(clipped)
    keep = tf.logical_and(visible > 0.0, visible >= min_visible * _area(moved))
    return clipped, keep


def mirror(boxes: tf.Tensor, placement: Placement, flip: tf.Tensor) -> tf.Tensor:
    """``boxes`` (output pixels, yxyx) mirrored within the resized image where ``flip``, as its pixels are."""
    width = _per_box(placement.size)[..., 1]
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
    mirrored = tf.stack([ymin, width - xmax, ymax, width - xmin], axis=-1)
    return tf.where(tf.reshape(flip, tf.concat([tf.shape(flip), [1, 1]], 0)), mirrored, boxes)


def to_stored(boxes: tf.Tensor, stored_hw: tf.Tensor, placement: Placement) -> tf.Tensor:
    """``boxes`` in output pixels (yxyx, before any flip) as normalized boxes of the stored image: the inverse
    of :func:`move` (without its clipping)."""
    twice = [1] * (len(_per_box(stored_hw).shape) - 1) + [2]
    stored, corner = tf.tile(_per_box(stored_hw), twice), tf.tile(_per_box(placement.window)[..., :2], twice)
    return (boxes / _factor(placement) + corner) / stored


def _area(boxes: tf.Tensor) -> tf.Tensor:
    return tf.maximum(boxes[..., 2] - boxes[..., 0], 0.0) * tf.maximum(boxes[..., 3] - boxes[..., 1], 0.0)


def to_format(boxes: tf.Tensor, bounding_box_format: str, output_hw: tuple[int, int]) -> tf.Tensor:
    """``boxes`` [..., 4] yxyx in output pixels as ``bounding_box_format`` (relative ones to ``output_hw``)."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
    relative = bounding_box_format.startswith("rel_")
    if relative:
        height, width = (float(v) for v in output_hw)
        ymin, ymax, xmin, xmax = ymin / height, ymax / height, xmin / width, xmax / width
    kind = bounding_box_format[4:] if relative else bounding_box_format
    parts = {
        "yxyx": (ymin, xmin, ymax, xmax),
        "xyxy": (xmin, ymin, xmax, ymax),
        "xywh": (xmin, ymin, xmax - xmin, ymax - ymin),
        "center_xywh": ((xmin + xmax) / 2, (ymin + ymax) / 2, xmax - xmin, ymax - ymin),
        "center_yxhw": ((ymin + ymax) / 2, (xmin + xmax) / 2, ymax - ymin, xmax - xmin),
    }[kind]
    return tf.stack(parts, axis=-1)


def from_format(boxes: tf.Tensor, bounding_box_format: str, output_hw: tuple[int, int]) -> tf.Tensor:
    """The inverse of :func:`to_format`: ``boxes`` as ``bounding_box_format`` -> yxyx in output pixels."""
    a, b, c, d = tf.unstack(tf.cast(boxes, tf.float32), axis=-1)
    relative = bounding_box_format.startswith("rel_")
    kind = bounding_box_format[4:] if relative else bounding_box_format
    ymin, xmin, ymax, xmax = {
        "yxyx": lambda: (a, b, c, d),
        "xyxy": lambda: (b, a, d, c),
        "xywh": lambda: (b, a, b + d, a + c),
        "center_xywh": lambda: (b - d / 2, a - c / 2, b + d / 2, a + c / 2),
        "center_yxhw": lambda: (a - c / 2, b - d / 2, a + c / 2, b + d / 2),
    }[kind]()
    if relative:
        height, width = (float(v) for v in output_hw)
        ymin, ymax, xmin, xmax = ymin * height, ymax * height, xmin * width, xmax * width
    return tf.stack([ymin, xmin, ymax, xmax], axis=-1)


def boxes_to_source(boxes, source_hw, image_size, bounding_box_format: str = "yxyx",
                    output_format: Optional[str] = None) -> tf.Tensor:
    """Boxes predicted on an evaluation image, on the source (stored) image, in ``output_format``.

    Args:
      boxes: ``[..., N, 4]`` in ``bounding_box_format`` on the output image of
        :func:`reader.build_dataset` with ``training=False`` (resized with
        padding at the bottom and right, aspect ratio kept).
      source_hw: ``[..., 2]`` the stored image's height and width (evaluation
        targets carry them as ``"source_size"`` with ``source_size=True``).
      image_size: the ``image_size`` the pipeline was built with.
      bounding_box_format: the format of ``boxes``.
      output_format: the format of the result, in pixels of the stored image (``rel_`` formats relative to its
        size); ``bounding_box_format`` when not given, so boxes come back as they went in (before #57 the
        result was always yxyx: a caller passing "xyxy" got yxyx back).
    """
    output_hw = image_hw(image_size)
    check_box_format(bounding_box_format)
    wanted = output_format or bounding_box_format
    check_box_format(wanted)
    yxyx = from_format(boxes, bounding_box_format, output_hw)
    source = tf.cast(source_hw, tf.float32)
    factor = tf.reduce_min(tf.constant(output_hw, tf.float32) / source, axis=-1)
    scaled = tf.maximum(tf.round(source * factor[..., None]), 1.0)
    tile = [1] * (len(scaled.shape) - 1) + [2]
    on_source = yxyx * tf.tile(source / scaled, tile)[..., None, :]  # the resize's own factor
    if wanted.startswith("rel_"):  # relative to each image's stored size
        return to_format(on_source / tf.tile(source, tile)[..., None, :], wanted[len("rel_"):], (1, 1))
    return to_format(on_source, wanted, (1, 1))
