"""The checks a dataset's pipeline and a mixture's share, and where training starts, in one place.

Data in: the arguments of ``build_dataset`` (``reader/builder.py``) and a split's manifest entry. Data out:
the arguments as the pipelines use them (a seed as an int, a start step as a function giving a tensor), a
split with its shards checked present and its record indexes usable, or a ``ValueError`` /
``FileNotFoundError`` naming the argument or the file at fault. ``reader/pipeline.py`` and
``reader/mixtures/pipeline.py`` both import these; neither imports the other's private helpers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Optional, Sequence, Union

import tensorflow as tf

import record_schema
from reader import record_index
from reader.info import DatasetInfo, SplitInfo
from reader.options import AUTO, ForeignShards, ObjectTargets, ReadOptions, as_int, check_keypoint_flip
from reader.positions import DatasetPosition, MixturePosition, Position

logger = logging.getLogger(__name__)

StartStep = Callable[[], tf.Tensor]  # the start step, read when iteration begins


@dataclasses.dataclass(frozen=True)
class Request:
    """What ``build_dataset`` was asked, as given (each pipeline checks what it uses, with these functions).

    ``split`` and ``batch_size`` are resolved: a mixture's own when not given.
    """

    split: str
    batch_size: int
    image_size: Union[int, Sequence[int]] = 224
    training: bool = True
    seed: Optional[int] = None
    deterministic: Optional[bool] = None
    input_context: Optional[tf.distribute.InputContext] = None
    start: Any = None
    num_epochs: Optional[int] = None
    num_steps: Optional[int] = None
    dtype: Any = tf.float32
    normalization: Optional[str] = None
    augment: Any = None
    crop_fraction: float = 0.875
    targets: ObjectTargets = ObjectTargets()
    foreign: ForeignShards = ForeignShards()
    with_source: bool = False
    skip_corrupt: bool = False
    options: ReadOptions = ReadOptions()


def check_seed(seed: object) -> Optional[int]:
    """``seed`` as a Python int (NumPy integers too), or None."""
    if seed is None:
        return None
    value = as_int(seed)
    if value is None or not 0 <= value < 1 << 63:
        raise ValueError(f"seed must be None or an integer in [0, 2**63), got {seed!r}")
    return value


def check_positive(**values: int) -> int:
    """Each value is a positive integer (NumPy integers too); returns the last as a Python int."""
    result = 0
    for name, value in values.items():
        result = as_int(value)
        if result is None or result < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return result


def check_targets(targets: ObjectTargets, info: DatasetInfo) -> ObjectTargets:
    """``targets`` set only for a dataset of objects (elsewhere they would be silently ignored)."""
    where = info.data_dir or "this dataset"
    if targets != ObjectTargets() and info.task != record_schema.TASK_OBJECTS:
        raise ValueError(f"targets={targets!r} shapes detection targets, and {where} holds task {info.task!r}")
    features = info.manifest.get("features", {})
    if targets.mask_size and record_schema.OBJECT_MASK not in features:
        raise ValueError(f"ObjectTargets(mask_size={targets.mask_size}) needs instance masks, and {where}'s records "
                         "have none: convert COCO with --masks")
    if targets.class_mask and record_schema.SEGMENTATION_ENCODED not in features:
        raise ValueError(f"ObjectTargets(class_mask=True) needs a class mask an image, and {where}'s records have "
                         "none: convert Pascal VOC with --masks")
    if targets.keypoints and record_schema.KEYPOINT_X not in features:
        raise ValueError(f"ObjectTargets(keypoints={targets.keypoints!r}) needs keypoints, and {where}'s records "
                         "have none: convert COCO with its person_keypoints_*.json beside instances_*.json")
    return keypoint_targets(targets, info) if targets.keypoints else targets


def check_mixture_targets(targets: ObjectTargets, infos: Sequence[DatasetInfo]) -> ObjectTargets:
    """:func:`check_targets` for each source of a mixture; ``keypoints="auto"`` must come to one K for all."""
    found = {check_targets(targets, info) for info in infos}
    if len(found) > 1:
        raise ValueError(f"ObjectTargets(keypoints={targets.keypoints!r}): the sources' manifests record "
                         f"{' and '.join(sorted({str(t.keypoints) for t in found}))} keypoints an object (or other "
                         "flips): a batch's keypoints hold one count; pass keypoints=K and keypoint_flip=")
    return found.pop() if found else targets


def keypoint_targets(targets: ObjectTargets, info: DatasetInfo) -> ObjectTargets:
    """``targets`` with ``keypoints`` checked against the K the manifest records (a ValueError naming both and
    the manifest), ``"auto"`` taking it (and the manifest's flip, unless ``keypoint_flip`` is given); a manifest
    written before K was recorded checks nothing here (the first batch's assertion names a wrong K)."""
    where = info.data_dir or "this dataset"
    names = info.keypoint_names
    manifest = os.path.join(where, record_schema.MANIFEST_FILE)
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    if targets.keypoints == AUTO and not names:
        raise ValueError(f'ObjectTargets(keypoints="auto") takes K from the manifest, and {manifest} records '
                         "none (converted before it did): pass keypoints=K, the points each object holds "
                         "(COCO's person keypoints: 17)")
    if targets.keypoints != AUTO and names and targets.keypoints != len(names):
        flip = info.keypoint_flip
        raise ValueError(
            f"ObjectTargets(keypoints={targets.keypoints}): {where}'s records hold {len(names)} keypoints an object "
            f"({shown}: {manifest}'s \"keypoints\"), not {targets.keypoints}: pass keypoints={len(names)} or "
            f"keypoints=\"auto\", and keypoint_flip={'reader.dataset_info(DATA).keypoint_flip ' + str(flip) if flip else 'None'}"
            + ("" if len(names) == 17 else " (reader.COCO_KEYPOINT_FLIP fits COCO's 17 person keypoints only)"))
    if targets.keypoint_flip is not None and names:  # before "auto" takes K: the message names the records
        check_keypoint_flip(targets.keypoint_flip, len(names), f"{where}'s records ({shown})")
    if targets.keypoints == AUTO:
        flip = targets.keypoint_flip if targets.keypoint_flip is not None else info.keypoint_flip
        targets = dataclasses.replace(targets, keypoints=len(names), keypoint_flip=flip)
    return targets


def present_split(split_info: SplitInfo, skip_corrupt: bool = False) -> SplitInfo:
    """The split with every shard present (or an error naming the missing; with ``skip_corrupt``, without them)
    and its record indexes usable (a lost or damaged ``.idx``: read through, never fail)."""
    listings = record_index.list_folders([shard.path for shard in split_info.shards]
                                         + [shard.index_path for shard in split_info.shards if shard.index_path])
    split_info = check_shards_present(split_info, skip_corrupt, listings)
    return record_index.usable(split_info, listings)


def check_shards_present(split_info: SplitInfo, skip_corrupt: bool, listings: dict) -> SplitInfo:
    """Every shard the manifest lists is there (``listings``: one listing per folder), or fail naming the missing;
    with ``skip_corrupt``, the split without them, and one warning (not one per epoch that would have read them).

    The read itself checks again (a file can vanish later); this fails at
    once, before any thread starts.
    """
    missing = [path for path in split_info.files
               if os.path.basename(path) not in listings.get(os.path.dirname(path), {})]
    if not missing:
        return split_info
    names = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    if skip_corrupt:
        logger.warning("split %s: %d listed shards are missing and will be skipped: %s",
                       split_info.name, len(missing), names)
        kept = tuple(shard for shard in split_info.shards if shard.path not in set(missing))
        return dataclasses.replace(split_info, shards=kept, num_examples=sum(s.num_examples for s in kept),
                                   num_bytes=sum(s.num_bytes for s in kept))
    raise FileNotFoundError(
        f"split {split_info.name!r}: {len(missing)} of its {len(split_info.files)} shards are listed in the "
        f"manifest but missing: {names}. The dataset is incomplete: restore them, reconvert, or pass "
        "skip_corrupt=True to read the rest"
    )


_OTHER_KIND = {
    DatasetPosition: "is a position of a mixture; one dataset resumes from its own position "
                     "(reader.position(data_dir, split, batch_size, seed, step)) or a global step",
    MixturePosition: "is a position of one dataset; a mixture resumes from its own position "
                     "(reader.position(mixture, seed=..., step=...) or mixture.position(seed, step)) or a global step",
}


def start_step(start: object, seed: Optional[int], kind: type, mismatch: Callable[[Position], str],
               what: str) -> tuple[Optional[int], StartStep]:
    """(seed, a function giving the start step as a tensor) from ``start``, the same kinds for every pipeline:
    None, a global step, a :class:`Position` of ``kind`` (or its JSON) that ``mismatch`` finds nothing wrong
    with, or a variable read when iteration begins. ``ValueError`` naming the difference otherwise."""
    if start is None:
        return seed, lambda: tf.constant(0, tf.int64)
    if isinstance(start, (str, bytes)):
        start = Position.from_json(start)
    if isinstance(start, Position):
        if not isinstance(start, kind):
            raise ValueError(f"start={start.to_json()} {_OTHER_KIND[kind]}")
        problem = mismatch(start)
        if problem:
            raise ValueError(f"start={start.to_json()} cannot resume {what}: {problem}")
        step = start.global_step
        return start.seed, lambda: tf.constant(step, tf.int64)
    if seed is None:
        raise ValueError("start= needs the run's seed: pass seed=..., the same on every restart (a run without "
                         "one has an order nobody can repeat)")
    step = as_int(start)
    if step is not None:
        if step < 0:
            raise ValueError(f"start must be a global step >= 0, got {start!r}")
        return seed, lambda: tf.constant(step, tf.int64)
    # A Keras variable (optimizer.iterations) holds a tf.Variable in .value; a tf.Variable's own .value is a
    # method, so a tf.Variable or tensor is taken as it is, and only anything else is looked inside.
    variable = start if isinstance(start, tf.Variable) or tf.is_tensor(start) else getattr(start, "value", start)
    if isinstance(variable, tf.Variable) or tf.is_tensor(variable):
        return seed, lambda: tf.convert_to_tensor(variable)
    raise ValueError(f"start must be None, a global step, a reader.Position (or its JSON) or a variable holding "
                     f"the step, got {type(start).__name__} {start!r}")
