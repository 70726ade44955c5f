"""The near search over work files: every pair within the distance found once (as brute force finds them),
whatever the band ranges; groups with distances to their first image; byte-identical copies left to the exact
search; --drop-leaks' choice of evaluation copies; the dropped images left out of their buckets; the vectorized
search (#49) against the release's, kept here as the reference: the same pairs in the same order, the same links,
the same file bytes."""

from __future__ import annotations

import hashlib
import itertools
import json
import random

import numpy as np
import pytest

from beam_jobs.stages import perceptual_hash
from beam_jobs.files import work_records
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning.carve import keyed_hash
from beam_jobs.stage_records import Accepted, ImageRef
from beam_jobs.stages import drop_leaks, near_duplicates, near_groups, near_links
from beam_jobs.stages.count import PartCounts, without

from tests.beam_jobs.stages.near_data import CLASSES, content as _content, flip as _flip, layout as _layout
from tests.beam_jobs.stages.near_data import reference_groups as _reference_groups, root as _root

def test_every_pair_within_the_distance_is_found_once_as_brute_force_finds_it(tmp_path):
    rng = random.Random(3)
    hashes = [rng.getrandbits(64) for _ in range(150)]
    hashes += [_flip(h, rng.sample(range(64), rng.randint(0, 12))) for h in hashes[:100]]  # planted neighbours
    records = [_content(f"img{i:04d}.jpg", h) for i, h in enumerate(hashes)]
    for distance in (4, 10):
        expected = sorted((f"img{i:04d}.jpg", f"img{j:04d}.jpg") for i, j in itertools.combinations(range(len(hashes)), 2)
                          if perceptual_hash.distance(hashes[i], hashes[j]) <= distance)
        assert len(expected) > 20
        brute_groups = _reference_groups(expected)
        for ranges in (1, 3):
            layout = _layout(tmp_path, f"d{distance}r{ranges}", [records[0::2], records[1::2]], distance, ranges)
            pairs = []
            for near_range in range(layout.near_ranges):  # every pair, each once, in its first common band
                ranged = []
                for part in range(layout.num_parts):
                    ranged += work_records.read_bucket(layout.near(part), work_records.NEAR, near_range)
                ranged.sort()
                pairs += [tuple(sorted(work_records.decode_near(ranged[i])[1].relpath for i in pair))
                          for block in near_duplicates.pair_indices(ranged, layout.near_bands, distance)
                          for pair in block.T.tolist()]
            assert sorted(pairs) == expected
            # the links written join the same groups, in fewer lines
            links = sum(near_links.find_pairs(layout, r, distance) for r in range(layout.near_ranges))
            assert links <= len(expected)
            groups = near_groups.components(near_groups._pairs(layout))
            assert [[m[2] for m in g] for g in groups] == brute_groups


def test_a_band_range_that_holds_no_record_writes_empty_files(tmp_path):
    layout = _layout(tmp_path, "w", [[_content("a.jpg", 0x0123_4567_89AB_CDEF)]], 3, 8)  # 4 records, 8 ranges
    empty = [r for r in range(layout.near_ranges)
             if not work_records.read_bucket(layout.near(0), work_records.NEAR, r)]
    assert empty
    for near_range in range(layout.near_ranges):
        assert near_links.find_pairs(layout, near_range, 3) == 0
    assert open(layout.near_pairs(empty[0])).read() == open(layout.near_leaks(empty[0])).read() == ""


