"""Objects' keypoints in a detection batch's targets (``ObjectTargets(keypoints=K)``), moved as the boxes are.

Data in:  the records' ``image/object/keypoint/x``, ``/y`` (normalized to the stored image) and ``/visibility``,
          K points an object (the TF Object Detection API's layout, which the converter writes from COCO's
          ``person_keypoints_*.json``), parsed 64 records at a time; each example's placement and flip.
Data out: float32 ``[B, N, K, 3]``: each object's points as ``x, y`` in the output image's pixels (fractions of it
          for the ``rel_`` box formats) and their visibility (COCO's 0, 1, 2); a point unlabelled or moved out of
          the image is ``0, 0, 0``, rows past an image's objects 0.

A horizontal flip mirrors ``x`` and, given ``ObjectTargets(keypoint_flip=...)``, swaps the points it pairs (a
person's left eye becomes the right eye's point, as the OD API's ``keypoint_flip_permutation`` does;
:data:`COCO_FLIP` for COCO's 17 only; a dataset's own, from its points' names, is
``DatasetInfo.keypoint_flip``): without it, flipped left points would still be called left.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

import record_schema
from reader.boxes import Placement

KEY = "keypoints"  # the parsed features' key of the stacked points, and the targets' key
SPEC = {record_schema.KEYPOINT_X: tf.io.RaggedFeature(tf.float32),
        record_schema.KEYPOINT_Y: tf.io.RaggedFeature(tf.float32),
        record_schema.KEYPOINT_VISIBILITY: tf.io.RaggedFeature(tf.int64)}
# COCO's person keypoints (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles): each left its right.
COCO_FLIP = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)


def stacked(parsed: dict) -> tf.RaggedTensor:
    """The parsed keypoint features (removed from ``parsed``) as one ragged ``[B, (N * K), 3]``: x, y, visibility."""
    x, y = parsed.pop(record_schema.KEYPOINT_X), parsed.pop(record_schema.KEYPOINT_Y)
    visibility = tf.cast(parsed.pop(record_schema.KEYPOINT_VISIBILITY), tf.float32)
    return tf.stack([x, y, visibility], axis=2)


def per_object(points: tf.Tensor, count: int, objects: tf.Tensor) -> tf.Tensor:
    """One example's ``[N * K, 3]`` points as ``[N, K, 3]``; a record that does not hold K points for each of its
    ``objects`` rows fails: one with objects and no keypoints at all is named as such (its set had no keypoints
    when converted), any other naming the count asked for."""
    held, rows = tf.shape(points)[0], tf.shape(objects)[0]
    some = tf.debugging.assert_equal(tf.logical_or(held > 0, tf.equal(rows, 0)), True, message=(
        "a record has objects but no keypoints: it was converted without keypoints for its set (a COCO set "
        "without its person_keypoints_<set>.json); convert again with this converter, which writes unlabelled "
        "points there, or read without ObjectTargets(keypoints=...)"))
    with tf.control_dependencies([some]):
        checked = tf.debugging.assert_equal(held, rows * count, message=(
            f"a record's keypoints are not {count} for each object: ObjectTargets(keypoints=...) must be the "
            "records' count of points an object (reader.dataset_info(DATA).keypoint_names; COCO's person "
            "keypoints: 17)"))
    with tf.control_dependencies([checked]):
        return tf.reshape(points, [-1, count, 3])


def move(points: tf.Tensor, stored_hw: tf.Tensor, placement: Placement, flip: tf.Tensor,
         permutation: Optional[Sequence[int]], relative: bool) -> tf.Tensor:
    """A batch's points ``[B, N, K, 3]`` (normalized to the stored images) in the output images (see the module's
    docstring); ``stored_hw`` [B, 2], the placement's window [B, 4] and size [B, 2], ``flip`` [B] bool."""
    def per_image(values: tf.Tensor) -> tf.Tensor:
        return tf.cast(values, tf.float32)[:, None, None]

    x, y, visibility = tf.unstack(points, axis=-1)
    height, width = per_image(placement.size[:, 0]), per_image(placement.size[:, 1])
    top, left = per_image(placement.window[:, 0]), per_image(placement.window[:, 1])
    y = (y * per_image(stored_hw[:, 0]) - top) * height / per_image(placement.window[:, 2])
    x = (x * per_image(stored_hw[:, 1]) - left) * width / per_image(placement.window[:, 3])
    inside = (visibility > 0) & (x >= 0) & (x <= width) & (y >= 0) & (y <= height)
    flipped = per_image(flip) > 0
    x = tf.where(flipped, width - x, x)
    if relative:
        x, y = x / width, y / height
    moved = tf.where(inside[..., None], tf.stack([x, y, visibility], -1), 0.0)
    if permutation is None:
        return moved
    return tf.where(flipped[..., None], tf.gather(moved, list(permutation), axis=2), moved)
