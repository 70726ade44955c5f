"""What a record becomes in a batch, for each task a dataset's manifest names.

Data in: serialized records (parsed 64 at a time) and each example's seed.
Data out: ``(image, target)`` examples and the batching that stacks them (an
object example's target is its objects as the records hold them, with where
its image came from; its batch turns them into the targets below):

- classification: ``(images, labels)``, labels int64 ``[B]``;
- objects: ``(images, {"boxes": float32 [B, N, 4], "labels": int32 [B, N]})``,
  the dict KerasHub's detectors take, rows past an image's objects -1 (and on
  request ``"masks"``, ``"class_mask"``, ``"source_size"``: :class:`ObjectTargets`);
- multilabel: ``(images, float32 [B, num_classes])`` multi-hot, for a sigmoid head;
- segmentation: ``(images, int32 [B, H, W, 1])`` class ids, 255 where padded.

The pipelines (``pipeline.py``, ``buffered.py``) read records in their order
and call a :class:`Task`; they do not know what a record holds. Images are
normalised (``finish``) before a detection or segmentation image is padded, so
padding is 0 in the model's input, as Model Garden pads.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

import record_schema
from reader import boxes as box_ops
from reader import keypoints as points
from reader import object_targets
from reader import preprocess
from reader.records import AUTOTUNE, feature_spec
from reader.options import Augmentation, BoxAugmentation, FeatureKeys, ObjectTargets, as_options

# Class id of padded and void mask pixels (VOC's void outline is 255 in its own PNGs).
IGNORE_LABEL = 255
# Records per parse_example call in both pipelines (measured in reader/pipeline.py's docstring).
PARSE_BATCH = 64


class Task(NamedTuple):
    """The per-task functions a pipeline calls.

    ``parse(records [B]) -> dict``: batched tensors by feature key, unbatched
    by the pipeline. ``train(parsed, seed) -> (image, target)`` and
    ``eval(parsed) -> (image, target)``: one example, already finished
    (dtype, normalisation). ``batch(dataset, size, drop_remainder)``.
    """

    parse: Callable
    train: Callable
    eval: Callable
    batch: Callable


@dataclasses.dataclass(frozen=True)
class ImageChoices:
    """How images are made, for every task: output size, augmentation, decode choices, dtype and normalisation."""

    size: tuple[int, int]
    augment: object
    decode: dict
    dtype: tf.DType
    normalization: Optional[str]
    crop_fraction: float

    def finish(self, image: tf.Tensor) -> tf.Tensor:
        return preprocess.finish(image, self.dtype, self.normalization)


def plain_batch(dataset: tf.data.Dataset, size: int, drop_remainder: bool) -> tf.data.Dataset:
    return dataset.batch(size, drop_remainder=drop_remainder)


def parsed(dataset: tf.data.Dataset, task: Task, per_call: int) -> tf.data.Dataset:
    """Elements ``record`` or ``(record, key)`` -> ``parsed`` or ``(parsed, key)``, the task's features by key.

    ``per_call`` records are parsed by one ``parse_example`` call and unbatched
    again (0: one call per record, which ``bench/reader_stages.py`` compares).
    """
    def parse(*element) -> object:
        return (task.parse(element[0]), *element[1:]) if len(element) > 1 else task.parse(element[0])

    if per_call > 0:
        return dataset.batch(per_call).map(parse, num_parallel_calls=AUTOTUNE).unbatch()
    return dataset.map(lambda *element: tf.nest.map_structure(lambda part: part[0], parse(*(e[None] for e in element))),
                       num_parallel_calls=AUTOTUNE)


def _parser(spec: dict) -> Callable[[tf.Tensor], dict]:
    return lambda records: tf.io.parse_example(records, spec)


def classification(keys: FeatureKeys, label_offset: int, images: ImageChoices) -> Task:
    """One class an image (the converter's classification records, or foreign shards by ``keys``)."""
    spec = feature_spec(keys)  # the public parse_records' spec: one definition of what a classification record holds

    def train(parsed: dict, seed: tf.Tensor) -> tuple:
        image = preprocess.train_image(parsed[keys.image], seed, images.size, images.augment, **images.decode)
        return images.finish(image), parsed[keys.label] + label_offset

    def evaluate(parsed: dict) -> tuple:
        image = preprocess.eval_image(parsed[keys.image], images.size, images.crop_fraction, **images.decode)
        return images.finish(image), parsed[keys.label] + label_offset

    return Task(_parser(spec), train, evaluate, plain_batch)


def multilabel(num_classes: int, images: ImageChoices) -> Task:
    """Several classes an image: the classification preset's image, a multi-hot float32 ``[num_classes]``."""
    spec = {record_schema.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string),
            record_schema.LABEL: tf.io.RaggedFeature(tf.int64)}

    def multi_hot(ids: tf.Tensor) -> tf.Tensor:
        return tf.minimum(tf.reduce_sum(tf.one_hot(ids, num_classes, dtype=tf.float32), axis=0), 1.0)

    def train(parsed: dict, seed: tf.Tensor) -> tuple:
        image = preprocess.train_image(parsed[record_schema.IMAGE_ENCODED], seed, images.size, images.augment,
                                       **images.decode)
        return images.finish(image), multi_hot(parsed[record_schema.LABEL])

    def evaluate(parsed: dict) -> tuple:
        image = preprocess.eval_image(parsed[record_schema.IMAGE_ENCODED], images.size, images.crop_fraction,
                                      **images.decode)
        return images.finish(image), multi_hot(parsed[record_schema.LABEL])

    return Task(_parser(spec), train, evaluate, plain_batch)


