"""Options of the read pipeline that are more than a plain number, as frozen, validated dataclasses."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

import record_schema

# Per-channel statistics of ImageNet on the 0..255 scale (as in TF Model Garden).
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
NORMALIZATIONS = (None, "mobilenet", "imagenet")
DTYPES = (tf.float32, tf.bfloat16, tf.float16, tf.uint8)


@dataclasses.dataclass(frozen=True)
class FeatureKeys:
    """Which features hold the image and the label, for shards written by other tools.

    Defaults are ours (the tensorflow/models keys); TFDS writes ``image`` and ``label``.
    """

    image: str = record_schema.IMAGE_ENCODED
    label: str = record_schema.LABEL

    @classmethod
    def tfds(cls) -> "FeatureKeys":
        return cls(image="image", label="label")


@dataclasses.dataclass(frozen=True)
class ForeignShards:
    """What only shards written by other tools need, in one place (as :class:`ReadOptions` holds the tuning).

    Attributes:
      keys: the features holding the image and the label (TFDS: ``FeatureKeys.tfds()``).
      label_offset: added to every label (1-based Inception labels: -1).
    """

    keys: FeatureKeys = FeatureKeys()
    label_offset: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", as_options(self.keys, FeatureKeys, "ForeignShards.keys"))
        offset = as_int(self.label_offset)
        if offset is None:
            raise ValueError(f"ForeignShards(label_offset=...) must be an integer, got {self.label_offset!r}")
        object.__setattr__(self, "label_offset", offset)


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """The training preset's random-resized-crop and flip.

    Attributes:
      area_range: fraction of the image area a crop covers (Inception-style).
      aspect_ratio_range: crop width / height.
      max_attempts: tries to sample a crop inside the ranges before using the whole image.
      flip: random horizontal flip.
    """

    area_range: tuple[float, float] = (0.08, 1.0)
    aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    max_attempts: int = 10
    flip: bool = True

    def __post_init__(self) -> None:
        low, high = self.area_range
        if not 0 < low <= high <= 1:
            raise ValueError(f"area_range must satisfy 0 < low <= high <= 1, got {self.area_range!r}")
        low, high = self.aspect_ratio_range
        if not 0 < low <= high:
            raise ValueError(f"aspect_ratio_range must satisfy 0 < low <= high, got {self.aspect_ratio_range!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")


# KerasHub's (keras.utils.bounding_boxes) box format names; "rel_" formats are fractions of the output image.
BOX_FORMATS = ("yxyx", "xyxy", "xywh", "center_xywh", "center_yxhw",
               "rel_yxyx", "rel_xyxy", "rel_xywh", "rel_center_xywh")


def check_box_format(bounding_box_format: str) -> str:
    """``ValueError`` listing the formats for an unknown one."""
    if bounding_box_format not in BOX_FORMATS:
        raise ValueError(f"bounding_box_format must be one of {BOX_FORMATS} (KerasHub's names), "
                         f"got {bounding_box_format!r}")
    return bounding_box_format


@dataclasses.dataclass(frozen=True)
class BoxAugmentation:
    """The detection and segmentation training preset: scale jitter, a random crop, the flip.

    The image is scaled to fit the output size (aspect ratio kept) times a
    scale drawn from ``scale_range``, cropped at a random place where it
    overshoots and padded where it falls short (Model Garden's
    ``resize_and_crop_image``; (0.8, 1.25) is the jitter of its RetinaNet
    and Mask R-CNN recipes, (0.1, 2.0) of its long ones).

    Attributes:
      scale_range: the jitter's range; (1.0, 1.0) turns it off.
      flip: random horizontal flip (boxes and masks are mirrored with the pixels).
      min_visible: a box cut by the crop stays only if at least this fraction
        of its area is still in the image (and some of it is).
    """

    scale_range: tuple[float, float] = (0.8, 1.25)
    flip: bool = True
    min_visible: float = 0.25

    def __post_init__(self) -> None:
        low, high = self.scale_range
        if not 0 < low <= high:
            raise ValueError(f"scale_range must satisfy 0 < low <= high, got {self.scale_range!r}")
        if not 0 <= self.min_visible <= 1:
            raise ValueError(f"min_visible must be in [0, 1], got {self.min_visible!r}")


@dataclasses.dataclass(frozen=True)
class ObjectTargets:
    """What the detection targets hold.

    Attributes:
      bounding_box_format: KerasHub's format names ("yxyx", "xyxy", "xywh",
        "center_xywh", "center_yxhw", and "rel_" ones, fractions of the
        output image); pixels of the output image otherwise.
      max_objects: a fixed number of rows (objects past it are dropped, in
        record order) for a static shape (XLA, TPUs); None: the batch's
        largest count. Rows past an image's objects are -1.
      keep_crowd: keep COCO's crowd regions (``iscrowd``), which are ignore
        regions rather than objects, and are out of the targets by default.
      keep_difficult: keep the objects Pascal VOC marks difficult (out by
        default, as VOC's own evaluation ignores them).
      source_size: targets also carry ``"source_size"`` int32 [B, 2], each
        stored image's height and width, for :func:`reader.boxes_to_source`.
      mask_size: targets also carry ``"masks"`` float32 [B, N, M, M], M =
        ``mask_size``: each object's instance mask cropped to its box and
        resized (Model Garden's Mask R-CNN crops to 112; 28 is Mask R-CNN's
        head). Needs records converted with ``--masks`` (COCO).
      class_mask: targets also carry ``"class_mask"`` int32 [B, H, W, 1], the
        image's class ids moved with its pixels, 255 where padded. Needs
        records with a class mask (Pascal VOC converted with ``--masks``).
      keypoints: targets also carry ``"keypoints"`` float32 [B, N, K, 3], K =
        ``keypoints`` (COCO's 17): each object's points, x and y moved with the
        pixels (in the boxes' units: output pixels, fractions for ``rel_``),
        and their visibility; 0, 0, 0 where unlabelled or cropped away
        (:mod:`reader.keypoints`). Needs records with keypoints (COCO
        converted with its ``person_keypoints_*.json``); K must be the
        records' (the manifest's ``keypoints``, ``DatasetInfo.keypoint_names``).
        ``"auto"``: the manifest's K, and its flip unless ``keypoint_flip``
        is given.
      keypoint_flip: the points a horizontal flip swaps, as the TF Object
        Detection API's ``keypoint_flip_permutation``: needed with ``keypoints``
        when training flips. ``reader.COCO_KEYPOINT_FLIP`` orders COCO's 17
        person keypoints only; a dataset's own is ``DatasetInfo.keypoint_flip``.
      contiguous_ids: labels are 0-based and contiguous over the dataset's
        named classes (``DatasetInfo.object_classes``), as KerasHub's
        detectors take them (``num_classes`` classes, no background): COCO's
        ids 1-90 become 0-79. False: the records' ids, where 0 is the
        background (Model Garden's and the OD API's convention).
    """

    bounding_box_format: str = "yxyx"
    max_objects: Optional[int] = None
    keep_crowd: bool = False
    keep_difficult: bool = False
    source_size: bool = False
    mask_size: Optional[int] = None
    class_mask: bool = False
    contiguous_ids: bool = False
    keypoints: Optional[Union[int, str]] = None  # K, or "auto": the manifest's K (resolved when a pipeline is built)
    keypoint_flip: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        check_box_format(self.bounding_box_format)
        for name in ("max_objects", "mask_size", "keypoints"):
            value = getattr(self, name)
            if name == "keypoints" and isinstance(value, str) and value == AUTO:
                continue
            if value is not None and (as_int(value) is None or value < 1):
                also = ' or "auto"' if name == "keypoints" else ""
                raise ValueError(f"{name} must be None or a positive integer{also}, got {value!r}")
        if self.keypoint_flip is not None:
            object.__setattr__(self, "keypoint_flip", tuple(self.keypoint_flip))
            check_keypoint_flip(self.keypoint_flip, self.keypoints)
        for name in ("keep_crowd", "keep_difficult", "source_size", "class_mask", "contiguous_ids"):
            check_flag(getattr(self, name), name)


AUTO = "auto"  # ObjectTargets(keypoints="auto"): the count of points the manifest records


def check_keypoint_flip(flip: tuple, keypoints: object, held: str = "") -> None:
    """``flip`` orders the points of ``keypoints`` (K; with ``"auto"``, checked again once K is known), each once;
    a flip of another length is named as such (``reader.COCO_KEYPOINT_FLIP`` fits COCO's 17 only). ``held``:
    what holds K, for the message (default: ``keypoints=K``)."""
    if keypoints is None:
        raise ValueError(f"keypoint_flip={flip!r} is given without keypoints=: the flip swaps the keypoints' points")
    count = len(flip) if isinstance(keypoints, str) else as_int(keypoints) or 0
    if len(flip) != count:
        raise ValueError(f"keypoint_flip orders {len(flip)} points, and {held or f'keypoints={keypoints!r}'} "
                         f"{'hold' if held else 'asks for'} {count}: the flip must pair the records' points "
                         "(reader.COCO_KEYPOINT_FLIP fits COCO's 17 person keypoints only; a dataset's own flip, from "
                         "its points' names: reader.dataset_info(DATA).keypoint_flip)")
    if sorted(flip) != list(range(count)):
        raise ValueError(f"keypoint_flip must order the {count} points of keypoints=, each once, got {flip!r}")


def as_int(value: object) -> Optional[int]:
    """``value`` as a Python int if it is an integer of any kind (``5``, ``np.int64(5)``), else None.

    bool is not an integer here: ``image_size=True`` is a mistake, not 1.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def image_hw(image_size: Union[int, Sequence[int]]) -> tuple[int, int]:
    """``image_size`` (int or (height, width), NumPy integers too) as a validated (height, width)."""
    if as_int(image_size) is not None:
        size = (image_size, image_size)
    elif isinstance(image_size, (tuple, list, np.ndarray)) and len(image_size) == 2:
        size = (image_size[0], image_size[1])
    else:
        raise ValueError(f"image_size must be an int or (height, width), got {image_size!r}")
    ints = tuple(as_int(v) for v in size)
    if not all(v is not None and v > 0 for v in ints):
        raise ValueError(f"image_size must hold positive integers, got {image_size!r}")
    return ints  # type: ignore[return-value]


def as_options(value: object, kind: type, name: str):
    """``value`` as the options dataclass ``kind``: an instance, or a dict of its fields (from a config file).

    Raises:
      ValueError: naming ``name``, the fields ``kind`` has, and what was given.
    """
    if isinstance(value, kind):
        return value
    fields = [f.name for f in dataclasses.fields(kind)]
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"{name} has no field {unknown[0]!r}; reader.{kind.__name__} has {fields}")
        return kind(**value)
    raise ValueError(f"{name} must be a reader.{kind.__name__} (or a dict of its fields {fields}), got "
                     f"{type(value).__name__} {value!r}")


def check_flag(value: object, name: str) -> bool:
    """A real True or False: ``training="False"`` is a non-empty string, so truthy, so training."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_output(dtype: tf.DType, normalization: Optional[str]) -> tf.DType:
    """Validate the output dtype and normalization together."""
    try:
        dtype = tf.as_dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be one of {[d.name for d in DTYPES]}, got {dtype!r}") from None
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {[d.name for d in DTYPES]}, got {dtype.name}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if dtype == tf.uint8 and normalization is not None:
        raise ValueError("normalization needs a float dtype; with dtype=uint8 normalise on the accelerator")
    return dtype


ORDERS = ("streams", "buffer")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """The tuning knobs of :func:`reader.build_dataset`, grouped (as Model Garden's and Grain's configs are).

    Attributes:
      order: training order. "streams" (default): a pure function of (dataset,
        seed, epoch), the same global batches at any number of input
        pipelines, resumable from a step (``start=``). "buffer": the
        interleave + ``shuffle(shuffle_buffer)`` order of earlier versions,
        which depends on the pipeline count and cannot resume; ``cache`` and
        ``service`` read in it.
      streams, window: the "streams" layout (C canonical streams, W records per
        shuffled window); None: C = gcd(batch size, 64) (halved, down to 8,
        for splits with fewer than 512 records per stream) and 6 * C * W =
        10,000 records (about six windows per stream are in flight), the
        memory of the default shuffle buffer. Part of the
        order: keep them for a whole run.
      shuffle_buffer: records in the "buffer" order's shuffle buffer (encoded
        bytes, so 10,000 ImageNet-sized records are about 1.1 GB).
      cycle_length, block_length: the "buffer" order's interleave (and
        evaluation's); cycle_length None = AUTOTUNE.
      cache: None, "memory" (checked against available memory first) or a
        file path prefix; caches encoded records, never decoded images.
      service: address of a tf.data service dispatcher (``grpc://host:port``):
        reading, decoding and batching run on its workers in the
        ``distributed_epoch`` processing mode, which deals shard files (in
        evaluation) or whole epochs (in training) out to the workers, so every
        record is processed exactly once per epoch. Batches are formed on the
        workers, so in evaluation each worker's last batch may be partial.
      service_job_name: consumers that name the same job share its stream
        (e.g. every replica of one trainer); default: each pipeline its own job.
      private_threads: size of a private thread pool for this pipeline.
      prefetch_to_device: e.g. "/gpu:0", to prefetch batches into device memory.
    """

    order: str = "streams"
    streams: Optional[int] = None
    window: Optional[int] = None
    shuffle_buffer: int = 10_000  # TF Model Garden's classification default
    cycle_length: Optional[int] = None
    block_length: int = 1
    cache: Optional[str] = None
    service: Optional[str] = None
    service_job_name: Optional[str] = None
    private_threads: Optional[int] = None
    prefetch_to_device: Optional[str] = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"ReadOptions(order={self.order!r}) must be one of {ORDERS}")
        for name in ("streams", "window", "cycle_length", "private_threads"):
            value = getattr(self, name)
            if value is not None and (as_int(value) is None or value < 1):
                raise ValueError(f"ReadOptions({name}={value!r}) must be None or a positive integer")
        for name in ("shuffle_buffer", "block_length"):
            value = getattr(self, name)
            if as_int(value) is None or value < 1:
                raise ValueError(f"ReadOptions({name}={value!r}) must be a positive integer")
        if self.cache is not None and not isinstance(self.cache, str):
            raise ValueError(f'ReadOptions(cache={self.cache!r}) must be None, "memory" or a file path')
        if isinstance(self.cache, str) and self.cache != "memory" and \
                self.cache.strip().lower() in ("memory", "mem", "ram", ""):
            raise ValueError(f'ReadOptions(cache={self.cache!r}): did you mean cache="memory"? A file cache takes a '
                             'path such as "/tmp/cache/train"')
