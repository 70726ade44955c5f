"""The release's near-duplicate search (commit 6601793), kept as a reference: one Python step per candidate pair.

In:  NEAR work records (``beam_jobs/files/work_records.py``) of one band range, sorted.
Out: the pairs of records within the distance, in the order the release found them.

The tests compare the vectorized search with it (tests/beam_jobs/stages/test_near_duplicates.py) and
``bench/near_search.py`` times it as its baseline; it lives here, in tests/, so that both import one copy
(bench runs from a clone, beside tests/, as bench/data.py does for tests/photo_data.py).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from beam_jobs.files import work_records
from beam_jobs.stages import near_duplicates, perceptual_hash


def _baseline_bucket_pairs(band: int, records: Sequence[bytes], distance: int,
                           block: int = near_duplicates._BLOCK) -> Iterator[tuple[bytes, bytes]]:
    firsts: list[tuple[bytes, int, bytes]] = []
    for record in records:
        _, sha, phash = work_records.near_head(record)
        if firsts and firsts[-1][0] == sha:
            if band == 0:
                yield firsts[-1][2], record
            continue
        firsts.append((sha, phash, record))
    if len(firsts) < 2:
        return
    hashes = np.fromiter((phash for _, phash, _ in firsts), dtype=np.uint64, count=len(firsts))
    earlier = perceptual_hash.band_masks(distance)[:band]
    for start in range(0, len(firsts), block):
        for other in range(start, len(firsts), block):
            distances = perceptual_hash.pairwise_distances(hashes[start:start + block], hashes[other:other + block])
            for i, j in zip(*np.nonzero(distances <= distance)):
                a, b = start + int(i), other + int(j)
                differ = firsts[a][1] ^ firsts[b][1]
                if a >= b or any(differ & mask == 0 for mask in earlier):
                    continue
                yield firsts[a][2], firsts[b][2]


def baseline_near_pairs(records: Sequence[bytes], bands: int, distance: int,
                        block: int = near_duplicates._BLOCK) -> Iterator[tuple[bytes, bytes]]:
    """The release's ``near_pairs``: NEAR record pairs, one Python step per candidate pair (``block``: hashes
    compared at once; the tests' reference takes smaller ones)."""
    span = (1 << 64) // bands
    start = 0
    while start < len(records):
        stop = start + 1
        while stop < len(records) and records[stop][:8] == records[start][:8]:
            stop += 1
        if stop - start > 1:
            band = work_records.near_head(records[start])[0] // span
            yield from _baseline_bucket_pairs(band, records[start:stop], distance, block)
        start = stop