_IMAGE_SPEC = {
    record_schema.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string),
    record_schema.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
    record_schema.WIDTH: tf.io.FixedLenFeature([], tf.int64),
}
_OBJECT_SPEC = {
    **_IMAGE_SPEC,
    **{key: tf.io.RaggedFeature(tf.float32) for key in (record_schema.BBOX_YMIN, record_schema.BBOX_XMIN,
                                                         record_schema.BBOX_YMAX, record_schema.BBOX_XMAX)},
    **{key: tf.io.RaggedFeature(tf.int64) for key in (record_schema.OBJECT_LABEL, record_schema.OBJECT_IS_CROWD,
                                                       record_schema.OBJECT_DIFFICULT)},
}
# An example's objects travel as one float32 row an object, stacked when 64 records are parsed: the box as the
# records hold it, then the class id (exact in float32 below 2**24), is_crowd and difficult. One ragged component
# through unbatch, the map and the batch, where there were seven (and four more made per example).
OBJECTS_KEY = "objects"  # the parsed features' key of those rows (public: a mixture remaps their class ids)
OBJECT_CLASS_COLUMN = 4  # the class id's column in a row
_OBJECTS = OBJECTS_KEY
_OBJECT_COLUMNS = (record_schema.BBOX_YMIN, record_schema.BBOX_XMIN, record_schema.BBOX_YMAX, record_schema.BBOX_XMAX,
                   record_schema.OBJECT_LABEL, record_schema.OBJECT_IS_CROWD, record_schema.OBJECT_DIFFICULT)
_CLASS_MASK_SPEC = {record_schema.SEGMENTATION_ENCODED: tf.io.FixedLenFeature([], tf.string)}
_INSTANCE_MASK_SPEC = {record_schema.OBJECT_MASK: tf.io.RaggedFeature(tf.string)}


class _Geometry(NamedTuple):
    """One example's draw: the scale jitter, the crop offset and the flip (fixed in evaluation)."""

    scale: tf.Tensor
    offset: tf.Tensor
    flip: tf.Tensor


def _eval_geometry() -> _Geometry:
    return _Geometry(tf.constant(1.0), tf.zeros([2]), tf.constant(False))