def test_collected_drops_take_their_records_counts_bytes_and_objects_off_the_totals(tmp_path):
    layout = WorkLayout(str(tmp_path / "w"), num_parts=1, buckets={"train": 2, "validation": 3}, hash_ranges=1,
                        near_bands=0)
    for folder in layout.folders():
        (tmp_path / folder).mkdir(parents=True)
    member = ["validation", 1, "validation/dog/x.jpg", 5, "ab", 1234, 3]
    partner = ["train", 0, "train/cat/y.jpg", 5, "ab", 1000, 0]
    (tmp_path / "w" / "duplicates" / "range-000000.dropped.json").write_text(
        json.dumps([[member, partner, 0], [member, partner, 0]]))
    dropped = drop_leaks.collect_drops(layout, 7, CLASSES)
    key = keyed_hash(7, member[2])
    bucket = work_records.bucket_of(key, 3)
    assert dropped.accepted["validation"][bucket] == 1 and sum(dropped.accepted["validation"]) == 1
    assert drop_leaks.dropped_keys(layout, "validation", bucket) == {key + member[2].encode()}
    staging = tmp_path / "staging"
    staging.mkdir()
    entry = drop_leaks.publish_list(layout, str(staging))
    published = (staging / "dropped.jsonl").read_bytes()
    assert entry == {"num_dropped": 1, "dropped_file": "dropped.jsonl",
                     "dropped_sha256": hashlib.sha256(published).hexdigest()}
    assert [json.loads(line) for line in published.splitlines()] == [
        {"split": "validation", "label": "dog", "path": "validation/dog/x.jpg",
         "partner": {"split": "train", "label": "cat", "path": "train/cat/y.jpg"}, "distance": 0}]
    totals = PartCounts({"train": (4, 4), "validation": (2, 2, 2)}, {}, {"train": 8000, "validation": 6000},
                        {"validation": 10})
    less = without(totals, dropped)
    assert less.accepted_per_split() == {"train": 8, "validation": 5}
    assert (less.stored_bytes, less.objects) == ({"train": 8000, "validation": 6000 - 1234}, {"validation": 7})


# --- the vectorized search against the release's (#49): the same pairs in the same order, the same links ------

def _reference_pairs(records, bands, distance, block):
    """The release's search, a Python step per candidate pair (the bench's baseline: the code as released)."""
    from tests.beam_jobs.stages.near_reference import baseline_near_pairs

    return baseline_near_pairs(records, bands, distance, block)


def _reference_links(pairs):
    """The release's links: a union-find keyed by the image's CONTENT bytes, taking the pairs in order."""
    parent, links = {}, []
    for a, b in pairs:
        first, second = _root(parent, a[8:]), _root(parent, b[8:])
        if first != second:
            parent[max(first, second)] = min(first, second)
            links.append((a, b))
    return links


def _planted(seed: int, count: int, copies: int) -> list[bytes]:
    """Seeded random hashes, half of them in planted clusters (0-12 bits from a centre), and byte copies."""
    rng = random.Random(seed)
    centres = [rng.getrandbits(64) for _ in range(8)]
    hashes = [rng.getrandbits(64) if i % 2 else _flip(rng.choice(centres), rng.sample(range(64), rng.randint(0, 12)))
              for i in range(count)]
    records = [_content(f"img{i:04d}.jpg", h) for i, h in enumerate(hashes)]
    for i in rng.sample(range(count), copies):  # the same bytes, another path: a copy of image i
        records.append(_content(f"copy{i:04d}.jpg", hashes[i], data=f"img{i:04d}.jpg".encode()))
    return records


@pytest.mark.parametrize("seed, distance, block", [(1, 10, 2048), (2, 10, 7), (3, 4, 5), (4, 12, 16)])
def test_the_vectorized_search_finds_the_release_searchs_pairs_in_its_order_and_writes_its_links(
        tmp_path, seed, distance, block):
    records = _planted(seed, 260, 12)
    near = sorted(near_duplicates.near_records(records, distance))
    expected = list(_reference_pairs(near, distance + 1, distance, block))
    assert len(expected) > 100 and any(a[8:24] == b[8:24] for a, b in expected)  # clusters, and copies
    found = [block for block in near_duplicates.pair_indices(near, distance + 1, distance, block)]
    assert [(near[a], near[b]) for chunk in found for a, b in chunk.T.tolist()] == expected
    contents = [record[8:] for record in near]
    ids = {content: index for index, content in enumerate(dict.fromkeys(contents))}
    images = np.array([ids[content] for content in contents])
    for batch in (1 << 21, 50, 1):  # the forest in one batch, in many, a pair at a time
        links = near_duplicates.spanning_links(iter(found), images, batch)
        assert [(near[a], near[b]) for a, b in links.T.tolist()] == _reference_links(expected)


