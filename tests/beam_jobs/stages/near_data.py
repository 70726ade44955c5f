"""Work folders for the near search's tests: CONTENT and NEAR records of made-up images, cut into hash and band
ranges as a run cuts them, and a plain union-find as the groups' reference (test_near_duplicates.py: the search;
test_near_groups.py: the grouping)."""

from __future__ import annotations

import hashlib

from beam_jobs.files import work_records
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.stage_records import Accepted, ImageRef
from beam_jobs.stages import near_duplicates

CLASSES = ["cat", "dog"]


def content(relpath: str, phash: int, split: str = "train", label: int = 0, data: bytes = b"") -> bytes:
    sha = hashlib.sha256(data or relpath.encode()).digest()
    return work_records.encode_content(Accepted(ImageRef(split, relpath, label), sha, "", 1, 1, stored_bytes=100,
                                                perceptual_hash=phash), objects=2)


def layout(tmp_path, name: str, parts: list[list[bytes]], distance: int, ranges: int) -> WorkLayout:
    """A work folder of ``parts``' CONTENT and NEAR records, cut into ``ranges`` hash ranges and band ranges a
    band (a band range never straddles two bands: :func:`work_layout.near_ranges`)."""
    layout = WorkLayout(str(tmp_path / name), num_parts=len(parts), buckets={"train": 2, "validation": 1, "test": 1},
                        hash_ranges=ranges, near_bands=distance + 1, near_ranges=ranges * (distance + 1))
    for folder in layout.folders():
        (tmp_path / folder).mkdir(parents=True)
    for index, records in enumerate(parts):
        work_records.write_file(layout.content(index), work_records.CONTENT, sorted(records), ranges)
        work_records.write_file(layout.near(index), work_records.NEAR,
                                near_duplicates.near_records(records, distance), layout.near_ranges)
    return layout


def flip(value: int, bits) -> int:
    for bit in bits:
        value ^= 1 << bit
    return value


def root(parent: dict, item):
    """``item``'s representative in a plain union-find (path halving): the reference the search is held to."""
    parent.setdefault(item, item)
    while parent[item] != item:
        parent[item] = parent[parent[item]]
        item = parent[item]
    return item


def reference_groups(pairs) -> list[list[str]]:
    """Connected components of path pairs by a plain union-find (the release's), each sorted, in sorted order."""
    parent: dict = {}
    for a, b in pairs:
        first, second = root(parent, a), root(parent, b)
        if first != second:
            parent[max(first, second)] = min(first, second)
    groups: dict = {}
    for path in parent:
        groups.setdefault(root(parent, path), []).append(path)
    return sorted(sorted(group) for group in groups.values())
