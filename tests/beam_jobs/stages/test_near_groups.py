"""The near grouping (stage 6's last task): groups with distances to their first image, byte-identical groups
left to the exact search, --drop-leaks' choice of evaluation images (direct pairs only, not chains), and the
same files whether its external sorts spill or not (#56 §5)."""

from __future__ import annotations

import json
import random

import pytest

from beam_jobs.stages import drop_leaks, near_duplicates, near_groups, near_links
from tests.beam_jobs.stages.near_data import CLASSES, content as _content, flip as _flip, layout as _layout
from tests.beam_jobs.stages.near_data import reference_groups as _reference_groups


def test_the_grouping_writes_the_same_files_whether_its_sorts_spill_to_many_runs_or_none(tmp_path):
    """#56 §5: the grouping task holds the links as ids and sorts the rest on disk; runs of 256 bytes (hundreds
    of them, merged in rounds) give the bytes one run gives, for paths that quote, escape, leave UTF-8 or
    hold a newline, over three splits; the groups are the union-find's of the link lines."""
    rng = random.Random(5)
    hashes = [rng.getrandbits(64) for _ in range(120)]
    hashes += [_flip(h, rng.sample(range(64), rng.randint(0, 6))) for h in hashes[:90]]
    names = ['q/"quoted" \\ {}.jpg', "u/çà 猫 {}.jpg", "s/bad\udcff{}.jpg", "n/new\nline{}.jpg", "a/{}.jpg"]
    paths = [names[i % len(names)].format(i) for i in range(len(hashes))]
    records = [_content(path, h, rng.choice(["train", "validation", "test"]), i % 2,
                        data=path.encode("utf-8", "surrogatepass")) for i, (path, h) in enumerate(zip(paths, hashes))]
    outputs = []
    for run_bytes in (256, 1 << 24):
        layout = _layout(tmp_path, f"r{run_bytes}", [records[0::2], records[1::2]], 10, 2)
        for near_range in range(layout.near_ranges):
            near_links.find_pairs(layout, near_range, 10)
        summary = near_groups.group_near(layout, 10, CLASSES, run_bytes=run_bytes)
        outputs.append((open(layout.near_groups(), "rb").read(), open(layout.near_dropped(), "rb").read(), summary))
        lines = [json.loads(line) for line in near_groups._pairs(layout)]
        split_of = {m[2]: m[0] for line in lines for m in line}
        expected = [sorted(group, key=lambda path: (near_groups._rank(split_of[path]), path))
                    for group in _reference_groups([(a[2], b[2]) for a, b in lines])]
        found = [[m.path for m in group] for group in near_groups.components(near_groups._pairs(layout))]
        assert sorted(found) == sorted(expected)
    assert outputs[0] == outputs[1]
    assert outputs[0][2].num_groups > 10 and outputs[0][2].num_cross_split > 5 and json.loads(outputs[0][1])


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
        near_links.find_pairs(layout, near_range, 10)
    summary = near_groups.group_near(layout, 10, CLASSES)
    lines = [json.loads(line) for line in open(layout.near_groups())]
    assert lines == [{"kind": "near", "images": [
        {"split": "train", "label": "cat", "path": "train/cat/a.jpg", "distance": 0},
        {"split": "validation", "label": "cat", "path": "validation/cat/a_small.jpg", "distance": 3},
        {"split": "test", "label": "dog", "path": "test/dog/a_copy.jpg", "distance": 0}]}]
    assert (summary.num_groups, summary.num_images, summary.num_within_split, summary.num_cross_split) == (1, 2, 0, 1)
    assert summary.to_manifest()["near_cross_split"] == lines and summary.threshold == 10
    dropped = json.loads(open(layout.near_dropped()).read())  # each with its partner in the training split
    assert [(m[2], partner[2], bits) for m, partner, bits in dropped] == [
        ("test/dog/a_copy.jpg", "train/cat/a.jpg", 0), ("validation/cat/a_small.jpg", "train/cat/a.jpg", 3)]
    # resumed: the summary found is the summary
    assert near_groups.group_near(layout, 10, CLASSES) == summary


@pytest.mark.parametrize("group, left_out", [
    ([("train", "t"), ("validation", "v"), ("test", "x")], ["v", "x"]),
    ([("validation", "v"), ("test", "x"), ("test", "y")], ["x", "y"]),
    ([("train", "t"), ("train", "u")], []),
    ([("test", "x"), ("validation", "v")], ["x"]),
])
def test_drop_leaks_leaves_out_the_byte_identical_copies_after_the_groups_earliest_split(group, left_out):
    members = [near_duplicates.Member(split, 0, path, 0, "", 0, 0) for split, path in group]
    leaked = near_groups.leaked(members)
    assert [leak.member.path for leak in leaked] == left_out
    earliest = min(near_groups._rank(split) for split, _ in group)  # each beside the earliest split's first
    assert all(leak.partner.path == min(p for s, p in group if near_groups._rank(s) == earliest)
               and leak.distance == 0 for leak in leaked)


def test_drop_leaks_leaves_out_only_evaluation_images_near_a_training_image_not_those_reached_through_a_chain(
        tmp_path):
    """#56 §2: train T, validation V1 and V2, test X, each 8 bits from the one before (X is 24 bits from T):
    V1 alone is near a training image; the chain still makes one group for the report."""
    base = 0x0F0F_3C3C_5A5A_A5A5
    chain = [("train", "t/T.jpg", base), ("validation", "v/V1.jpg", _flip(base, range(0, 8))),
             ("validation", "v/V2.jpg", _flip(base, range(0, 16))), ("test", "x/X.jpg", _flip(base, range(0, 24)))]
    records = [_content(path, phash, split) for split, path, phash in chain]
    layout = _layout(tmp_path, "w", [records[:2], records[2:]], 10, 2)
    for near_range in range(layout.near_ranges):
        near_links.find_pairs(layout, near_range, 10)
    summary = near_groups.group_near(layout, 10, CLASSES)
    assert (summary.num_groups, summary.num_cross_split) == (1, 1)
    (group,) = [json.loads(line) for line in open(layout.near_groups())]
    assert [image["path"] for image in group["images"]] == ["t/T.jpg", "v/V1.jpg", "v/V2.jpg", "x/X.jpg"]
    dropped = json.loads(open(layout.near_dropped()).read())
    assert [(m[2], partner[2], bits) for m, partner, bits in dropped] == [("v/V1.jpg", "t/T.jpg", 8)]
    for hash_range in range(layout.hash_ranges):  # the exact search found no byte-identical copies
        open(layout.duplicates_dropped(hash_range), "w").write("[]")
    counts = drop_leaks.collect_drops(layout, 7, CLASSES)
    assert counts.accepted_per_split() == {"train": 0, "validation": 1, "test": 0}
    lines = [json.loads(line) for line in open(layout.dropped_list())]
    assert lines == [{"split": "validation", "label": "cat", "path": "v/V1.jpg",
                      "partner": {"split": "train", "label": "cat", "path": "t/T.jpg"}, "distance": 8}]