def _draw(seed: tf.Tensor, augment: BoxAugmentation) -> _Geometry:
    scale_seed, offset_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=3))
    low, high = augment.scale_range
    scale = tf.random.stateless_uniform([], scale_seed, low, high)
    offset = tf.random.stateless_uniform([2], offset_seed)
    flip = tf.random.stateless_uniform([], flip_seed) < 0.5 if augment.flip else tf.constant(False)
    return _Geometry(scale, offset, flip)


_STORED_HW = "stored_hw"  # the parsed features' key of the stored image's int32 [height, width]


def _with_stored_hw(parsed: dict) -> dict:
    """Parsed features ``[B]`` with the stored height and width (two int64 features) as one int32 ``[B, 2]``:
    made once per parse call, not per example (one component, no stack or casts in the example's map)."""
    sides = (record_schema.HEIGHT, record_schema.WIDTH)
    stored_hw = tf.cast(tf.stack([parsed[side] for side in sides], axis=1), tf.int32)
    return {**{key: value for key, value in parsed.items() if key not in sides}, _STORED_HW: stored_hw}


def _stored_hw(parsed: dict) -> tf.Tensor:
    """One example's stored int32 [height, width] (:func:`_with_stored_hw`)."""
    return parsed[_STORED_HW]


def _placed_image(parsed: dict, geometry: _Geometry, images: ImageChoices):
    """The image's window decoded, resized, flipped and finished (not yet padded); and its placement."""
    placement = box_ops.place(_stored_hw(parsed), images.size, geometry.scale, geometry.offset)
    scale_to = placement.size if images.decode["scaled_decode"] else None
    image = preprocess.crop_and_decode(parsed[record_schema.IMAGE_ENCODED], lambda shape: placement.window,
                                       images.decode["all_jpeg"], scale_to)
    image = tf.image.resize(image, placement.size, method="bilinear")
    return images.finish(_flipped(image, geometry.flip)), placement


def _flipped(image: tf.Tensor, flip: tf.Tensor, axis: int = 1) -> tf.Tensor:
    """``image`` reversed along ``axis`` (its width) where ``flip``; no conditional at all where ``flip`` is
    known False (evaluation, ``BoxAugmentation(flip=False)``)."""
    known = tf.get_static_value(flip)
    if known is not None and not known:
        return image
    return tf.cond(flip, lambda: tf.reverse(image, [axis]), lambda: image)


def _placed_class_mask(png: tf.Tensor, placement: box_ops.Placement, geometry: _Geometry,
                       size: tuple[int, int]) -> tf.Tensor:
    """A class-id PNG of the stored image, through the image's window, resize (nearest) and flip; 255 padding."""
    y, x, height, width = tf.unstack(placement.window)
    mask = tf.io.decode_png(png, channels=1)[y:y + height, x:x + width]
    mask = tf.image.resize(mask, placement.size, method="nearest")
    return _pad(tf.cast(_flipped(mask, geometry.flip), tf.int32), size, IGNORE_LABEL)


def _instance_masks(pngs: tf.Tensor, boxes: tf.Tensor, stored_hw: tf.Tensor, placement: box_ops.Placement,
                    flip: tf.Tensor, mask_size: int) -> tf.Tensor:
    """float32 ``[N, M, M]``: each object's mask (a PNG of the stored image) cropped to its box and resized.

    ``boxes`` are the objects' boxes in output pixels before the flip; each is
    taken back to the stored image (:func:`reader.boxes.to_stored`), where the
    mask is cropped at full resolution, as Model Garden's Mask R-CNN parser
    crops its masks to the boxes (``crop_and_resize``).
    """
    def crops() -> tf.Tensor:
        masks = tf.map_fn(lambda png: tf.io.decode_png(png, channels=1), pngs,
                          fn_output_signature=tf.TensorSpec([None, None, 1], tf.uint8))
        cropped = tf.image.crop_and_resize(tf.cast(masks, tf.float32), box_ops.to_stored(boxes, stored_hw, placement),
                                           tf.range(tf.shape(pngs)[0]), [mask_size, mask_size])[..., 0]
        return _flipped(cropped, flip, axis=2)

    # map_fn cannot stack no masks of unknown size: an image without objects gets an empty stack itself
    return tf.cond(tf.size(pngs) > 0, crops, lambda: tf.zeros([0, mask_size, mask_size]))