def test_find_pairs_writes_the_release_searchs_files_byte_for_byte(tmp_path):
    records = _planted(5, 300, 20)
    layout = _layout(tmp_path, "w", [records[0::3], records[1::3], records[2::3]], 10, 3)
    written = 0
    for near_range in range(layout.near_ranges):
        ranged = sorted(record for part in range(layout.num_parts)
                        for record in work_records.read_bucket(layout.near(part), work_records.NEAR, near_range))
        lines = sorted(json.dumps([near_duplicates.Member.of(work_records.decode_near(a)[1]),
                                   near_duplicates.Member.of(work_records.decode_near(b)[1])])
                       for a, b in _reference_links(_reference_pairs(ranged, 11, 10, 2048)))
        assert near_links.find_pairs(layout, near_range, 10) == len(lines)
        assert open(layout.near_pairs(near_range), "rb").read() == "".join(line + "\n" for line in lines).encode()
        written += len(lines)
    assert written > 0


def test_the_heads_read_at_once_are_near_head_one_by_one():
    records = sorted(near_duplicates.near_records(_planted(6, 40, 5), 10))
    positions, shas, hashes = near_duplicates._heads(records)
    assert [(int(p), bytes(s), int(h)) for p, s, h in zip(positions, shas, hashes)] == [
        work_records.near_head(record) for record in records]


@pytest.mark.parametrize("relpath", ["train/cat/a.jpg", 'x/"quoted" \\ back.jpg', "x/çà 猫.jpg", "x/bad\udcff.jpg"])
def test_a_link_lines_half_is_its_member_as_json_dumps_writes_it(relpath):
    content = _content(relpath, 2**64 - 1, "validation", 7, data=b"pixels")
    assert near_links._half([work_records.encode_near(0, content)], 0, {}) == json.dumps(
        near_duplicates.Member.of(work_records.decode_content(content)))


def _signed(relpath: str, phash: int, thumbnail: bytes, split: str) -> bytes:
    sha = hashlib.sha256(relpath.encode()).digest()
    return work_records.encode_content(Accepted(ImageRef(split, relpath, 0), sha, "", 1, 1, stored_bytes=100,
                                                perceptual_hash=phash, thumbnail=thumbnail), objects=0)


def test_a_bucket_of_many_copies_links_them_to_one_and_finds_the_groups_and_leaks_the_whole_search_finds(tmp_path):
    """A band value holding hundreds of blank frames (one hash, one thumbnail; #56 §1: a million of them were
    5e11 comparisons) links them to one image and compares that one: the same groups and the same leak lines as
    comparing every pair, while frames of that hash with other thumbnails are still compared, not linked."""
    rng = random.Random(7)
    splits = ("train", "validation", "test")
    blank = 1 << 63
    records = [_signed(f"blank{i:04d}.jpg", blank, bytes(64), rng.choice(splits)) for i in range(240)]
    records += [_signed(f"alike{i:04d}.jpg", _flip(blank, rng.sample(range(64), rng.randint(0, 3))),
                        bytes(rng.randrange(256) for _ in range(64)), rng.choice(splits)) for i in range(60)]
    others = [rng.getrandbits(64) for _ in range(150)]
    records += [_signed(f"other{i:04d}.jpg", h, bytes(64), rng.choice(splits)) for i, h in enumerate(others)]
    records += [_signed(f"near{i:04d}.jpg", _flip(h, rng.sample(range(64), rng.randint(0, 3))), bytes(64),
                        rng.choice(splits)) for i, h in enumerate(others[:60])]
    parts = [records[0::2], records[1::2]]
    whole, collapsed = _layout(tmp_path, "whole", parts, 3, 2), _layout(tmp_path, "collapsed", parts, 3, 2)
    for near_range in range(whole.near_ranges):
        near_links.find_pairs(whole, near_range, 3, collapse_over=10**9)
        near_links.find_pairs(collapsed, near_range, 3, collapse_over=16)
    groups = near_groups.components(near_groups._pairs(whole))
    assert any(len(group) >= 240 for group in groups)
    assert near_groups.components(near_groups._pairs(collapsed)) == groups
    leaks = [(tmp_path / layout.near_leaks(r)).read_text() for layout in (whole, collapsed)
             for r in range(whole.near_ranges)]
    assert leaks[:whole.near_ranges] == leaks[whole.near_ranges:]
    assert sum(line.count("\n") for line in leaks[:whole.near_ranges]) > 100
    # what the blank frames' bucket compares: one pair per copy and the pairs of the rest, not 240 * 239 / 2
    ranged = sorted(record for part in range(2) for r in range(collapsed.near_ranges)
                    for record in work_records.read_bucket(collapsed.near(part), work_records.NEAR, r))
    thumbnails = np.frombuffer(work_records.near_thumbnails(ranged), np.uint8).reshape(-1, 64)
    compared = sum(block.shape[1] for block in near_duplicates.pair_indices(ranged, 4, 3, thumbnails=thumbnails,
                                                                            collapse_over=16))
    every = sum(block.shape[1] for block in near_duplicates.pair_indices(ranged, 4, 3))
    assert every > 240 * 239 // 2 > 10 * compared


