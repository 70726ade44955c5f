"""tf.data input pipelines over the converter's shards, for training on GPUs and TPUs.

>>> import reader
>>> info = reader.dataset_info("shapes-tfrecords")
>>> ds = reader.build_dataset("shapes-tfrecords", split="train", batch_size=64, image_size=224)

Several datasets read as one, each its exact share of every batch, their classes
united by name: ``reader.build_dataset(reader.mixture([(dir_a, 0.7), (dir_b, 0.3)], "train", 64), ...)``
(``build_dataset`` takes a folder, a :class:`DatasetInfo` or a :class:`Mixture`: ``reader/builder.py``).

Training resumes exactly from a step, on any number of input pipelines:
``build_dataset(..., seed=7, start=step)`` (or a :class:`Position`, or Keras'
``model.optimizer.iterations`` with :class:`ExactResume`).

The stages ``build_dataset`` chains are public too, for trainers who compose
their own pipeline: :func:`file_order` (shard files per epoch and worker),
:func:`interleave_records` (parallel interleave of TFRecordDatasets),
:func:`parse_records` / :func:`parse_record`, and :func:`train_image` /
:func:`eval_image` (crop-before-decode preprocessing) to map before ``batch``.

This package never imports Apache Beam.

Imported before TensorFlow, ``reader`` loads it without its C++ start-up and
INFO lines (``TF_CPP_MIN_LOG_LEVEL=1`` unless the environment sets a level;
warnings and errors still show): see :mod:`reader.quiet_start`. Imported
after TensorFlow, it cannot: set ``TF_CPP_MIN_LOG_LEVEL=1`` in the environment.
"""

from reader.quiet_start import load_tensorflow as _load_tensorflow

_load_tensorflow()

from reader.cache import CacheTooLargeError
from reader.foreign import foreign_dataset_info
from reader.info import (
    DatasetInfo,
    DatasetNotFoundError,
    ShardInfo,
    SplitInfo,
    dataset_info,
    steps_per_epoch,
)
from reader.boxes import boxes_to_source
from reader.keypoints import COCO_FLIP as COCO_KEYPOINT_FLIP
from reader.mixtures.label_space import LabelSpace
from reader.mixtures.plan import Mixture, mixture
from reader.mixtures.repeat_factor import RepeatFactor
from reader.options import Augmentation, BoxAugmentation, FeatureKeys, ForeignShards, ObjectTargets, ReadOptions
from reader.positions import DatasetPosition, MixturePosition, Position
from reader.builder import build_dataset, build_mixture, distributed_dataset, position
from reader.preprocess import eval_image, finish, train_image
from reader.records import file_order, interleave_records, parse_record, parse_records, read_shard


def __getattr__(name: str):
    # Keras loads only for its callback: the reader itself needs TensorFlow alone.
    if name == "ExactResume":
        from reader.keras_callback import ExactResume

        return ExactResume
    raise AttributeError(f"module 'reader' has no attribute {name!r}")


__all__ = [
    "Augmentation",
    "BoxAugmentation",
    "CacheTooLargeError",
    "COCO_KEYPOINT_FLIP",
    "DatasetInfo",
    "DatasetNotFoundError",
    "DatasetPosition",
    "ExactResume",
    "FeatureKeys",
    "ForeignShards",
    "LabelSpace",
    "Mixture",
    "MixturePosition",
    "ObjectTargets",
    "Position",
    "ReadOptions",
    "RepeatFactor",
    "ShardInfo",
    "SplitInfo",
    "boxes_to_source",
    "build_dataset",
    "build_mixture",
    "dataset_info",
    "distributed_dataset",
    "eval_image",
    "file_order",
    "foreign_dataset_info",
    "finish",
    "interleave_records",
    "mixture",
    "parse_record",
    "parse_records",
    "position",
    "read_shard",
    "steps_per_epoch",
    "train_image",
]
