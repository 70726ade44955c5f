"""The on-disk contract between the converter (writer) and the reader.

Both sides import this module and nothing else of each other, so a change to a
key, a file name or the manifest layout is made here once. It deliberately
imports neither TensorFlow nor Apache Beam: the Beam workers stay light (no
multi-second TensorFlow import per worker) and the reader never pulls in Beam.

Record keys follow the de-facto standard of the tensorflow/models conversion
scripts (``image/encoded``, ``image/class/label``, ...), so existing parsers and
DALI's TFRecord reader work on our shards unchanged.
"""

from __future__ import annotations

import re
from typing import Final
# Bump when the manifest or record layout changes incompatibly; readers refuse
# manifests whose version they do not know.
FORMAT_VERSION: Final = 1

# Feature keys of every tf.train.Example we write.
IMAGE_ENCODED: Final = "image/encoded"
IMAGE_FORMAT: Final = "image/format"
LABEL: Final = "image/class/label"
LABEL_TEXT: Final = "image/class/text"
HEIGHT: Final = "image/height"
WIDTH: Final = "image/width"
CHANNELS: Final = "image/channels"
FILENAME: Final = "image/filename"
SHA256: Final = "image/key/sha256"

# key -> proto value kind ("bytes" or "int64"); every key holds exactly one value.
FEATURES: Final[dict[str, str]] = {
    IMAGE_ENCODED: "bytes",
    IMAGE_FORMAT: "bytes",
    LABEL: "int64",
    LABEL_TEXT: "bytes",
    HEIGHT: "int64",
    WIDTH: "int64",
    CHANNELS: "int64",
    FILENAME: "bytes",
    SHA256: "bytes",
}

# Objects (detection datasets): the keys Model Garden's TfExampleDecoder and the TF Object Detection API read.
# Boxes are normalized to the stored image, [0, 1], one list entry per object in every per-object key.
SOURCE_ID: Final = "image/source_id"  # the image's id as decimal text (COCO evaluation parses it)
BBOX_XMIN: Final = "image/object/bbox/xmin"
BBOX_YMIN: Final = "image/object/bbox/ymin"
BBOX_XMAX: Final = "image/object/bbox/xmax"
BBOX_YMAX: Final = "image/object/bbox/ymax"
OBJECT_LABEL: Final = "image/object/class/label"  # the source's class ids (COCO's category ids, gaps kept)
OBJECT_TEXT: Final = "image/object/class/text"
OBJECT_AREA: Final = "image/object/area"  # pixels of the stored image
OBJECT_IS_CROWD: Final = "image/object/is_crowd"
OBJECT_DIFFICULT: Final = "image/object/difficult"
OBJECT_TRUNCATED: Final = "image/object/truncated"
SEGMENTATION_ENCODED: Final = "image/segmentation/class/encoded"  # a PNG of class ids, pixel by pixel
SEGMENTATION_FORMAT: Final = "image/segmentation/class/format"  # b"png"
OBJECT_MASK: Final = "image/object/mask"  # --masks: a PNG of 0s and 1s an object, the stored image's size
# COCO's person_keypoints_*.json and captions_*.json, in the TF Object Detection API's keys: K points an object
# (x, y normalized like the boxes, visibility 0/1/2; zeros for an object without them), the labelled count an object.
KEYPOINT_X: Final = "image/object/keypoint/x"
KEYPOINT_Y: Final = "image/object/keypoint/y"
KEYPOINT_VISIBILITY: Final = "image/object/keypoint/visibility"
KEYPOINT_NUM: Final = "image/object/keypoint/num"
CAPTION: Final = "image/caption"  # an image's captions, a bytes list (Model Garden's create_coco_tf_record.py)
KEYPOINT_FEATURES: Final[dict[str, str]] = {KEYPOINT_X: "float_list", KEYPOINT_Y: "float_list",
                                            KEYPOINT_VISIBILITY: "int64_list", KEYPOINT_NUM: "int64_list"}

# key -> proto value kind of an object record: one value, or a list with an entry per object.
OBJECT_FEATURES: Final[dict[str, str]] = {
    IMAGE_ENCODED: "bytes",
    IMAGE_FORMAT: "bytes",
    HEIGHT: "int64",
    WIDTH: "int64",
    CHANNELS: "int64",
    FILENAME: "bytes",
    SHA256: "bytes",
    SOURCE_ID: "bytes",
    BBOX_XMIN: "float_list",
    BBOX_YMIN: "float_list",
    BBOX_XMAX: "float_list",
    BBOX_YMAX: "float_list",
    OBJECT_LABEL: "int64_list",
    OBJECT_TEXT: "bytes_list",
    OBJECT_AREA: "float_list",
    OBJECT_IS_CROWD: "int64_list",
    OBJECT_DIFFICULT: "int64_list",
    OBJECT_TRUNCATED: "int64_list",
}

