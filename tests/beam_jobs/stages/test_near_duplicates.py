"""The near search over work files: every pair within the distance found once (as brute force finds them),
whatever the band ranges; groups with distances to their first image; byte-identical copies left to the exact
search; --drop-leaks' choice of evaluation copies; the dropped images left out of their buckets."""

from __future__ import annotations

import hashlib
import itertools
import json
import random

import pytest

from beam_jobs.stages import perceptual_hash
from beam_jobs.files import work_records
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning.carve import keyed_hash
from beam_jobs.stage_records import Accepted, ImageRef
from beam_jobs.stages import drop_leaks, near_duplicates
from beam_jobs.stages.count import PartCounts, without

CLASSES = ["cat", "dog"]


def _content(relpath: str, phash: int, split: str = "train", label: int = 0, data: bytes = b"") -> bytes:
    sha = hashlib.sha256(data or relpath.encode()).digest()
    return work_records.encode_content(Accepted(ImageRef(split, relpath, label), sha, "", 1, 1, stored_bytes=100,
                                                perceptual_hash=phash), objects=2)


def _layout(tmp_path, name: str, parts: list[list[bytes]], distance: int, ranges: int) -> WorkLayout:
    layout = WorkLayout(str(tmp_path / name), num_parts=len(parts), buckets={"train": 2, "validation": 1, "test": 1},
                        hash_ranges=ranges, near_bands=distance + 1, near_ranges=ranges)
    for folder in layout.folders():
        (tmp_path / folder).mkdir(parents=True)
    for index, records in enumerate(parts):
        work_records.write_file(layout.content(index), work_records.CONTENT, sorted(records), ranges)
        work_records.write_file(layout.near(index), work_records.NEAR,
                                near_duplicates.near_records(records, distance), layout.near_ranges)
    return layout


def _flip(value: int, bits) -> int:
    for bit in bits:
        value ^= 1 << bit
    return value


def test_every_pair_within_the_distance_is_found_once_as_brute_force_finds_it(tmp_path):
    rng = random.Random(3)
    hashes = [rng.getrandbits(64) for _ in range(150)]
    hashes += [_flip(h, rng.sample(range(64), rng.randint(0, 12))) for h in hashes[:100]]  # planted neighbours
    records = [_content(f"img{i:04d}.jpg", h) for i, h in enumerate(hashes)]
    for distance in (4, 10):
        expected = sorted((f"img{i:04d}.jpg", f"img{j:04d}.jpg") for i, j in itertools.combinations(range(len(hashes)), 2)
                          if perceptual_hash.distance(hashes[i], hashes[j]) <= distance)
        assert len(expected) > 20
        brute_groups = near_duplicates.components([[["train", 0, a], ["train", 0, b]] for a, b in expected])
        for ranges in (1, 3):
            layout = _layout(tmp_path, f"d{distance}r{ranges}", [records[0::2], records[1::2]], distance, ranges)
            pairs = []
            for near_range in range(layout.near_ranges):  # every pair, each once, in its first common band
                ranged = []
                for part in range(layout.num_parts):
                    ranged += work_records.read_bucket(layout.near(part), work_records.NEAR, near_range)
                pairs += [tuple(sorted(work_records.decode_near(r)[1].relpath for r in pair))
                          for pair in near_duplicates.near_pairs(sorted(ranged), layout.near_bands, distance)]
            assert sorted(pairs) == expected
            # the links written join the same groups, in fewer lines
            links = sum(near_duplicates.find_pairs(layout, r, distance) for r in range(layout.near_ranges))
            assert links <= len(expected)
            groups = near_duplicates.components(near_duplicates._pairs(layout))
            assert [[m[2] for m in g] for g in groups] == [[m[2] for m in g] for g in brute_groups]


