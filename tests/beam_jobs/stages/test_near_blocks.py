"""A band value too large for one task (#56 §1): spilled by its range's task, its block grid searched over tasks,
the groups and leaks those of the value searched whole."""

from __future__ import annotations

import json
import os
import random

import pytest

from beam_jobs.files import work_records
from beam_jobs.stages import near_blocks, near_groups, near_links, perceptual_hash
from tests.beam_jobs.stages.near_data import CLASSES, content as _content, flip as _flip, layout as _layout
from tests.beam_jobs.stages.test_near_duplicates import _planted, _signed

SPLITS = ("train", "validation", "test")


def _records(seed: int) -> list[bytes]:
    """Clusters of near hashes across splits, blank frames (one class of copies, across splits), frames alike
    but not copies (one hash, other thumbnails), and copies of one photo: band values far larger than 8."""
    rng = random.Random(seed)
    records = _planted(seed, 300, 30)
    records += [_signed(f"blank{i:04d}.jpg", 1 << 63, bytes(64), rng.choice(SPLITS)) for i in range(120)]
    records += [_signed(f"alike{i:04d}.jpg", _flip(1 << 63, rng.sample(range(64), rng.randint(0, 2))),
                        bytes(rng.randrange(40) for _ in range(64)), rng.choice(SPLITS)) for i in range(80)]
    records += [_content(f"photo{i:04d}.jpg", 0x0F0F_0F0F_0F0F_0F0F, rng.choice(SPLITS), data=b"one photo")
                for i in range(40)]
    records += [_content(f"val{i:04d}.jpg", work_records.decode_content(records[i]).perceptual_hash ^ 3,
                         split=rng.choice(SPLITS[1:])) for i in range(0, 300, 5)]
    for i in range(30):  # an evaluation image with two training partners at one distance: the tie is broken alike
        centre = rng.getrandbits(64) & ~perceptual_hash.band_masks(3)[0]  # one band 0 value for all: spilled
        records += [_signed(f"tie{i:04d}v.jpg", centre, bytes(64), rng.choice(SPLITS[1:]))]
        records += [_signed(f"tie{i:04d}{side}.jpg", centre ^ (1 << bit), bytes(64), "train")
                    for side, bit in zip("ab", rng.sample([b for b in range(64) if not perceptual_hash.band_masks(3)[0] >> b & 1], 2))]
    return records


def _search(layout, **chunks) -> list[near_blocks.BigValue]:
    values = []
    for near_range in range(layout.near_ranges):
        near_links.find_pairs(layout, near_range, 3, **chunks)
        values += near_blocks.values(near_range, layout)
    for value in values:
        for block in range(value.blocks):
            near_blocks.search_block((value, block), layout, 3)
    return values


def _dropped(layout) -> list[tuple[str, int]]:
    return sorted((leak[0][2], leak[2]) for leak in json.loads(open(layout.near_dropped()).read()))


def test_a_value_searched_in_blocks_over_tasks_gives_the_groups_and_leaks_of_the_value_searched_whole(tmp_path):
    """Values of more than 8 records spilled and cut into blocks of 8 reps (tasks holding two blocks): the
    same groups.jsonl and dropped.json byte for byte (the same leaked images, distances and partners, ties
    broken alike), each partner a training image at that distance; a value of copies is one rep and members."""
    records = _records(3)
    parts = [records[i::3] for i in range(3)]
    whole, blocked = _layout(tmp_path, "whole", parts, 3, 2), _layout(tmp_path, "blocked", parts, 3, 2)
    assert _search(whole, chunk_records=10**9, collapse_over=4) == []  # compared by signature, as a spilled value
    values = _search(blocked, chunk_records=8, read_bytes=600)
    assert len(values) > 4 and max(value.blocks for value in values) > 4
    summaries = [near_groups.group_near(layout, 3, CLASSES, values=found)
                 for layout, found in ((whole, []), (blocked, values))]
    assert summaries[0] == summaries[1] and summaries[0].num_cross_split > 5
    assert open(whole.near_groups(), "rb").read() == open(blocked.near_groups(), "rb").read()
    assert _dropped(whole) == _dropped(blocked) and len(_dropped(whole)) > 50
    assert open(whole.near_dropped(), "rb").read() == open(blocked.near_dropped(), "rb").read()  # the partners too
    for leak in json.loads(open(blocked.near_dropped()).read()):
        member, partner, bits = leak
        assert partner[0] == "train" and member[0] != "train"
        assert bin(member[3] ^ partner[3]).count("1") == bits


def test_a_spilled_value_is_searched_again_the_same_after_a_kill(tmp_path):
    """A block task whose pairs file exists is done (a resumed run reads it); a block task killed before it
    wrote its pairs file is searched anew, the same lines: the files are the same whatever ran twice."""
    records = _records(4)
    layout = _layout(tmp_path, "w", [records[0::2], records[1::2]], 3, 2)
    values = _search(layout, chunk_records=8, read_bytes=600)
    assert values
    files = {path: open(path, "rb").read() for name in ("pairs", "leaks")
             for path in near_blocks.value_files(layout, values, name)}
    first = next(near_blocks.value_files(layout, values, "pairs"))
    links = files[first].count(b"\n")
    assert near_blocks.search_block((sorted(values)[0], 0), layout, 3) == links  # done: read, not searched
    for path in files:
        os.remove(path)
    _search(layout, chunk_records=8, read_bytes=600)
    assert {path: open(path, "rb").read() for path in files} == files


@pytest.mark.e2e  # Beam's runner starts processes (ldconfig) on its way
def test_the_pipelines_search_deals_the_spilled_values_blocks_and_groups_them_with_the_ranges(tmp_path):
    """transforms.SearchDuplicates on Beam's runner: a chunk of 8 spills values to block tasks dealt from the
    part ids; the groups and leaks are those of the search with no value spilled."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jobs import transforms

    records = _records(5)
    parts = [records[i::3] for i in range(3)]
    whole, blocked = _layout(tmp_path, "whole", parts, 3, 2), _layout(tmp_path, "blocked", parts, 3, 2)
    _search(whole, chunk_records=10**9)
    expected = near_groups.group_near(whole, 3, CLASSES)
    options = PipelineOptions(["--direct_num_workers=1", "--direct_running_mode=in_memory"])
    with beam.Pipeline(options=options) as pipeline:
        ids = pipeline | beam.Create(range(blocked.num_parts))
        after = pipeline | "Counts" >> beam.Create([0])  # validation's counts: only waited for
        _ = ids | transforms.SearchDuplicates(blocked, CLASSES, 3, after, chunk_records=8)
    assert [v for r in range(blocked.near_ranges) for v in near_blocks.values(r, blocked)]
    assert near_groups.NearSummary.from_json(open(blocked.near_summary()).read()) == expected
    assert open(whole.near_groups(), "rb").read() == open(blocked.near_groups(), "rb").read()
    assert _dropped(whole) == _dropped(blocked) and _dropped(whole)
