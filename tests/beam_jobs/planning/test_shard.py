"""Shard arithmetic: counts per split and balanced, non-empty cuts."""

from __future__ import annotations

import pytest

from beam_jobs.planning.shard import (
    MAX_SHARD_BYTES,
    auto_shard_count,
    plan_shard_counts,
    shard_size_warning,
    shard_starts,
)


def test_train_gets_the_requested_count_and_other_splits_a_proportional_one():
    assert plan_shard_counts({"train": 10_000, "validation": 1_000, "test": 2_500}, 64) == {
        "train": 64,
        "validation": 7,  # ceil(64 * 1000 / 10000)
        "test": 16,
    }


def test_no_split_gets_more_shards_than_records():
    assert plan_shard_counts({"train": 5, "validation": 1}, 64) == {"train": 5, "validation": 1}


def test_without_train_the_largest_split_takes_the_requested_count():
    assert plan_shard_counts({"validation": 100, "test": 400}, 8) == {"validation": 2, "test": 8}


@pytest.mark.parametrize("records,shards", [(10, 3), (64, 64), (1000, 7), (5, 1), (101, 10)])
def test_shard_sizes_differ_by_at_most_one_and_none_is_empty(records, shards):
    starts = shard_starts(records, shards)
    sizes = [b - a for a, b in zip(starts, starts[1:])]
    assert sum(sizes) == records
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1


def test_more_shards_than_records_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        shard_starts(3, 4)


def test_a_split_larger_than_train_gets_no_more_shards_than_asked_for():
    """--val-fraction 0.999 on 3,000 images: 3 train images must not make validation 2,997 one-image shards."""
    assert plan_shard_counts({"train": 3, "validation": 2997}, 64) == {"train": 3, "validation": 64}


MIB = 1 << 20


@pytest.mark.parametrize("num_bytes,records,expected", [
    (10 * MIB, 500, 1),  # under 2 x 64 MiB: one shard
    (200 * MIB, 10_000, 2),  # 64 MiB..1 GiB each: as few as TFDS's ladder allows (512, 256, ... 2)
    (100 * 1024 * MIB, 1_000_000, 1024),  # 100 GiB: TFDS's 1024
    (3 * 1024 * 1024 * MIB, 10_000_000, 3072),  # 3 TiB: a multiple of 1024 keeping shards under 1 GiB
    (3 * 1024 * 1024 * MIB, 2000, 2000),  # never more shards than records
])
def test_auto_shard_counts_follow_tfds_sizes(num_bytes, records, expected):
    count = auto_shard_count(num_bytes, records)
    assert count == expected
    if count < records and num_bytes > MAX_SHARD_BYTES:
        assert num_bytes / count <= MAX_SHARD_BYTES


def test_explicit_counts_that_make_shards_too_large_or_too_small_are_warned_about():
    assert "over 1 GiB" in shard_size_warning("train", 200 * 1024 * MIB, 64)
    assert "under 10 MB" in shard_size_warning("train", 100 * MIB, 64)
    assert shard_size_warning("train", 5 * MIB, 64) == ""  # a small dataset cannot have 10 MB shards anyway
    assert shard_size_warning("train", 10 * 1024 * MIB, 64) == ""
