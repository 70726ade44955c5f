"""The work-file format: records round-trip, raw bytes sort in output order, buckets are key ranges."""

from __future__ import annotations

import hashlib
import os
import random

import pytest

from beam_jobs.files import work_records
from beam_jobs.planning.carve import keyed_hash
from beam_jobs.stage_records import Accepted, ImageRef


def _accepted(relpath: str, split: str = "train", label: int = 3, spill: tuple = ()) -> Accepted:
    return Accepted(ImageRef(split, relpath, label), hashlib.sha256(relpath.encode("utf-8", "surrogatepass")).digest(),
                    "png" if spill else "", 480, 640, spill, 1)


def test_every_kind_of_record_round_trips_including_names_that_are_not_utf8():
    odd = "caf\udce9/x.jpg"  # a non-UTF-8 byte, as os.scandir lists it
    for relpath in ("a/b.jpg", "ünï/çødé.jpg", odd):
        ref = ImageRef("validation", relpath, 70_000)
        assert work_records.decode_listed(work_records.encode_listed(ref)) == ref
        item = _accepted(relpath, "test", 5, spill=(12, 1 << 40, 999))
        record = work_records.encode_accepted(keyed_hash(1, relpath), item)
        assert work_records.decode_accepted(record, "test") == item
        content = work_records.decode_content(work_records.encode_content(item))
        assert content == (item.source_sha256[:16], "test", 5, relpath, None, 0, 0, bytes(64), False)  # no thumbnail, not kept
        thumbnail = bytes(range(1, 65))
        hashed = item._replace(perceptual_hash=(1 << 64) - 1, stored_bytes=1 << 33, thumbnail=thumbnail)
        content = work_records.decode_content(work_records.encode_content(hashed, objects=7))
        assert content == (item.source_sha256[:16], "test", 5, relpath, (1 << 64) - 1, 1 << 33, 7, thumbnail, False)
        near = work_records.encode_near(1 << 63, work_records.encode_content(hashed._replace(perceptual_hash=0), 7))
        assert work_records.decode_near(near) == (1 << 63, content._replace(perceptual_hash=0))
        assert work_records.near_thumbnails([near, near]) == thumbnail * 2  # read in place, for numpy
        key = keyed_hash(1, relpath)
        assert work_records.encode_dropped(key, relpath) == work_records.accepted_prefix(
            work_records.encode_accepted(key, item))
    plain = _accepted("a.jpg")
    assert work_records.decode_accepted(work_records.encode_accepted(b"k" * 16, plain), "train").spill == ()


def test_raw_bytes_sort_by_keyed_hash_then_path_which_is_the_output_order():
    paths = [f"c{i % 7}/{i:05d}.jpg" for i in range(2000)] + ["a", "a/b", "ab"]
    records = [work_records.encode_accepted(keyed_hash(9, p), _accepted(p)) for p in paths]
    ordered = [work_records.decode_accepted(r, "train").ref.relpath for r in sorted(records)]
    assert ordered == sorted(paths, key=lambda p: (keyed_hash(9, p), p))
    # A tie on the hash is broken by the path, a prefix first (as str ordering does).
    tied = sorted([work_records.encode_accepted(b"\0" * 16, _accepted(p)) for p in ("ab", "a", "a/b")])
    assert [work_records.decode_accepted(r, "train").ref.relpath for r in tied] == ["a", "a/b", "ab"]


@pytest.mark.parametrize("buckets", [1, 2, 7, 64])
def test_a_bucket_of_a_sorted_file_holds_exactly_the_records_whose_key_falls_in_its_range(tmp_path, buckets):
    rng = random.Random(buckets)
    records = sorted(rng.randbytes(16) + rng.randbytes(rng.randrange(0, 40)) for _ in range(500))
    path = str(tmp_path / "run")
    counts = work_records.write_file(path, work_records.ACCEPTED, records, buckets)
    assert sum(counts) == 500 and len(counts) == buckets
    got = [work_records.read_bucket(path, work_records.ACCEPTED, b) for b in range(buckets)]
    assert [len(g) for g in got] == counts
    assert [r for g in got for r in g] == records
    for bucket, members in enumerate(got):
        assert all(work_records.bucket_of(r, buckets) == bucket for r in members)
    assert list(work_records.iter_file(path, work_records.ACCEPTED, chunk_bytes=7)) == records
    assert work_records.read_all(path, work_records.ACCEPTED) == records
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]


def test_empty_files_and_empty_buckets_read_as_empty(tmp_path):
    path = str(tmp_path / "empty")
    assert work_records.write_file(path, work_records.CONTENT, [], 5) == [0] * 5
    assert work_records.read_bucket(path, work_records.CONTENT, 4) == []
    assert list(work_records.iter_file(path, work_records.CONTENT)) == []
    listed = str(tmp_path / "listed")
    work_records.write_file(listed, work_records.LISTED, [])
    assert work_records.read_all(listed, work_records.LISTED) == []


def test_a_file_of_another_kind_version_or_a_truncated_one_is_refused(tmp_path):
    path = str(tmp_path / "run")
    work_records.write_file(path, work_records.ACCEPTED, [b"k" * 16 + b"x"], 1)
    with pytest.raises(work_records.WorkFileError, match="kind"):
        work_records.read_all(path, work_records.CONTENT)
    data = open(path, "rb").read()
    open(path, "wb").write(data.replace(bytes([work_records.VERSION]), bytes([work_records.VERSION + 1]), 1))
    with pytest.raises(work_records.WorkFileError, match="another release"):
        work_records.read_bucket(path, work_records.ACCEPTED, 0)
    open(path, "wb").write(data[:-3])
    with pytest.raises(work_records.WorkFileError, match="truncated"):
        list(work_records.iter_file(path, work_records.ACCEPTED))


def test_a_path_with_a_nul_character_is_refused_by_name():
    with pytest.raises(ValueError, match="NUL"):
        work_records.encode_listed(ImageRef("train", "a\0b.jpg", 0))


def test_an_accepted_record_keeps_the_files_stamp_and_no_stamp_reads_as_none():
    item = _accepted("a/b.jpg")._replace(stamp=bytes(range(1, 17)))
    record = work_records.encode_accepted(b"k" * 16, item)
    assert work_records.decode_accepted(record, "train") == item
    assert work_records.decode_accepted(work_records.encode_accepted(b"k" * 16, item._replace(stamp=b"")),
                                        "train").stamp == b""


def test_a_file_written_in_several_chunks_has_every_record_and_bucket_where_it_was(tmp_path):
    rng = random.Random(5)  # ~3 MB of records: several of write_file's 1 MB chunks, buckets across their seams
    records = sorted(rng.randbytes(16) + rng.randbytes(rng.randrange(0, 3000)) for _ in range(2000))
    path = str(tmp_path / "big")
    counts = work_records.write_file(path, work_records.ACCEPTED, records, 16)
    assert work_records.read_all(path, work_records.ACCEPTED) == records
    assert list(work_records.iter_file(path, work_records.ACCEPTED)) == records
    by_bucket = [work_records.read_bucket(path, work_records.ACCEPTED, b) for b in range(16)]
    assert [len(got) for got in by_bucket] == counts and sum(by_bucket, []) == records
    assert all(work_records.bucket_of(r, 16) == b for b, got in enumerate(by_bucket) for r in got)
