"""An update merges small shards (issue #59: "compaction keeps shard sizes in range"): when a split has two or more
shards whose live records are under half its shard size (earlier updates' new shards, compacted survivors), their
records are copied together into shards of about that size; a lone small shard, and every big one, stays where
it is. Tiny class folders, converted and updated in this process on the in-memory runner.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from PIL import Image

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from beam_jobs.update import shard_moves
from reader.info import dataset_info
from reader.tools import verify
from tests.update_data import assert_unchanged_kept, version_records

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _image(path: str, seed: int) -> None:
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (24, 20), tuple(rng.randrange(256) for _ in range(3))).save(path, quality=90)


def _manifest(out: str) -> dict:
    return dataset_info(out).manifest


def _files(out: str) -> list[str]:
    return [shard["file"] for shard in _manifest(out)["splits"]["train"]["shards"]]


def _check(src: str, out: str, before: dict, changed: set[str]) -> dict:
    """The latest version holds exactly SRC's images with their bytes; unchanged ones keep split and class (and
    their file unless it was compacted or merged away); its tables and records verify."""
    now = version_records(out)
    images = {f"{cls}/{name}": open(os.path.join(src, cls, name), "rb").read()
              for cls in os.listdir(src) for name in os.listdir(os.path.join(src, cls))}
    assert {path: record[3] for path, record in now.items()} == images
    assert all(record[1] == path.split("/")[0] for path, record in now.items())
    assert_unchanged_kept(out, now, before, changed)
    report = verify.verify(out)
    assert report.ok, report.format()
    return now


@pytest.mark.slow  # a conversion and five updates in this process
def test_small_shards_are_merged_and_big_ones_stay(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    for number in range(40):
        _image(os.path.join(src, ("cat", "dog")[number % 2], f"{number}.jpg"), number)
    options = ConvertOptions(src=src, out=out, val_fraction=0.0, near_distance=3, shards=4)
    conversion.run(options, FAST, show_progress=False)
    big = _files(out)
    assert len(big) == 4
    records = version_records(out)

    # Each update's new image makes a shard of its own, a tenth of the others: small.
    _image(os.path.join(src, "cat", "new0.jpg"), 100)
    assert update.run(options, FAST).version == 2
    records = _check(src, out, records, set())
    first_small = [name for name in _files(out) if name not in big]
    assert len(first_small) == 1
    # A lone small shard stays where it is (nothing to merge it with).
    _image(os.path.join(src, "cat", "new1.jpg"), 101)
    done = update.run(options, FAST)
    records = _check(src, out, records, set())
    assert first_small[0] in _files(out) and done.changes["merged_shards"] == 0
    assert len(_files(out)) == 6

    # Two small shards, and a big one that lost 8 of its 10 records (compacted): merged into one shard, in the
    # latest version's order (the compacted survivors first); the three other big shards stay as they are.
    lost = sorted(path for path, record in records.items() if record[2] == big[0])[:8]
    for path in lost:
        os.remove(os.path.join(src, path))
    _image(os.path.join(src, "dog", "new2.jpg"), 102)
    done = update.run(options, FAST)
    now = _check(src, out, records, set())
    assert (done.changes["compacted_shards"], done.changes["merged_shards"], done.changes["recompacted"]) == (1, 2, 4)
    files = _files(out)
    assert files[:3] == big[1:] and len(files) == 5
    merged = files[3]
    assert merged.startswith("versions/00004/compacted/")
    assert sorted(path for path, record in now.items() if record[2] == merged) == sorted(
        [path for path, record in records.items() if record[2] == big[0] and path not in lost]
        + ["cat/new0.jpg", "cat/new1.jpg"])
    assert {path: record[:2] for path, record in version_records(out).items() if path in records} == {
        path: record[:2] for path, record in records.items() if path not in lost}

    # The sources table put each moved image at its new place: a merged image deleted is gone, the rest kept.
    os.remove(os.path.join(src, "cat", "new0.jpg"))
    assert update.run(options, FAST).version == 5
    _check(src, out, now, set())
    assert update.run(options, FAST).version is None  # nothing changed


def test_the_target_size_is_the_median_file_and_a_masked_files_live_share_counts():
    shards = [{"file": f"s{n}", "num_bytes": size, "num_examples": 10} for n, size in enumerate((100, 90, 110, 5))]
    assert shard_moves.target_bytes(shards + [dict(shards[0], live=[[0, 5]])]) == 95.0  # each file once
    masked = {"file": "m", "num_bytes": 100, "num_examples": 3, "file_records": 10, "live": [[0, 2], [7, 1]]}
    assert shard_moves.live_bytes(masked) == 30.0
    assert shard_moves.live_indices(masked).tolist() == [0, 1, 7]
    assert shard_moves.Move("f", 4, shard_moves.live_indices(masked)).index_of(7) == 6
    assert json.dumps(shard_moves.mask(shards[0], [0, 1, 2, 3, 4])["live"]) == "[[0, 5]]"
