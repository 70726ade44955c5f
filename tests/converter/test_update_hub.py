"""``--update`` of the Hub's Parquet (issue #59): a row's identity is its record's name (its image path where the
dataset writes one), its stamp its Parquet file's (size, modification time): an unchanged file's rows are not
read; a changed file's rows are compared by their cells' bytes (beam_jobs/sources/source_stamps.py), and their
labels by class name, as a label file's.

The rule of tests/converter/test_update.py: after rows are added, changed (bytes, label) and deleted, the latest
version holds exactly SRC's rows; every unchanged row keeps its split, id and shard file; nothing changed writes
no version; the updated version holds what a fresh conversion of the new SRC holds, record by record. SRC is a
snapshot of ``data/{split}-*.parquet`` written by ``datasets``, converted once for the module.
"""

from __future__ import annotations

import os
import shutil

import pytest

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.files import version_store
from beam_jobs.options import ConvertOptions
from beam_jobs.update import checks
from beam_jobs.update.checks import UpdateRefusedError
from tests.converter.test_update import FAST
from tests.hub_data import NAMES, photo, rows, write_split
from tests.update_data import assert_unchanged_kept
from tests.update_data import version_records as _records


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, near_distance=3, shards=2)


def _expected(splits: dict) -> dict[str, tuple[str, str, bytes]]:
    return {f"{split}/{cell['path']}": (split, NAMES[label], cell["bytes"])
            for split, columns in splits.items() for cell, label in zip(columns["image"], columns["labels"])}


def _check(out: str, splits: dict, before: dict, changed: set[str]) -> dict:
    """The latest version holds exactly SRC's rows (split, class, bytes); each unchanged one keeps its shard file
    (unless that shard was compacted)."""
    now = _records(out)
    assert {path: (split, cls, data) for path, (split, cls, _, data) in now.items()} == _expected(splits)
    assert_unchanged_kept(out, now, before, changed)
    return now


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[str, dict, dict]:
    """``(root holding src and out, the splits' columns, records)``: train in two Parquet files, validation in one."""
    root = str(tmp_path_factory.mktemp("hub"))
    splits = {"train": rows(12, 0), "validation": rows(4, 100)}
    for split, columns in splits.items():
        write_split(os.path.join(root, "src", "data"), split, columns, shards=2 if split == "train" else 1)
    conversion.run(_options(os.path.join(root, "src"), os.path.join(root, "out")), FAST, show_progress=False)
    return root, splits, _check(os.path.join(root, "out"), splits, {}, set())


@pytest.mark.slow
def test_rows_added_changed_relabelled_and_deleted_update_and_match_a_fresh_conversion(converted, tmp_path):
    root, splits, first = converted
    shutil.copytree(os.path.join(root, "src"), tmp_path / "src", copy_function=shutil.copy2)  # stamps kept
    shutil.copytree(os.path.join(root, "out"), tmp_path / "out")
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    assert update.run(_options(src, out), FAST).version is None  # nothing changed

    # The second train file written anew (the first left as it was: its rows are not read): img_0007's bytes
    # changed, img_0008 relabelled, img_0011 deleted, img_0050 added; rows 6, 9, 10 the same bytes and labels.
    train = {"image": list(splits["train"]["image"]), "labels": list(splits["train"]["labels"])}
    train["image"][7] = {"bytes": photo(907), "path": "img_0007.jpg"}
    train["labels"][8] = (train["labels"][8] + 1) % len(NAMES)
    train["image"][11], train["labels"][11] = {"bytes": photo(50), "path": "img_0050.jpg"}, 2
    fresh_files = str(tmp_path / "written")
    write_split(fresh_files, "train", train, shards=2)
    first_file = os.path.join(src, "data", "train-00000-of-00002.parquet")
    with open(first_file, "rb") as kept, open(os.path.join(fresh_files, "train-00000-of-00002.parquet"), "rb") as new:
        assert kept.read() == new.read()  # the same rows write the same file: left alone, its stamp kept
    shutil.copy(os.path.join(fresh_files, "train-00001-of-00002.parquet"), os.path.join(src, "data"))
    splits = dict(splits, train=train)
    done = update.run(_options(src, out), FAST)
    assert (done.version, done.changes["added"], done.changes["changed"], done.changes["relabelled"],
            done.changes["deleted"]) == (2, 1, 2, 1, 1)
    _check(out, splits, first, {"train/img_0007.jpg", "train/img_0008.jpg"})

    assert update.run(_options(src, out), FAST).version is None
    os.utime(first_file)  # a file touched, not changed: its rows' cells are read, and are the same
    assert update.run(_options(src, out), FAST).version is None

    fresh = str(tmp_path / "fresh")
    conversion.run(_options(src, fresh), FAST, show_progress=False)
    assert {p: r[:2] + r[3:] for p, r in _records(out).items()} == {p: r[:2] + r[3:] for p, r in _records(fresh).items()}


@pytest.mark.slow
def test_a_split_named_by_paths_then_by_row_numbers_is_refused_and_the_version_kept(converted, tmp_path):
    """A new row repeating an existing path names the whole split by row numbers (the review's H1): every row would
    be deleted and added again, so the update refuses, naming the split and the way that works."""
    root, _, _ = converted
    shutil.copytree(os.path.join(root, "src"), tmp_path / "src", copy_function=shutil.copy2)
    shutil.copytree(os.path.join(root, "out"), tmp_path / "out")
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    extra = {"image": [{"bytes": photo(555), "path": "img_0001.jpg"}], "labels": [1]}
    written = write_split(str(tmp_path / "extra"), "train", extra)
    shutil.copy(written[0], os.path.join(src, "data", "train-extra.parquet"))
    with pytest.raises(UpdateRefusedError, match=r"the train split of .* by their row numbers .* version 1 .* by "
                                                 r"their image paths .*--overwrite"):
        update.run(_options(src, out), FAST)
    assert version_store.latest_number(out) == 1
    latest = version_store.read(out, 1)  # a version whose manifest does not say: read from its sources table
    assert checks._names_in_table(out, latest, {"train": "", "test": ""}) == {"train": "paths"}


@pytest.mark.slow
def test_rows_named_by_number_under_val_fraction_are_refused_after_a_row_is_deleted(tmp_path):
    """Rows without paths are named by number: with --val-fraction one row deleted would rename every later row and
    move training photos to validation (the review's H2). Refused before any comparison, the version kept."""
    columns = rows(6, 0)
    columns["image"] = [{"bytes": cell["bytes"], "path": None} for cell in columns["image"]]
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    write_split(os.path.join(src, "data"), "train", columns)
    options = ConvertOptions(src=src, out=out, shards=1, val_fraction=0.25)
    conversion.run(options, FAST, show_progress=False)
    shutil.rmtree(os.path.join(src, "data"))
    write_split(os.path.join(src, "data"), "train", {key: values[:2] + values[3:] for key, values in columns.items()})
    with pytest.raises(UpdateRefusedError, match=r"the train split .* row numbers .*--val-fraction.*--overwrite"):
        update.run(options, FAST)
    assert version_store.latest_number(out) == 1
    assert checks._names_in_table(out, version_store.read(out, 1), {"train": ""}) == {"train": "rows"}