def _pad(image: tf.Tensor, size: tuple[int, int], value=0) -> tf.Tensor:
    """``image`` padded at the bottom and right to ``size`` (the top-left corner is the source's)."""
    shape = tf.shape(image)
    padded = tf.pad(image, [[0, size[0] - shape[0]], [0, size[1] - shape[1]], [0, 0]], constant_values=value)
    return tf.ensure_shape(padded, [size[0], size[1], image.shape[-1]])


def objects(targets: ObjectTargets, images: ImageChoices, classes: Sequence[str] = ()) -> Task:
    """Boxes and their classes, moved with the pixels; the batch padded to its largest count (or ``max_objects``).

    With ``targets.mask_size``, each object's instance mask cropped to its box
    (``"masks"``); with ``targets.class_mask``, the image's class mask (``"class_mask"``).

    Each example carries its objects as the records hold them and where its
    image came from (window, size, flip); the boxes are moved, filtered and
    formatted once per batch (:func:`reader.object_targets.batch_targets`). Done per example, those
    forty small operations cost about 15% of a 300-500 px photo's decode.
    """
    spec = {**_OBJECT_SPEC, **(_INSTANCE_MASK_SPEC if targets.mask_size else {}),
            **(_CLASS_MASK_SPEC if targets.class_mask else {}), **(points.SPEC if targets.keypoints else {})}
    # contiguous_ids: record id -> its index among the named classes (-1 for an id without a name)
    named = np.cumsum([bool(name) for name in classes]) - 1
    contiguous = tf.constant(np.where([bool(name) for name in classes], named, -1) if len(classes) else [-1],
                             tf.int32) if targets.contiguous_ids else None

    def parse(records: tf.Tensor) -> dict:
        parsed = tf.io.parse_example(records, spec)
        columns = [parsed.pop(key) for key in _OBJECT_COLUMNS[:4]]
        columns += [tf.cast(parsed.pop(key), tf.float32) for key in _OBJECT_COLUMNS[4:]]
        parsed[_OBJECTS] = tf.stack(columns, axis=2)  # ragged [B, None, 7]: one component, not seven
        if targets.keypoints:
            parsed[points.KEY] = points.stacked(parsed)
        return _with_stored_hw(parsed)

    def example(parsed: dict, geometry: _Geometry) -> tuple:
        image, placement = _placed_image(parsed, geometry, images)
        hw = _stored_hw(parsed)
        rows = parsed[_OBJECTS]
        where = tf.concat([hw, placement.window, placement.size, tf.cast(geometry.flip, tf.int32)[None]], 0)
        raw = {"objects": _one_row(rows), "where": where}
        if targets.mask_size:
            moved, _ = box_ops.move(rows[:, :4], hw, placement, 0.0)
            raw["masks"] = _one_row(_instance_masks(parsed[record_schema.OBJECT_MASK], moved, hw, placement,
                                                    geometry.flip, targets.mask_size))
        if targets.keypoints:
            raw[points.KEY] = _one_row(points.per_object(parsed[points.KEY], targets.keypoints, rows))
        if targets.class_mask:
            raw["class_mask"] = _placed_class_mask(parsed[record_schema.SEGMENTATION_ENCODED], placement, geometry,
                                                   images.size)
        return _pad(image, images.size), raw

    def batch(dataset: tf.data.Dataset, size: int, drop_remainder: bool) -> tf.data.Dataset:
        # Each example's objects are already one ragged row (_one_row, made in the parallel map), so a plain
        # batch stacks them and tf.data fuses it with the map, as for classification. ragged_batch made them
        # ragged in a map of its own, one example at a time: 0.1 ms an image, and the fusion lost.
        return dataset.batch(size, drop_remainder=drop_remainder).map(
            lambda batch_images, raw: (batch_images, object_targets.batch_targets(
                raw, targets, images.size, images.augment.min_visible, contiguous)),
            num_parallel_calls=AUTOTUNE)

    def train(parsed: dict, seed: tf.Tensor) -> tuple:
        if targets.keypoints and images.augment.flip and targets.keypoint_flip is None:
            raise ValueError(f"ObjectTargets with {targets.keypoints} keypoints an object and flips needs "
                             f"keypoint_flip: the order of the {targets.keypoints} points after a mirror (entry i: the point that "
                             "becomes point i, e.g. (0, 2, 1) swaps points 1 and 2). reader.COCO_KEYPOINT_FLIP is "
                             "COCO's 17 person keypoints' only; a dataset's own, from its points' names, is "
                             "reader.dataset_info(DATA).keypoint_flip (None when no name says left or right); "
                             "or BoxAugmentation(flip=False)")
        return example(parsed, _draw(seed, images.augment))

    return Task(parse, train, lambda parsed: example(parsed, _eval_geometry()), batch)