# What a dataset's records label (manifest "task"): one class per image, or objects with boxes.
TASK_CLASSIFICATION: Final = "classification"
TASK_OBJECTS: Final = "objects"
TASK_SEGMENTATION: Final = "segmentation"  # a class mask an image (and no boxes): images/ beside masks/
TASK_MULTILABEL: Final = "multilabel"  # several classes an image: image/class/label and /text are lists

# key -> proto value kind of a multi-label record.
MULTILABEL_FEATURES: Final[dict[str, str]] = {**FEATURES, LABEL: "int64_list", LABEL_TEXT: "bytes_list"}

IMAGE_FORMAT_JPEG: Final = b"jpeg"
CHANNELS_RGB: Final = 3
# Images with a shorter side under this are reported (TF Model Garden's crop fails on 1-3 px images).
SMALL_SIDE: Final = 32
CHANNELS_GRAY: Final = 1  # a grayscale JPEG stored byte for byte; decode with channels=3 for RGB

# Files in a published dataset directory.
MANIFEST_FILE: Final = "manifest.json"
LABELS_FILE: Final = "labels.txt"
# An object dataset's classes as the TF Object Detection API's label map: item { id: 1 name: 'cat' }.
LABEL_MAP_FILE: Final = "label_map.pbtxt"
REJECTED_FILE: Final = "rejected.jsonl"
# Every group of identical images, one JSON list of {"split", "label", "path"} per line (the manifest lists a few).
DUPLICATES_FILE: Final = "duplicates.jsonl"
# --drop-leaks: each evaluation image left out, one JSON object a line: the image, its partner in an earlier split
# (exact or within --near-distance of it) and their distance (the manifest gives the count and the sha256).
DROPPED_FILE: Final = "dropped.jsonl"
# Each file of SRC skipped without being converted (no image, hidden, outside the layout, an annotation file no
# source read), one JSON object a line: {"path", "reason", "detail"} (the manifest gives the count and the sha256).
SKIPPED_FILE: Final = "skipped.jsonl"

# Split names, in the order they are reported.
SPLITS: Final = ("train", "validation", "test")
# Every spelling of a split that inputs use, in any case -> the split: folders (Roboflow's "valid"), label files'
# split columns, the Hub's file names, YOLO's yaml keys, VOC's and CVAT's lists and subsets. The one table.
SPLIT_NAMES: Final[dict[str, str]] = {"train": "train", "training": "train", "val": "validation",
                                      "valid": "validation", "validation": "validation", "test": "test",
                                      "testing": "test"}
SPLIT_ALIASES: Final[dict[str, str]] = {name: split for name, split in SPLIT_NAMES.items() if name != split}


def split_named(name: str) -> str | None:
    """The split an input's name for it means (``Valid``: validation), or None for a name that is no split."""
    return SPLIT_NAMES.get(name.strip().lower())

_SHARD_RE: Final = re.compile(r"^(?P<split>[^/]+)-(?P<index>\d{5,})-of-(?P<count>\d{5,})\.tfrecord$")


def shard_filename(split: str, index: int, count: int) -> str:
    """Name of shard ``index`` (0-based) of ``count`` shards of ``split``."""
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is outside 0..{count - 1}")
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


# Each split's records table (record_files/records_table.py): every record's place, classes, size and hashes,
# written once by the converter and listed in the manifest's split entry ("records_table").
RECORDS_TABLE_SUFFIX: Final = ".records.parquet"


def records_table_filename(split: str) -> str:
    """The file name of ``split``'s records table: ``train.records.parquet``."""
    return f"{split}{RECORDS_TABLE_SUFFIX}"


# What ``python -m converter tfds-metadata`` adds (reader/tools/tfds_metadata.py): TFDS's own files.
TFDS_NAME: Final = "imgshards"
TFDS_METADATA_FILES: Final = ("dataset_info.json", "features.json", "image-class-label.labels.txt")
# ``python -m converter report OUT``'s files: made from the dataset, so a conversion over it replaces them.
REPORT_FILES: Final = ("report.html", "report.json")

def parse_shard_filename(name: str) -> tuple[str, int, int] | None:
    """Inverse of :func:`shard_filename`: ``(split, index, count)`` or None."""
    match = _SHARD_RE.match(name)
    if match is None:
        return None
    return match["split"], int(match["index"]), int(match["count"])
