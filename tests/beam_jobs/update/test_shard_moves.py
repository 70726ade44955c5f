"""What counts as a small shard: sized against the conversion's shards, not whatever the updates added."""

from __future__ import annotations

from beam_jobs.update.shard_moves import target_bytes


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
