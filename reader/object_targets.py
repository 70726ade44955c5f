"""A detection batch's targets from its objects as the records hold them: moved, filtered, formatted, dense rows.

Data in:  a batch of object examples (:func:`reader.tasks.objects`): each image's objects as one ragged row
          ``[B, (N), 7]`` (ymin, xmin, ymax, xmax normalized to the stored image, class id, crowd, difficult),
          where each image came from (``[B, 9]``: stored height and width, window, resized size, flip), and the
          requested extras (instance masks, keypoints, class mask).
Data out: the targets :class:`reader.options.ObjectTargets` asks for: ``boxes`` [B, N, 4] in its format,
          ``labels`` [B, N] (-1 past an image's objects), and ``masks``, ``keypoints``, ``class_mask``,
          ``source_size`` on request; an image's kept rows first, padded to the batch's largest count or
          ``max_objects``.

Done once a batch, not an example: those forty small operations per example cost about 15% of a 300-500 px
photo's decode (see :func:`reader.tasks.objects`).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from reader import boxes as box_ops
from reader import keypoints as points
from reader.options import ObjectTargets


def batch_targets(raw: dict, targets: ObjectTargets, size: tuple[int, int], min_visible: float,
                  contiguous: Optional[tf.Tensor] = None) -> dict:
    """A batch's objects as the records hold them -> its targets: moved, filtered, formatted, dense rows.

    ``size``: the output images' (height, width); ``min_visible``: the fraction of a box that must stay in the
    image (``BoxAugmentation.min_visible``); ``contiguous``: record id -> contiguous 0-based id
    (``ObjectTargets.contiguous_ids``), or None."""
    objects = raw["objects"].values  # ragged [B, (N), 7]: reader.tasks' object columns (box, class, crowd, difficult)
    table = objects.to_tensor(0.0)
    present = tf.sequence_mask(objects.row_lengths(), tf.shape(table)[1])
    ids = tf.cast(table[..., 4], tf.int32)
    if contiguous is not None:
        ids = tf.gather(contiguous, tf.clip_by_value(ids, 0, tf.size(contiguous) - 1))
    labels = tf.where(present, ids, box_ops.PADDING)
    keep = tf.logical_and(present, labels >= 0)
    where = raw["where"]  # [B, 9]: stored height and width, window [4], resized size [2], flip
    hw = where[:, 0:2]
    placement = box_ops.Placement(where[:, 2:6], where[:, 6:8])
    moved, visible = box_ops.move(table[..., :4], hw, placement, min_visible)
    keep = tf.logical_and(keep, visible)
    if not targets.keep_crowd:
        keep = tf.logical_and(keep, tf.equal(table[..., 5], 0.0))
    if not targets.keep_difficult:
        keep = tf.logical_and(keep, tf.equal(table[..., 6], 0.0))
    placed = box_ops.mirror(moved, placement, where[:, 8] > 0)
    rows = {"boxes": box_ops.to_format(placed, targets.bounding_box_format, size), "labels": labels}
    if targets.mask_size:
        rows["masks"] = raw["masks"].values.to_tensor(0.0)
    if targets.keypoints:
        rows[points.KEY] = points.move(raw[points.KEY].values.to_tensor(0.0), hw, placement, where[:, 8] > 0,
                                       targets.keypoint_flip, targets.bounding_box_format.startswith("rel_"))
    found = kept_rows(rows, keep, targets.max_objects)
    if targets.source_size:
        found["source_size"] = hw
    if targets.class_mask:
        found["class_mask"] = raw["class_mask"]
    return found


def kept_rows(rows: dict, keep: tf.Tensor, fixed: Optional[int]) -> dict:
    """Each image's kept rows first, in record order; then padding (-1, masks 0) up to the batch's largest
    kept count, or cut or padded to ``fixed`` rows (a static shape for XLA and TPUs)."""
    order = tf.argsort(tf.cast(tf.logical_not(keep), tf.int32), axis=1, stable=True)
    kept = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    count = tf.constant(fixed) if fixed is not None else tf.reduce_max(tf.concat([kept, [0]], 0))
    valid = tf.sequence_mask(tf.minimum(kept, count), count)
    found = {}
    for name, value in rows.items():
        value = tf.gather(value, order, batch_dims=1)[:, :count]
        value = tf.pad(value, [[0, 0], [0, count - tf.shape(value)[1]]] + [[0, 0]] * (len(value.shape) - 2))
        shown = tf.reshape(valid, tf.concat([tf.shape(valid), tf.ones([len(value.shape) - 2], tf.int32)], 0))
        value = tf.where(shown, value, _padding(name, value.dtype))
        found[name] = value if fixed is None else tf.ensure_shape(value, [None, fixed, *value.shape[2:]])
    return found


def _padding(name: str, dtype: tf.DType) -> tf.Tensor:
    """What fills a target's rows past an image's objects: -1 (KerasHub's convention), 0 for masks."""
    return tf.constant(0 if name in ("masks", points.KEY) else box_ops.PADDING, dtype)
