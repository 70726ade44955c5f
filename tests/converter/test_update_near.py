"""``--update`` (issue #59): the duplicate searches and ``--drop-leaks`` see the whole new version.

A new validation image that copies a kept training image (re-encoded and resized: a near copy; or byte for
byte) is a leak: reported with its kept partner, and left out with ``--drop-leaks``, as a conversion leaves it
out, and kept out by the next update. A new training image that copies a kept validation image is a leak too:
the kept image stays (an update never drops or moves a kept record), so ``--drop-leaks`` leaves the new training
image out; without it, the pair is reported as a conversion reports a leak (a group across splits). Two
conversions and their updates, in this process, on the in-memory runner; the photos are scikit-image's and
scikit-learn's (tests/photo_data.py).
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from beam_jobs.update import kept_hashes
from record_files import versions
from tests.converter.test_update import FAST, _records
from tests.photo_data import source_photos


def _options(src: str, out: str, drop_leaks: bool = True) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, near_distance=3, drop_leaks=drop_leaks, shards=1)


def _save(image, path: str, side: int, quality: int = 92) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image.resize((side, side * 3 // 4)).save(path, quality=quality)


@pytest.fixture(scope="module")
def updated(tmp_path_factory):
    """Version 1 (train: 6 photos in two classes; validation: 2), then version 2 adding a near copy and a byte
    copy of kept training photos in validation, a near copy and a byte copy of kept validation photos in
    training, and a photo unlike any; then an update that finds nothing changed."""
    root = tmp_path_factory.mktemp("update-near")
    src, out = str(root / "src"), str(root / "out")
    photos = source_photos()
    for i in range(6):
        _save(photos[i], os.path.join(src, "train", "ab"[i % 2], f"p{i}.jpg"), 128)
    for i in (6, 7):
        _save(photos[i], os.path.join(src, "validation", "a", f"q{i}.jpg"), 128)
    conversion.run(_options(src, out), FAST, show_progress=False)
    first = _records(out)

    _save(photos[0], os.path.join(src, "validation", "a", "near_p0.jpg"), 96, quality=70)  # a near copy of p0
    os.makedirs(os.path.join(src, "validation", "b"))
    shutil.copyfile(os.path.join(src, "train", "b", "p1.jpg"), os.path.join(src, "validation", "b", "same_p1.jpg"))
    _save(photos[6], os.path.join(src, "train", "a", "near_q6.jpg"), 96, quality=70)  # a near copy of q6
    shutil.copyfile(os.path.join(src, "validation", "a", "q7.jpg"), os.path.join(src, "train", "b", "same_q7.jpg"))
    _save(photos[8], os.path.join(src, "validation", "b", "new8.jpg"), 128)
    second = update.run(_options(src, out), FAST)
    third = update.run(_options(src, out), FAST)
    return out, first, second, third


@pytest.mark.slow
def test_a_new_validation_copy_of_a_kept_training_image_is_a_leak_dropped(updated):
    out, first, second, _ = updated
    assert second.version == 2
    records = _records(out)
    assert "validation/a/near_p0.jpg" not in records and "validation/b/same_p1.jpg" not in records
    assert records["validation/b/new8.jpg"][0] == "validation"
    dropped = [json.loads(line) for line in open(os.path.join(out, versions.in_version(2, "dropped.jsonl")))]
    assert [(d["path"], d["partner"]["path"], d["partner"]["split"]) for d in dropped] == [
        ("train/a/near_q6.jpg", "validation/a/q6.jpg", "validation"),  # the new training side: see below
        ("train/b/same_q7.jpg", "validation/a/q7.jpg", "validation"),
        ("validation/a/near_p0.jpg", "train/a/p0.jpg", "train"),
        ("validation/b/same_p1.jpg", "train/b/p1.jpg", "train")]
    assert [d["distance"] for d in dropped][1::2] == [0, 0]
    manifest = json.load(open(os.path.join(out, versions.manifest_path(2))))
    assert manifest["duplicates"]["num_dropped"] == 4
    assert "\n  dropped:    4 images copying another split's (--drop-leaks; each with its partner " \
           "in versions/00002/dropped.jsonl)\n" in second.format()  # as a conversion's summary says it


@pytest.mark.slow
def test_a_new_training_copy_of_a_kept_validation_image_is_dropped_and_the_kept_image_stays(updated):
    """The kept validation image is in a reused shard (it cannot move or go): the new training copy goes."""
    out, first, _, _ = updated
    records = _records(out)
    assert "train/a/near_q6.jpg" not in records and "train/b/same_q7.jpg" not in records
    assert all(records[path] == place for path, place in first.items())  # every kept record where it was
    groups = [json.loads(line) for line in open(os.path.join(out, versions.in_version(2, "duplicates.jsonl")))]
    near = [sorted(image["path"] for image in group["images"]) for group in groups if group["kind"] == "near"]
    assert ["train/a/near_q6.jpg", "validation/a/q6.jpg"] in near  # the dropped leaks' groups are reported
    assert ["train/a/p0.jpg", "validation/a/near_p0.jpg"] in near
    # No group of kept images alone: version 1 searched them with their thumbnails.
    assert all(any(path not in first for path in group) for group in near)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """Without --drop-leaks: version 1 (a training photo and two validation ones), then a near copy of one
    validation photo and a byte copy of the other added in training."""
    root = tmp_path_factory.mktemp("update-near-reported")
    src, out = str(root / "src"), str(root / "out")
    photos = source_photos()
    _save(photos[0], os.path.join(src, "train", "a", "p0.jpg"), 128)
    for i in (6, 7):
        _save(photos[i], os.path.join(src, "validation", "a", f"q{i}.jpg"), 128)
    conversion.run(_options(src, out, drop_leaks=False), FAST, show_progress=False)
    _save(photos[6], os.path.join(src, "train", "a", "near_q6.jpg"), 96, quality=70)
    shutil.copyfile(os.path.join(src, "validation", "a", "q7.jpg"), os.path.join(src, "train", "a", "same_q7.jpg"))
    update.run(_options(src, out, drop_leaks=False), FAST)
    return out


@pytest.mark.slow
def test_without_drop_leaks_a_new_training_copy_of_a_kept_validation_image_is_reported_as_a_leak(reported):
    records = _records(reported)
    assert {"train/a/near_q6.jpg", "train/a/same_q7.jpg", "validation/a/q6.jpg", "validation/a/q7.jpg"} <= set(records)
    duplicates = json.load(open(os.path.join(reported, versions.manifest_path(2))))["duplicates"]
    assert duplicates["num_cross_split"] == 1 and duplicates["num_dropped"] == 0
    assert [[image["path"] for image in group] for group in duplicates["cross_split"]] == [
        ["train/a/same_q7.jpg", "validation/a/q7.jpg"]]
    assert duplicates["num_near_cross_split"] == 1
    assert sorted(image["path"] for image in duplicates["near_cross_split"][0]["images"]) == [
        "train/a/near_q6.jpg", "validation/a/q6.jpg"]


@pytest.mark.slow
def test_the_next_update_keeps_the_leaks_out(updated):
    out, _, _, third = updated
    assert third.version is None  # the dropped images are unchanged: nothing to do, not converted back


def test_feeding_a_kept_record_reads_its_table_row_only(tmp_path):
    """The cost of a kept record in the search: its CONTENT and NEAR records from its table row, no image byte
    (a table of 20,000 rows written here, no shard at all)."""
    import numpy as np
    import pyarrow as pa

    from beam_jobs.files import work_layout
    from record_files import records_table
    from record_files.record_stats import SplitStats

    n = 20000
    rng = np.random.default_rng(5)
    table = tmp_path / "train.records.parquet"
    rows = pa.table({"shard": np.zeros(n, np.uint32), "index": np.arange(n, dtype=np.uint32),
                     "offset": np.zeros(n, np.uint64), "classes": pa.array([[i % 3] for i in range(n)]),
                     "width": np.full(n, 8, np.uint32), "height": np.full(n, 8, np.uint32),
                     "image_bytes": np.full(n, 100, np.uint32), "sha256": [rng.bytes(32) for _ in range(n)],
                     "perceptual_hash": rng.integers(0, 2**63, n).astype(np.uint64),
                     "path": [f"train/c/{i}.jpg" for i in range(n)]}).cast(records_table.SCHEMA)
    with open(table, "wb") as handle:
        records_table.write_groups([rows], handle, "train",
                                   lambda: SplitStats("train"))
    manifest = {"splits": {"train": {"shards": [{"file": "train-00000-of-00001.tfrecord"}],
                                     "records_table": {"file": table.name}}}}
    kept = kept_hashes.KeptRecords(str(tmp_path), manifest, frozenset({"train-00000-of-00001.tfrecord"}), {}, n)
    layout = work_layout.plan_layout(str(tmp_path / "work"), {"train": 10}, 64, 4, kept.count, kept.chunk)
    started = time.process_time()
    assert kept.write(layout) == n
    per_record = (time.process_time() - started) / n
    assert layout.kept_parts == 2 and per_record < 200e-6, per_record
    print(f"kept record fed to the searches: {per_record * 1e6:.1f} us of CPU")


@pytest.mark.parametrize("chunk", [1 << 14, 1], ids=["ranges", "blocks"])
def test_a_kept_record_pairs_by_its_hash_alone_is_never_the_leaked_side_and_two_kept_are_not_paired_again(
        tmp_path, chunk):
    """The searches' rule for kept records, on work files alone (no conversion): a new validation image near a
    kept training one is a leak though its thumbnail (a kept record has none) would not match; a kept
    validation image near a new training one is grouped and never the leaked side: the new training image is
    (a kept record cannot move or go); two kept records near each other are not
    paired again (their version searched them with thumbnails). The same in a band range's task and in the
    block tasks of band values spilled (``chunk`` 1: every value of more than one record)."""
    import hashlib
    import random

    from beam_jobs.files import work_records
    from beam_jobs.files.work_layout import WorkLayout
    from beam_jobs.stage_records import Accepted, ImageRef
    from beam_jobs.stages import near_blocks, near_duplicates, near_groups, near_links
    from tests.beam_jobs.stages.near_data import flip

    rng = random.Random(3)
    h, g = rng.getrandbits(64), rng.getrandbits(64)

    def new(path: str, phash: int) -> bytes:
        return work_records.encode_content(Accepted(
            ImageRef(path.split("/")[0], path, 0), hashlib.sha256(path.encode()).digest(), "", 1, 1, stored_bytes=9,
            perceptual_hash=phash, thumbnail=bytes(rng.randrange(256) for _ in range(64))))

    def kept(path: str, phash: int) -> bytes:
        return work_records.encode_kept_content(hashlib.sha256(path.encode()).digest(), path.split("/")[0], 0, phash,
                                                9, 0, path)

    parts = [new("validation/v.jpg", flip(h, (30, 40))), new("train/n.jpg", flip(g, (5,)))]
    kept_records = [kept("train/k.jpg", h), kept("validation/k2.jpg", g), kept("validation/k3.jpg", flip(h, (10, 20)))]
    layout = WorkLayout(str(tmp_path / "work"), num_parts=1, buckets={"train": 1, "validation": 1}, hash_ranges=1,
                        near_bands=4, near_ranges=4, kept_parts=1)
    for folder in layout.folders():
        os.makedirs(folder)
    for path, records in ((layout.near(0), parts), (layout.near_kept(0), kept_records)):
        work_records.write_file(path, work_records.NEAR, near_duplicates.near_records(sorted(records), 3), 4)
    for near_range in range(4):
        near_links.find_pairs(layout, near_range, 3, chunk_records=chunk)
    values = [value for near_range in range(4) for value in near_blocks.values(near_range, layout)]
    assert bool(values) == (chunk == 1)
    for value in values:
        for block in range(value.blocks):
            near_blocks.search_block((value, block), layout, 3)
    groups = [[member.path for member in group]
              for group in near_groups.components(near_groups._pairs(layout, sorted(values)))]
    assert sorted(groups) == [["train/k.jpg", "validation/v.jpg"], ["train/n.jpg", "validation/k2.jpg"]]
    near_groups.group_near(layout, 3, ["c"], values=sorted(values))
    leaks = json.loads(open(layout.near_dropped()).read())
    assert [(member[2], partner[2]) for member, partner, _ in leaks] == [
        ("train/n.jpg", "validation/k2.jpg"), ("validation/v.jpg", "train/k.jpg")]


def test_the_exact_search_drops_the_new_copy_of_a_kept_image_whichever_split_each_is_in(tmp_path):
    """The exact search's rule for kept records, on work files alone: a new validation copy of a kept training
    image and a new training copy of a kept validation image are both the dropped side (the kept images stay:
    they are in reused shards); two kept copies across splits are neither reported again nor dropped."""
    import hashlib

    from beam_jobs.files import work_records
    from beam_jobs.files.work_layout import WorkLayout
    from beam_jobs.stage_records import Accepted, ImageRef
    from beam_jobs.stages import merge_reports

    def sha(name: str) -> bytes:
        return hashlib.sha256(name.encode()).digest()

    def new(path: str, content: str) -> bytes:
        return work_records.encode_content(Accepted(ImageRef(path.split("/")[0], path, 0), sha(content), "", 1, 1,
                                                    stored_bytes=9))

    def kept(path: str, content: str) -> bytes:
        return work_records.encode_kept_content(sha(content), path.split("/")[0], 0, None, 9, 0, path)

    layout = WorkLayout(str(tmp_path / "work"), num_parts=1, buckets={"train": 1, "validation": 1}, hash_ranges=1,
                        kept_parts=1)
    for folder in layout.folders():
        os.makedirs(folder, exist_ok=True)
    work_records.write_file(layout.content(0), work_records.CONTENT,
                            sorted([new("validation/v.jpg", "x"), new("train/n.jpg", "y")]), 1)
    work_records.write_file(layout.content_kept(0), work_records.CONTENT, sorted(
        [kept("train/k.jpg", "x"), kept("validation/k2.jpg", "y"), kept("train/k3.jpg", "z"),
         kept("validation/k4.jpg", "z")]), 1)
    summary = merge_reports.find_duplicates(layout, 0, ["c"])
    assert summary.num_groups == summary.num_cross_split == 2  # not the kept pair k3, k4
    leaks = json.loads(open(layout.duplicates_dropped(0)).read())
    assert sorted((member[2], partner[2]) for member, partner, _ in leaks) == [
        ("train/n.jpg", "validation/k2.jpg"), ("validation/v.jpg", "train/k.jpg")]