def test_distance_0_one_band_over_the_whole_key_space_finds_the_images_of_one_hash(tmp_path):
    """``--near-distance 0``: one band of 64 bits, whose key span (2**64) is no uint64; it crashed the search."""
    rng = random.Random(9)
    hashes = [rng.getrandbits(64) for _ in range(40)]
    records = [_content(f"img{i:04d}.jpg", h) for i, h in enumerate(hashes)]
    records += [_content(f"same{i:04d}.jpg", h, split="validation") for i, h in enumerate(hashes[:10])]
    layout = _layout(tmp_path, "d0", [records[0::2], records[1::2]], 0, 2)
    links = sum(near_links.find_pairs(layout, r, 0) for r in range(layout.near_ranges))
    assert links == 10
    groups = near_groups.components(near_groups._pairs(layout))
    assert sorted(sorted(m[2] for m in g) for g in groups) == [[f"img{i:04d}.jpg", f"same{i:04d}.jpg"]
                                                              for i in range(10)]


def test_a_range_read_a_chunk_at_a_time_writes_the_files_of_the_range_read_whole(tmp_path):
    """#56 §1: a band range's task merges the parts' buckets a chunk at a time (memory flat in N, not the range's
    records): its link and leak files are byte for byte those of one chunk holding the whole range, clusters,
    copies across splits and a band value of blank frames (one chunk beyond the size asked) included."""
    rng = random.Random(11)
    records = _planted(11, 400, 30)
    splits = ("train", "validation", "test")
    records += [_signed(f"blank{i:04d}.jpg", 1 << 63, bytes(64), rng.choice(splits)) for i in range(90)]
    records += [_content(f"val{i:04d}.jpg", work_records.decode_content(records[i]).perceptual_hash ^ 1,
                         split=rng.choice(splits[1:])) for i in range(0, 400, 7)]
    parts = [records[i::4] for i in range(4)]
    whole, chunked = _layout(tmp_path, "whole", parts, 3, 2), _layout(tmp_path, "chunked", parts, 3, 2)
    found = 0
    for near_range in range(whole.near_ranges):
        found += near_links.find_pairs(whole, near_range, 3, chunk_records=10**9)
        near_links.find_pairs(chunked, near_range, 3, chunk_records=8, read_bytes=600, oversized=10**9)
        for name in ("near_pairs", "near_leaks"):
            assert (tmp_path / getattr(chunked, name)(near_range)).read_bytes() == \
                (tmp_path / getattr(whole, name)(near_range)).read_bytes()
    assert found > 100 and any((tmp_path / whole.near_leaks(r)).read_text() for r in range(whole.near_ranges))


@pytest.mark.parametrize("bands", [1, 3, 4, 11])
def test_band_ranges_a_whole_number_a_band_never_straddle_two_bands(bands):
    """A band's positions start at ceil(band * 2**64 / bands): with a multiple of ``bands`` buckets, each bucket
    holds one band's values (a range's task then holds an image once), for bands that do not divide 2**64 too."""
    distance = bands - 1
    hashes = np.array([0, 2**64 - 1] + [random.Random(bands).getrandbits(64) for _ in range(200)], dtype=np.uint64)
    positions = near_duplicates.band_positions(hashes, distance)
    span = (1 << 64) // bands
    for ranges_a_band in (1, 5, 64):
        buckets = bands * ranges_a_band
        for band in range(bands):
            column = [int(p) for p in positions[:, band]]
            assert {work_records.bucket_of(p.to_bytes(8, "big"), buckets) // ranges_a_band for p in column} == {band}
            assert {p // span for p in column} == {band}  # the band read back from a position, as the search does
    with pytest.raises(ValueError, match="multiple of near_bands"):
        WorkLayout("w", num_parts=1, buckets={"train": 1}, hash_ranges=1, near_bands=4, near_ranges=6)
