"""TensorFlow Datasets' metadata for a converted dataset, so ``tfds.builder_from_directory`` reads it.

TFDS finds shards through a file-name template and decodes records through a
``FeaturesDict`` whose nested keys, joined with ``/``, are the record's keys.
Ours are the tensorflow/models keys (``image/encoded``, ``image/class/label``...),
so the features mirror them: ``example["image"]["encoded"]`` is the decoded
image, ``example["image"]["class"]["label"]`` the label. Shard lengths and
byte counts come from the manifest; nothing is read again.

Needs ``tensorflow-datasets`` (``pip install ".[tfds]"``).
"""

from __future__ import annotations

import os

import tensorflow as tf

import record_schema
from reader.info import dataset_info

# {SHARD_X_OF_Y} is TFDS's "00000-of-00064": our shard names, record_schema.shard_filename.
FILENAME_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"


def _tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError("TFDS metadata needs tensorflow-datasets: pip install 'imgshards[tfds]'") from None
    return tfds


def features(classes):
    """The ``FeaturesDict`` that decodes our records (see the module docstring)."""
    tfds = _tfds()
    return tfds.features.FeaturesDict({
        "image": {
            "encoded": tfds.features.Image(encoding_format="jpeg"),
            "format": tfds.features.Text(),
            "class": {"label": tfds.features.ClassLabel(names=list(classes)), "text": tfds.features.Text()},
            "height": tf.int64,
            "width": tf.int64,
            "channels": tf.int64,
            "filename": tfds.features.Text(),
            "key": {"sha256": tfds.features.Text()},
        }
    })


def _refuse_what_tfds_cannot_read(info) -> None:
    """TFDS reads whole files named by its template in ``data_dir``: a version an update wrote keeps shards of
    earlier versions and its own folder's, and may mask records of a file (docs/update.md). Metadata for it
    would make TFDS miss those files, or read the deleted records back: refused, naming what to do."""
    for split in info.splits.values():
        if split.masked:
            raise ValueError(f"{info.data_dir}: split {split.name!r} of this version skips records of some of its "
                             "shard files (an --update masked them); TFDS reads whole files and would read them "
                             "back. Read it with reader.dataset_info, or convert SRC afresh (--overwrite) for TFDS")
        for index, shard in enumerate(split.shards):
            expected = os.path.join(info.data_dir, record_schema.shard_filename(split.name, index, len(split.shards)))
            if os.path.normpath(shard.path) != os.path.normpath(expected):
                raise ValueError(f"{info.data_dir}: split {split.name!r}'s shard {shard.path} is not where TFDS's "
                                 f"file template looks ({expected}): a version written by --update keeps earlier "
                                 "versions' files. Read it with reader.dataset_info, or convert SRC afresh "
                                 "(--overwrite) for TFDS")


def write_tfds_metadata(data_dir: str) -> list[str]:
    """Write TFDS's ``dataset_info.json``, ``features.json`` and label list into ``data_dir``.

    Returns the names written. A later ``--overwrite`` conversion replaces the
    dataset and drops them (they would describe the old shards): run this again.
    """
    tfds = _tfds()
    info = dataset_info(data_dir)
    _refuse_what_tfds_cannot_read(info)
    splits = [
        tfds.core.SplitInfo(
            name=split.name,
            shard_lengths=[shard.num_examples for shard in split.shards],
            num_bytes=split.num_bytes,
            filename_template=tfds.core.ShardedFileTemplate(
                data_dir=data_dir, template=FILENAME_TEMPLATE, dataset_name=record_schema.TFDS_NAME,
                split=split.name, filetype_suffix="tfrecord"),
        )
        for split in info.splits.values()
    ]
    tfds.folder_dataset.write_metadata(
        data_dir=data_dir, features=features(info.classes), split_infos=splits,
        filename_template=FILENAME_TEMPLATE, description=f"Converted by imgshards into {data_dir}",
        check_data=False)  # the manifest already vouches for every shard; `verify` checks them
    return list(record_schema.TFDS_METADATA_FILES)
