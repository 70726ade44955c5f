"""A bucket of many sorted work files merged a chunk at a time: the same records in the same order as reading every
file's bucket whole and sorting, chunks that never split a key, of about the size asked (a key with more records
is one chunk whole), whatever the read size (records cut across reads)."""

from __future__ import annotations

import random

import pytest

from beam_jobs.files import bucket_merge, work_records

BUCKETS = 3
CROWD = (((1 << 64) // BUCKETS) + 12345).to_bytes(8, "big")  # a key of bucket 1 many records share


def _files(tmp_path, seed: int, parts: int, count: int, crowded: int) -> list[str]:
    """``parts`` sorted NEAR files of ``count`` records each with 8-byte keys from a few hundred values, and one
    key (in bucket 1) that ``crowded`` records of each file share; records of varied lengths."""
    rng = random.Random(seed)
    paths = []
    for part in range(parts):
        keys = [rng.randrange(300) * ((1 << 64) // 300) for _ in range(count)]
        records = [key.to_bytes(8, "big") + rng.randbytes(rng.randrange(1, 300)) for key in keys]
        records += [CROWD + f"crowd-{part}-{i}".encode() for i in range(crowded)]
        path = str(tmp_path / f"part-{part}")
        work_records.write_file(path, work_records.NEAR, sorted(records), BUCKETS)
        paths.append(path)
    return paths


@pytest.mark.parametrize("chunk_records, read_bytes", [(64, 100), (500, 1 << 16), (10**6, 7)])
def test_chunks_joined_are_the_bucket_sorted_and_never_split_a_key(tmp_path, chunk_records, read_bytes):
    paths = _files(tmp_path, 1, parts=5, count=400, crowded=150)
    for bucket in range(BUCKETS):
        whole = sorted(record for path in paths for record in work_records.read_bucket(path, work_records.NEAR, bucket))
        chunks = list(bucket_merge.key_chunks(paths, work_records.NEAR, bucket, chunk_records, read_bytes))
        assert [record for chunk in chunks for record in chunk] == whole
        for before, after in zip(chunks, chunks[1:]):
            assert before[-1][:8] < after[0][:8]  # a key's records are in one chunk
        if bucket == 1:  # the key 750 records share is in one chunk, beyond the size asked when it must be
            assert [sum(record.startswith(CROWD) for record in chunk) for chunk in chunks if chunk[0][:8] <= CROWD
                    <= chunk[-1][:8]] == [750]
        pending = len(paths) * (chunk_records // len(paths) + read_bytes // 13 + 1)  # a file's share and a read
        assert all(len(chunk) <= pending or {record[:8] for record in chunk} == {CROWD} for chunk in chunks)


def test_an_empty_bucket_gives_no_chunk_and_a_file_of_no_records_is_merged_with_the_others(tmp_path):
    paths = _files(tmp_path, 2, parts=2, count=50, crowded=0)
    empty = str(tmp_path / "empty")
    work_records.write_file(empty, work_records.NEAR, [], BUCKETS)
    assert list(bucket_merge.key_chunks([empty], work_records.NEAR, 0, 16)) == []
    whole = sorted(record for path in paths for record in work_records.read_bucket(path, work_records.NEAR, 2))
    assert [r for chunk in bucket_merge.key_chunks(paths + [empty], work_records.NEAR, 2, 16) for r in chunk] == whole