def _one_row(values: tf.Tensor) -> tf.RaggedTensor:
    """``values`` [N, ...] as a ragged ``[1, (N), ...]``; a batch of B stacks to ``[B, (1), (N), ...]``, whose
    ``.values`` is the batch's ragged ``[B, (N), ...]``."""
    return tf.RaggedTensor.from_row_lengths(values, tf.shape(values, out_type=tf.int64)[:1], validate=False)


def segmentation(images: ImageChoices) -> Task:
    """A class id a pixel: the mask cropped, resized (nearest) and flipped with the image; padding 255."""
    spec = {**_IMAGE_SPEC, **_CLASS_MASK_SPEC}

    def example(parsed: dict, geometry: _Geometry) -> tuple:
        image, placement = _placed_image(parsed, geometry, images)
        mask = _placed_class_mask(parsed[record_schema.SEGMENTATION_ENCODED], placement, geometry, images.size)
        return _pad(image, images.size), mask

    return Task(lambda records: _with_stored_hw(tf.io.parse_example(records, spec)), lambda parsed, seed: example(parsed, _draw(seed, images.augment)),
                lambda parsed: example(parsed, _eval_geometry()), plain_batch)


def for_dataset(task: str, classes: Sequence[str], keys: FeatureKeys, label_offset: int, targets: ObjectTargets,
                images: ImageChoices) -> Task:
    """The :class:`Task` for a manifest's ``task`` (``classes``: the manifest's, by record id)."""
    if task == record_schema.TASK_OBJECTS:
        return objects(targets, images, classes)
    if task == record_schema.TASK_SEGMENTATION:
        return segmentation(images)
    if task == record_schema.TASK_MULTILABEL:
        return multilabel(len(classes), images)
    return classification(keys, label_offset, images)


def default_augment(task: str, augment: Optional[object]) -> object:
    """``augment`` checked against ``task`` (``None``: the task's default)."""
    boxes = task in (record_schema.TASK_OBJECTS, record_schema.TASK_SEGMENTATION)
    kind = BoxAugmentation if boxes else Augmentation
    if augment is None:
        return kind()
    if isinstance(augment, (Augmentation, BoxAugmentation)) and not isinstance(augment, kind):
        raise ValueError(f"augment={augment!r} is for {'classification' if boxes else 'detection'}; this dataset's "
                         f"task is {task!r}: pass a reader.{kind.__name__}")
    return as_options(augment, kind, "augment")
