"""The external sort: records of any bytes given back in byte order, in memory or through many runs merged in
rounds, its scratch files removed once read."""

from __future__ import annotations

import os
import random

from beam_jobs.files import external_sort


def _records(count: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    alphabet = b"ab\n\0\xff"  # newlines, NULs and high bytes inside records: frames, not lines
    return [bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(count)]


def test_records_held_in_memory_come_back_sorted_with_duplicates_and_no_scratch_file(tmp_path):
    records = _records(500)
    sorter = external_sort.ExternalSort(str(tmp_path), "held")
    for record in records:
        sorter.add(record)
    assert list(sorter.sorted()) == sorted(records)
    assert os.listdir(tmp_path) == []


def test_records_through_more_runs_than_one_merge_opens_come_back_sorted_and_the_runs_are_removed(tmp_path):
    records = _records(6_000, seed=1)
    sorter = external_sort.ExternalSort(str(tmp_path), "spilled", run_bytes=1_000)  # ~20 records a run: ~300 runs
    for record in records:
        sorter.add(record)
    assert len(os.listdir(tmp_path)) > external_sort.FAN_IN  # merged in rounds, FAN_IN files at once
    assert list(sorter.sorted()) == sorted(records)
    assert os.listdir(tmp_path) == []