def test_groups_hold_distances_to_their_first_image_and_leave_byte_identical_groups_to_the_exact_search(tmp_path):
    base = 0x0123_4567_89AB_CDEF
    records = [
        _content("train/cat/a.jpg", base, "train", 0),
        _content("validation/cat/a_small.jpg", _flip(base, [1, 5, 9]), "validation", 0),
        _content("test/dog/a_copy.jpg", base, "test", 1, data=b"train/cat/a.jpg"),  # a's bytes
        _content("train/dog/b.jpg", ~base & (1 << 64) - 1, "train", 1),
        _content("train/dog/b_twin.jpg", ~base & (1 << 64) - 1, "train", 1, data=b"train/dog/b.jpg"),
        _content("test/cat/c.jpg", _flip(base, range(0, 64, 2)), "test", 0),
    ]
    layout = _layout(tmp_path, "w", [records[:3], records[3:]], 10, 2)
    for near_range in range(layout.near_ranges):
        near_duplicates.find_pairs(layout, near_range, 10)
    summary = near_duplicates.group_near(layout, 10, CLASSES)
    lines = [json.loads(line) for line in open(layout.near_groups())]
    assert lines == [{"kind": "near", "images": [
        {"split": "train", "label": "cat", "path": "train/cat/a.jpg", "distance": 0},
        {"split": "validation", "label": "cat", "path": "validation/cat/a_small.jpg", "distance": 3},
        {"split": "test", "label": "dog", "path": "test/dog/a_copy.jpg", "distance": 0}]}]
    assert (summary.num_groups, summary.num_images, summary.num_within_split, summary.num_cross_split) == (1, 2, 0, 1)
    assert summary.to_manifest()["near_cross_split"] == lines and summary.threshold == 10
    dropped = json.loads(open(layout.near_dropped()).read())
    assert [m[2] for m in dropped] == ["test/dog/a_copy.jpg", "validation/cat/a_small.jpg"]
    # resumed: the summary found is the summary
    assert near_duplicates.group_near(layout, 10, CLASSES) == summary


@pytest.mark.parametrize("group, left_out", [
    ([("train", "t"), ("validation", "v"), ("test", "x")], ["v", "x"]),
    ([("validation", "v"), ("test", "x"), ("test", "y")], ["x", "y"]),
    ([("train", "t"), ("train", "u")], []),
    ([("test", "x"), ("validation", "v")], ["x"]),
])
def test_drop_leaks_leaves_out_the_evaluation_copies_after_the_groups_earliest_split(group, left_out):
    members = [[split, 0, path, 0, "", 0, 0] for split, path in group]
    assert [m[2] for m in near_duplicates.leaked(members)] == left_out


def test_collected_drops_take_their_records_counts_bytes_and_objects_off_the_totals(tmp_path):
    layout = WorkLayout(str(tmp_path / "w"), num_parts=1, buckets={"train": 2, "validation": 3}, hash_ranges=1,
                        near_bands=0)
    for folder in layout.folders():
        (tmp_path / folder).mkdir(parents=True)
    member = ["validation", 1, "validation/dog/x.jpg", 5, "ab", 1234, 3]
    (tmp_path / "w" / "duplicates" / "range-000000.dropped.json").write_text(json.dumps([member, member]))
    dropped = drop_leaks.collect_drops(layout, 7, CLASSES)
    key = keyed_hash(7, member[2])
    bucket = work_records.bucket_of(key, 3)
    assert dropped.accepted["validation"][bucket] == 1 and sum(dropped.accepted["validation"]) == 1
    assert drop_leaks.dropped_keys(layout, "validation", bucket) == {key + member[2].encode()}
    assert drop_leaks.manifest_entry(layout) == {
        "num_dropped": 1, "dropped": [{"split": "validation", "label": "dog", "path": "validation/dog/x.jpg"}]}
    totals = PartCounts({"train": (4, 4), "validation": (2, 2, 2)}, {}, {"train": 8000, "validation": 6000},
                        {"validation": 10})
    less = without(totals, dropped)
    assert less.accepted_per_split() == {"train": 8, "validation": 5}
    assert (less.stored_bytes, less.objects) == ({"train": 8000, "validation": 6000 - 1234}, {"validation": 7})
