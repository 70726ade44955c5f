"""Record indexes speed starts inside a shard up and never break reading.

A dataset copied without its ``.idx`` files (``cp *.tfrecord``, ``aws s3 sync
--exclude``), or with one cut short or overwritten, builds and trains: the
same batches as the intact dataset, from the start and from a step
mid-epoch, with one warning that names the rebuild command; that command
(``python -m converter reindex``) puts the indexes back.

``demo_dataset``'s train split: 72 records in 4 shards of 18; at a batch of
8 there are 8 streams of 9 records, so streams start inside shards.
"""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

import reader
from tests.conftest import run_converter
from tests.reader.test_resume import BATCH, WINDOWED, _global_batches, _same

STEPS = 10  # epoch 0 and into epoch 1: every stream starts inside a shard at least once


def _damage(folder, how: str) -> None:
    indexes = sorted(f for f in os.listdir(folder) if f.startswith("train-") and f.endswith(".idx"))
    if how == "all missing":
        for name in indexes:
            os.remove(os.path.join(folder, name))
    elif how == "one missing":
        os.remove(os.path.join(folder, indexes[1]))
    elif how == "one truncated":
        path = os.path.join(folder, indexes[1])
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])
    elif how == "garbage":
        for name in indexes:  # overwritten by another file (same-size damage: the next test)
            open(os.path.join(folder, name), "wb").write(np.random.default_rng(5).integers(0, 256, 100, np.uint8))
    else:
        raise AssertionError(how)


@pytest.fixture(scope="module")
def intact(demo_dataset):
    return {"start": _global_batches(demo_dataset, STEPS, options=WINDOWED),
            "mid-epoch": _global_batches(demo_dataset, 3, 2, options=WINDOWED, start=5)}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["all missing", "one missing", "one truncated", "garbage"])
def test_a_copy_with_lost_or_damaged_indexes_trains_on_the_same_batches_and_warns_once(
        demo_dataset, intact, tmp_path, caplog, how):
    copy = tmp_path / "copy"
    shutil.copytree(demo_dataset, copy)
    _damage(copy, how)
    with caplog.at_level(logging.WARNING, logger="reader"):
        assert _same(_global_batches(str(copy), STEPS, options=WINDOWED), intact["start"])
        assert _same(_global_batches(str(copy), 3, 2, options=WINDOWED, start=5), intact["mid-epoch"])
        unseeded = reader.build_dataset(str(copy), batch_size=BATCH, image_size=16, seed=None, options=WINDOWED)
        labels = np.concatenate([label.numpy() for _, label in unseeded.take(9)])  # one whole epoch
    assert sorted(labels) == sorted(np.concatenate([label for _, label in intact["start"][:9]]))
    warnings = [r.getMessage() for r in caplog.records if "no usable record index" in r.getMessage()]
    assert warnings, caplog.text
    expected = {"all missing": "4 missing", "one missing": "1 missing", "one truncated": "1 damaged",
                "garbage": "4 damaged"}[how]
    assert f"({expected};" in warnings[0] and f"python -m converter reindex {copy}" in warnings[0]
    assert len(set(warnings)) == 1  # once per pipeline built, the same words


def test_a_consistent_looking_but_wrong_index_is_read_through_when_read(demo_dataset, intact, tmp_path):
    """An index of the right size whose lines do not chain (hand-edited, bit-rotted): the listing cannot tell,
    so it is caught as it is read, and the shard read through (no warning: that check runs in the graph)."""
    copy = tmp_path / "copy"
    shutil.copytree(demo_dataset, copy)
    for name in os.listdir(copy):
        if name.endswith(".idx"):
            path = copy / name
            lines = path.read_text().splitlines(keepends=True)
            swapped = lines[:8] + [lines[9], lines[8]] + lines[10:]  # same bytes; record 9 would start at 8
            path.write_text("".join(swapped))
    assert _same(_global_batches(str(copy), STEPS, options=WINDOWED), intact["start"])


@pytest.mark.e2e
def test_reindex_rebuilds_missing_and_damaged_indexes_from_the_shards_and_verify_then_passes(demo_dataset, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(demo_dataset, copy)
    originals = {name: (copy / name).read_bytes() for name in os.listdir(copy) if name.endswith(".idx")}
    _damage(copy, "one missing")
    (copy / sorted(originals)[0]).write_bytes(b"garbage")
    broken = run_converter("verify", str(copy))
    assert broken.returncode == 1 and "record index" in broken.stdout
    assert f"python -m converter reindex {copy}" in broken.stdout

    fixed = run_converter("reindex", str(copy), check=True)
    assert fixed.stdout.startswith(f"rebuilt 2 record indexes, {len(originals) - 2} intact"), fixed.stdout
    assert {name: (copy / name).read_bytes() for name in originals} == originals
    run_converter("verify", str(copy), check=True)

    (copy / "train-00000-of-00004.tfrecord").write_bytes(b"not the shard")  # never index another file
    os.remove(copy / "train-00000-of-00004.tfrecord.idx")
    refused = run_converter("reindex", str(copy))
    assert refused.returncode == 1 and "not rebuilt" in refused.stdout and "the manifest says" in refused.stdout
    assert not (copy / "train-00000-of-00004.tfrecord.idx").exists()
