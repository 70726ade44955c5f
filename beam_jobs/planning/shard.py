"""Shard arithmetic: how many shards each split gets and which records go where.

Pure functions, no I/O. The order of records within a split is the order of a
keyed hash of (seed, relative path): a pseudo-random shuffle that depends on
nothing but the inputs and the seed, never on the runner, the number of
workers or the file system's listing order. Records are then cut into
contiguous runs whose sizes differ by at most one (TFDS and the
tensorflow/models scripts cut the same way).
"""

from __future__ import annotations

import math
from typing import Mapping


def plan_shard_counts(split_sizes: Mapping[str, int], train_shards: int) -> dict[str, int]:
    """Shard count per split, before rejections.

    ``train_shards`` applies to the train split (to the largest split when there
    is no train split). Every other split gets ``ceil(train_shards * n / n_train)``
    shards, at least one, so all splits have records per shard of the same
    size; but never more than ``train_shards`` (a validation split carved
    larger than train would otherwise get thousands of one-image shards). No
    split gets more shards than records.
    """
    sizes = {split: n for split, n in split_sizes.items() if n > 0}
    if not sizes:
        return {}
    base = "train" if "train" in sizes else max(sizes, key=lambda split: (sizes[split], split))
    counts = {}
    for split, n in sizes.items():
        wanted = train_shards if split == base else min(train_shards, math.ceil(train_shards * n / sizes[base]))
        counts[split] = max(1, min(wanted, n))
    return counts


MIB = 1 << 20
# TFDS's bounds on a shard's size (tensorflow_datasets/core/utils/shard_utils.py), which --shards auto
# follows; TensorFlow's TFRecord guide asks for files of 100 MB or more, at least 10 per reading host.
MIN_SHARD_BYTES, MAX_SHARD_BYTES = 64 * MIB, 1024 * MIB
# Under this a shard is small enough that reading opens many files (the warning below; TensorFlow's guide asks
# for 100 MB or more): the least an update's new shards are cut to (sized_count).
SMALL_SHARD_BYTES = 10 * MIB
# Bytes a record adds to its image: the Example's other features and the TFRecord framing (~120 measured).
RECORD_OVERHEAD = 128


def auto_shard_count(num_bytes: int, num_records: int) -> int:
    """Shards for a split of ``num_bytes`` (records included): TFDS's rule.

    1024 shards when that keeps each within 64 MiB..1 GiB; more (a multiple
    of 1024) for larger splits, so no shard passes 1 GiB; fewer (512, 256, ...
    down to 1) for smaller ones, so shards stay at least 64 MiB where they can.
    Never more shards than records.
    """
    most, fewest = num_bytes // MIN_SHARD_BYTES, -(-num_bytes // MAX_SHARD_BYTES)
    if fewest <= 1024 <= most and num_records >= 1024:
        return 1024
    if fewest > 1024:
        count = 1024 * -(-fewest // 1024)
        return min(count, num_records)
    for count in (512, 256, 128, 64, 32, 16, 8, 4, 2):
        if fewest <= count <= most and num_records >= count:
            return count
    return 1


def sized_count(num_bytes: int, shard_bytes: float) -> int:
    """Shards of about ``shard_bytes`` each for a split of ``num_bytes``: an update's new records, cut as the
    split's shards are (its conversion's size), so a large update does not add one file of up to 1 GiB beside
    shards of a few MB (TFDS's rule would). The size is kept within :data:`SMALL_SHARD_BYTES` (a conversion of
    tiny shards, ``--shards 64`` of a small seed set, would have every later update write a file an image or
    two) and :data:`MAX_SHARD_BYTES` (``--shards 1`` of 40 GiB: a 10 GiB update in one file). Rounded: at least
    one; a shard under half the split's size is a small one that the next update merges
    (:mod:`beam_jobs.update.shard_moves`)."""
    size = min(max(shard_bytes, SMALL_SHARD_BYTES), MAX_SHARD_BYTES)
    return max(1, round(num_bytes / size))


def shard_size_warning(split: str, num_bytes: int, num_shards: int) -> str:
    """A warning when explicit --shards makes a split's shards over ~1 GiB or under 10 MB, else ""."""
    average = num_bytes / num_shards
    if average > MAX_SHARD_BYTES:
        return (f"split {split}'s shards average {average / MIB:,.0f} MB, over 1 GiB: shuffling reads fewer, "
                f"larger files and Beam runners group at most 1-2 GB; raise --shards (or pass --shards auto)")
    if average < SMALL_SHARD_BYTES and num_bytes >= 2 * SMALL_SHARD_BYTES:
        return (f"split {split}'s shards average {average / MIB:.1f} MB, under 10 MB: reading opens many small "
                f"files (TensorFlow's guide asks for 100 MB or more); lower --shards (or pass --shards auto)")
    return ""


def shard_starts(num_records: int, num_shards: int) -> list[int]:
    """Index of the first record of each shard, plus ``num_records`` at the end.

    Shard ``i`` holds records ``[starts[i], starts[i+1])``; sizes differ by at
    most one and no shard is empty when ``num_shards <= num_records``.
    """
    if num_shards < 1 or num_shards > max(num_records, 1):
        raise ValueError(f"cannot cut {num_records} records into {num_shards} non-empty shards")
    return [i * num_records // num_shards for i in range(num_shards)] + [num_records]
