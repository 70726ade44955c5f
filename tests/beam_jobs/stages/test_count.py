"""Counts add up, and bucket tasks cut each split exactly where one global sort would."""

from __future__ import annotations

import random

import pytest

from beam_jobs.planning.shard import shard_starts
from beam_jobs.stages.count import PartCounts, SumCounts, bucket_tasks


def test_part_counts_add_per_split_bucket_and_reason_and_survive_json():
    a = PartCounts({"train": (1, 0, 2)}, {"train": {"undecodable": 1}})
    b = PartCounts({"train": (0, 3, 1), "test": (4,)}, {"test": {"empty-file": 2}, "train": {"undecodable": 2}})
    total = SumCounts().merge_accumulators([a, PartCounts({}, {}), b])
    assert total.accepted == {"train": (1, 3, 3), "test": (4,)}
    assert total.rejected_by_reason() == {"empty-file": 2, "undecodable": 3}
    assert total.accepted_per_split() == {"train": 7, "test": 4} and total.num_rejected() == 5
    assert PartCounts.from_json(total.to_json()) == total


@pytest.mark.parametrize("seed", range(20))
def test_bucket_slices_reassemble_the_cut_of_the_whole_split(seed):
    """Slicing buckets at their prefix sums gives each shard exactly records [i*n//S, (i+1)*n//S)."""
    rng = random.Random(seed)
    counts = tuple(rng.choice([0, 0, 1, 5, 40]) for _ in range(rng.randrange(1, 30)))
    records = sum(counts)
    if not records:
        assert list(bucket_tasks(PartCounts({"train": counts}, {}), {"train": 4})) == []
        return
    planned = rng.randrange(1, 50)
    shards: dict[int, list[int]] = {}
    for task in bucket_tasks(PartCounts({"train": counts}, {}), {"train": planned}):
        assert task.count == counts[task.bucket] > 0
        for shard, lo, hi in task.shard_slices():
            shards.setdefault(shard, []).extend(range(task.first + lo, task.first + hi))
    num_shards = min(planned, records)  # lowered to the records: never an empty shard
    starts = shard_starts(records, num_shards)
    assert sorted(shards) == list(range(num_shards))
    for shard, indices in shards.items():
        assert indices == list(range(starts[shard], starts[shard + 1]))
