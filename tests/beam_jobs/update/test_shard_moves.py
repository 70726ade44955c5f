"""What counts as a small shard: sized against the conversion's shards, not whatever the updates added."""

from __future__ import annotations

import numpy as np

from beam_jobs.update.shard_moves import merge_groups, target_bytes


def _shard(file: str, num_bytes: int) -> dict:
    return {"file": file, "num_bytes": num_bytes, "num_examples": 10}


def test_a_split_converted_as_one_shard_keeps_its_size_as_the_target_beside_the_updates_small_shards():
    """The median of all three files was a small one's, so no shard was small and none ever merged (review F3)."""
    shards = [_shard("validation-00000-of-00001.tfrecord", 11_609), _shard("versions/00002/validation-0.tfrecord", 968),
              _shard("versions/00003/validation-0.tfrecord", 967)]
    assert target_bytes(shards) == 11_609


def test_a_big_updates_shards_do_not_make_the_conversions_shards_small():
    shards = [_shard(f"train-0000{i}-of-00004.tfrecord", 10_000_000) for i in range(4)] + [
        _shard(f"versions/00002/train-0000{i}.tfrecord", 64_000_000) for i in range(8)]
    assert target_bytes(shards) == 10_000_000


def test_the_updates_files_set_the_target_once_no_converted_shard_is_left():
    shards = [_shard("versions/00004/compacted/train-0.tfrecord", 300), _shard("versions/00005/train-0.tfrecord", 100),
              _shard("versions/00005/train-1.tfrecord", 200)]
    assert target_bytes(shards) == 200


def _pooled(file: str, num_bytes: int, must: bool = False) -> tuple:
    return _shard(file, num_bytes), np.arange(10), must


def test_small_shards_group_until_the_target_and_one_left_alone_at_the_end_stays_where_it_is():
    """Copying one file into one file buys nothing (review F4): the last small shard waits for a second."""
    pool = [_pooled("a", 49), _pooled("b", 49), _pooled("c", 49), _pooled("d", 49)]
    groups = merge_groups(pool, target=100)
    assert [[shard["file"] for shard, _ in group] for group in groups] == [["a", "b", "c"]]


def test_a_compacted_shards_survivors_are_copied_even_alone_and_a_lone_small_shard_is_not():
    assert [[s["file"] for s, _ in g] for g in merge_groups([_pooled("big", 200, must=True)], 100)] == [["big"]]
    assert merge_groups([_pooled("small", 10)], 100) == []
    groups = merge_groups([_pooled("big", 200, must=True), _pooled("small", 10)], 100)
    assert [[s["file"] for s, _ in g] for g in groups] == [["big"]]


def test_an_updates_new_shards_are_cut_to_the_splits_shard_size_not_by_tfds_rule():
    """10% of a 64-shard dataset of 20 MB shards: TFDS's rule gave one 128 MB file; the split's size gives about
    six. A split new in the version (no size known) keeps TFDS's rule."""
    from beam_jobs.planning.shard import RECORD_OVERHEAD
    from beam_jobs.stages.count import PartCounts

    records = 3_200
    stored = 20_000_000 * 6.4 - RECORD_OVERHEAD * records
    counts = PartCounts({"train": (records,), "test": (10,)}, {}, {"train": int(stored), "test": 9_000})
    assert counts.shard_counts(None) == {"train": 1, "test": 1}
    assert counts.shard_counts(None, {"train": 20_000_000}) == {"train": 6, "test": 1}
    assert counts.shard_counts(None, {"train": 500_000_000}) == {"train": 1, "test": 1}  # never none
    assert counts.shard_counts({"train": 4, "test": 1}, {"train": 20_000_000}) == {"train": 4, "test": 1}  # --shards N


def test_an_updates_new_shards_stay_within_10_mib_and_1_gib_whatever_the_conversions_size():
    """The review of 24706b0: a conversion of one-image shards (~1 KB) had a 200-image update write 160 files; a
    conversion into one 40 GiB shard would have a 10 GiB update written as one file."""
    from beam_jobs.planning.shard import MIB, sized_count

    assert sized_count(240_000, 967) == 1
    assert sized_count(25 * MIB, 5 * MIB) == 2  # 5 MB shards: new ones of 10 MB
    assert sized_count(10 * 1024 * MIB, 40 * 1024 * MIB) == 10
