"""Hugging Face datasets as they ship convert with the Hub's label ids and their images' bytes passed through.

Each test writes Parquet with ``datasets`` itself (``tests/hub_data.py``: the
Image and ClassLabel features as the Hub stores them), converts it in-process,
and compares the records with the rows.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import TooManyRejectedError, run
from beam_jobs.planning.discover import InputError
from tests import hub_data
from tests.conftest import read_records

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _convert(src, out, **options) -> dict:
    run(ConvertOptions(src=str(src), out=str(out), shards=2, overwrite=True, **options), FAST, show_progress=False)
    return json.loads((out / "manifest.json").read_text())


def _records(out) -> dict[str, dict]:
    return {r["image/filename"].decode(): r for path in sorted(glob.glob(str(out / "*.tfrecord")))
            for r in read_records(path)}


def _rejected(out) -> dict[str, str]:
    lines = (out / "rejected.jsonl").read_text().splitlines()
    return {json.loads(line)["path"]: json.loads(line)["reason"] for line in lines}


def _shards(out) -> dict[str, str]:
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in sorted(glob.glob(str(out / "*.tfrecord")))}


@pytest.mark.slow
def test_a_hub_snapshot_keeps_the_hubs_label_ids_and_passes_the_jpeg_bytes_through(tmp_path):
    splits = hub_data.hub_snapshot(str(tmp_path / "snapshot"))
    manifest = _convert(tmp_path / "snapshot", tmp_path / "out")
    assert (tmp_path / "out" / "labels.txt").read_text() == "zebra\nant\nmole\n"  # ClassLabel order, not sorted
    assert {name: split["num_examples"] for name, split in manifest["splits"].items()} == \
        {"train": 30, "validation": 9, "test": 6}
    records = _records(tmp_path / "out")
    for split, columns in splits.items():
        for cell, label in zip(columns["image"], columns["labels"]):
            record = records[f"{split}/{cell['path']}"]
            assert record["image/encoded"] == cell["bytes"]  # byte for byte
            assert record["image/class/label"] == label
            assert record["image/class/text"].decode() == hub_data.NAMES[label]
    assert sum(split["num_reencoded"] for split in manifest["splits"].values()) == 0
    assert sorted(manifest["source_parquet"]["files"]) == ["data/test-00000-of-00001.parquet",
                                                           "data/train-00000-of-00002.parquet",
                                                           "data/train-00001-of-00002.parquet",
                                                           "data/validation-00000-of-00001.parquet"]
    assert manifest["source_parquet"]["revision"] is None and "source_archives" not in manifest


def test_a_snapshot_in_the_hf_cache_records_its_revision_and_inspect_shows_it(tmp_path):
    from reader.tools.inspect import summarize

    sha = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "datasets--someone--beans" / "snapshots" / sha
    hub_data.hub_snapshot(str(snapshot))
    manifest = _convert(snapshot, tmp_path / "out")
    assert manifest["source_parquet"]["revision"] == sha
    assert f"converted from a Hugging Face dataset at revision {sha}: 4 Parquet files (" in \
        summarize(str(tmp_path / "out"))


def test_the_same_rows_cut_into_other_files_give_the_same_bytes(tmp_path):
    hub_data.hub_snapshot(str(tmp_path / "two"), train_shards=2)
    hub_data.hub_snapshot(str(tmp_path / "three"), train_shards=3)
    _convert(tmp_path / "two", tmp_path / "out-two")
    _convert(tmp_path / "three", tmp_path / "out-three")
    assert _shards(tmp_path / "out-two") == _shards(tmp_path / "out-three")


@pytest.mark.slow
def test_the_same_images_as_class_folders_give_the_same_labels_and_bytes(tmp_path):
    columns = hub_data.rows(24, 0)
    hub_data.write_split(str(tmp_path / "snapshot" / "data"), "train", columns)
    for cell, label in zip(columns["image"], columns["labels"]):
        folder = tmp_path / "folders" / hub_data.NAMES[label]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / cell["path"]).write_bytes(cell["bytes"])
    (tmp_path / "labels.txt").write_text("\n".join(hub_data.NAMES) + "\n")
    _convert(tmp_path / "snapshot", tmp_path / "from-parquet")
    _convert(tmp_path / "folders", tmp_path / "from-folders", labels_file=str(tmp_path / "labels.txt"))

    def content(out):
        return sorted((hashlib.sha256(r["image/encoded"]).hexdigest(), r["image/class/label"])
                      for r in _records(out).values())
    assert content(tmp_path / "from-parquet") == content(tmp_path / "from-folders")


def test_a_config_folder_with_another_image_column_and_png_cells(tmp_path):
    src = tmp_path / "snapshot"
    hub_data.write_split(str(src / "plain_text"), "train", hub_data.rows(12, 0, "PNG"), image_column="img")
    hub_data.write_split(str(src / "other"), "train", hub_data.rows(6, 50), image_column="img")
    with pytest.raises(InputError, match=r"several configs \['other', 'plain_text'\]: pick one with --config"):
        _convert(src, tmp_path / "out")
    manifest = _convert(src, tmp_path / "out", config="plain_text")
    assert manifest["splits"]["train"]["num_examples"] == 12
    assert manifest["splits"]["train"]["num_reencoded"] == 12  # PNG cells become JPEGs
    assert all(r["image/format"] == b"jpeg" for r in _records(tmp_path / "out").values())
    with pytest.raises(InputError, match="--config 'nope'.*its configs are"):
        _convert(src, tmp_path / "out", config="nope")


@pytest.mark.slow
def test_a_plain_pyarrow_file_with_text_labels_sorts_its_classes(tmp_path):
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"picture": pa.array([{"bytes": hub_data.photo(i), "path": None} for i in range(8)], image),
                      "kind": ["dog", "cat"] * 4})
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=3)
    with pytest.raises(InputError, match="no ClassLabel column.*picture.*kind.*--label-column"):
        _convert(tmp_path / "train.parquet", tmp_path / "out")
    manifest = _convert(tmp_path / "train.parquet", tmp_path / "out", label_column="kind")
    assert manifest["classes"] == ["cat", "dog"] and manifest["splits"]["train"]["num_examples"] == 8
    # No paths: each row is named by its split and its number in the split.
    assert sorted(_records(tmp_path / "out")) == [f"train/{i:09d}" for i in range(8)]


def test_bad_rows_and_a_damaged_file_cost_only_themselves(tmp_path):
    src = tmp_path / "snapshot" / "data"
    hub_data.write_split(str(src), "train", hub_data.rows(12, 0))
    written = hub_data.write_split(str(src), "validation", hub_data.rows(6, 50))[0]
    table = pq.read_table(written)
    rows = table.to_pylist()
    rows[0]["image"] = {"bytes": None, "path": "beside.jpg"}  # datasets' local files: read from beside the file
    (src / "beside.jpg").write_bytes(hub_data.photo(99))
    rows[1]["image"] = {"bytes": None, "path": "gone.jpg"}
    rows[2]["image"] = {"bytes": b"just some text, no image", "path": "text.jpg"}
    rows[3]["labels"] = -1  # datasets' "no label"
    rows[4]["labels"] = 7  # past the three ClassLabel names
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), written)  # the Hub's schema and metadata
    cut = hub_data.write_split(str(tmp_path / "cut"), "test", hub_data.rows(6, 80))[0]
    data = open(cut, "rb").read()
    (src / "test-00000-of-00001.parquet").write_bytes(data[:len(data) // 2])  # cut short: its footer is gone
    manifest = _convert(tmp_path / "snapshot", tmp_path / "out", max_bad_fraction=0.5)
    assert manifest["splits"]["train"]["num_examples"] == 12
    assert manifest["splits"]["validation"]["num_examples"] == 2
    assert _rejected(tmp_path / "out") == {
        "validation/gone.jpg": "missing-image", "validation/text.jpg": "not-an-image",
        "validation/img_0053.jpg": "missing-label", "validation/img_0054.jpg": "label-out-of-range",
        "data/test-00000-of-00001.parquet": "corrupt-parquet"}
    assert _records(tmp_path / "out")["validation/beside.jpg"]["image/encoded"] == hub_data.photo(99)


def test_what_cannot_be_read_as_a_hub_dataset_is_named(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"text": ["a", "b"], "label": [0, 1]}), plain / "train-00000-of-00001.parquet")
    with pytest.raises(InputError, match=r"has no image column .*text \(string\), label \(int64\).*--image-column"):
        _convert(plain, tmp_path / "out")
    partial = tmp_path / "converted" / "default" / "partial-train"
    partial.mkdir(parents=True)
    shutil.copy(hub_data.write_split(str(tmp_path / "w"), "train", hub_data.rows(3, 0))[0], partial / "0000.parquet")
    with pytest.raises(InputError, match="the split 'train' is truncated"):
        _convert(tmp_path / "converted", tmp_path / "out")


def _sample_file() -> bytes:
    """A small Hub Parquet file of two row groups (written once, by pyarrow with datasets' schema)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        written = hub_data.write_split(folder, "train", hub_data.rows(6, 0))[0]
        table = pq.read_table(written)
        pq.write_table(table, written, row_group_size=3)
        return open(written, "rb").read()


SAMPLE = _sample_file()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(1, 255)), max_size=4),
       cut=st.integers(0, len(SAMPLE)))
def test_mutated_parquet_files_list_and_read_or_are_refused_naming_the_file(tmp_path_factory, flips, cut):
    """Footer and row groups damaged anywhere: the file is refused (corrupt-parquet), an error names it, or
    every row listed reads as bytes or as a rejection with its reason; nothing else escapes."""
    from beam_jobs.planning.discover import Listing
    from beam_jobs.sources.archives import archive_members
    from beam_jobs.sources.hub import hub as parquet
    from beam_jobs.sources.hub import hub_cells

    data = bytearray(SAMPLE)
    for at, xor in flips:
        data[at] ^= xor
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "train-00000-of-00001.parquet").write_bytes(bytes(data[:cut] if cut < len(data) else data))
    listing = Listing(("train-00000-of-00001.parquet",))
    try:
        plan = parquet.plan(str(folder), listing, None, 0.0, 0, None, None, None)
    except InputError as err:
        assert "train-00000-of-00001.parquet" in str(err) or str(folder) in str(err)
        return
    reader = hub_cells.CellReader(str(folder))
    for ref in plan.refs:
        if ref.source.startswith(archive_members.REFUSED):
            assert archive_members.parse_locator(ref.source).reason in (
                "corrupt-parquet", "missing-label", "label-out-of-range")
            continue
        try:
            reader.read(ref.source)
        except hub_cells.CellError as err:
            assert err.reason in ("corrupt-parquet", "missing-image")


@pytest.mark.slow
def test_a_dataset_saved_to_disk_as_arrow_converts_to_the_bytes_of_its_parquet(tmp_path):
    """``DatasetDict.save_to_disk`` writes {split}/data-00000-of-00001.arrow (and a cache-*.arrow that
    ``map`` left is not the dataset): the same rows as Parquet give the same shards."""
    import datasets

    splits = hub_data.hub_snapshot(str(tmp_path / "snapshot"))
    saved = datasets.DatasetDict({name: datasets.Dataset.from_dict(columns, features=hub_data.features())
                                  for name, columns in splits.items()})
    saved.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "saved" / "train" / "cache-0123456789abcdef.arrow").write_bytes(b"not the dataset")
    _convert(tmp_path / "snapshot", tmp_path / "from-parquet")
    manifest = _convert(tmp_path / "saved", tmp_path / "from-arrow")
    assert _shards(tmp_path / "from-arrow") == _shards(tmp_path / "from-parquet")
    assert sorted(manifest["source_parquet"]["files"]) == ["test/data-00000-of-00001.arrow",
                                                           "train/data-00000-of-00001.arrow",
                                                           "validation/data-00000-of-00001.arrow"]


def test_split_and_config_are_read_from_the_hubs_file_names():
    from beam_jobs.sources.hub.hub_files import describe

    assert (describe("data/train-00000-of-00004.parquet").split, describe("data/train-00000-of-00004.parquet")
            .config) == ("train", "")
    assert describe("plain_text/test-00000-of-00001.parquet").config == "plain_text"
    assert (describe("default/validation/0000.parquet").split, describe("default/validation/0000.parquet")
            .config) == ("validation", "default")
    assert describe("beans-validation-00000-of-00002.arrow").split == "validation"  # the HF datasets cache
    assert describe("beans-train.arrow").split == "train"
    assert describe("test/data-00000-of-00001.arrow").split == "test"  # save_to_disk
    with pytest.raises(InputError, match="'train' is truncated"):
        describe("default/partial-train/0000.parquet")


@pytest.mark.slow
def test_class_names_from_the_readme_and_integer_labels_named_by_labels(tmp_path):
    """Parquet written by pandas or pyarrow alone has no huggingface metadata: the names come from the
    snapshot's README.md YAML, as the Hub shows them; a plain integer column is named by --labels."""
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": hub_data.photo(i), "path": f"p{i}.jpg"} for i in range(6)], image),
                      "labels": pa.array([i % 3 for i in range(6)], pa.int64())})
    (tmp_path / "snap" / "data").mkdir(parents=True)
    pq.write_table(table, tmp_path / "snap" / "data" / "train-00000-of-00001.parquet")
    (tmp_path / "snap" / "README.md").write_text(
        "---\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n  - name: labels\n    dtype:\n"
        "      class_label:\n        names:\n          '0': zebra\n          '1': ant\n          '2': mole\n"
        "  splits:\n  - name: train\n    num_examples: 6\n---\n# beans\n")
    _convert(tmp_path / "snap", tmp_path / "out")
    assert (tmp_path / "out" / "labels.txt").read_text() == "zebra\nant\nmole\n"
    assert {name: r["image/class/label"] for name, r in _records(tmp_path / "out").items()} == \
        {f"train/p{i}.jpg": i % 3 for i in range(6)}

    (tmp_path / "snap" / "README.md").unlink()
    with pytest.raises(InputError, match="integers without names: give them with --labels"):
        _convert(tmp_path / "snap", tmp_path / "out", label_column="labels")
    (tmp_path / "names.txt").write_text("a\nb\nc\n")
    manifest = _convert(tmp_path / "snap", tmp_path / "out", label_column="labels",
                        labels_file=str(tmp_path / "names.txt"))
    assert manifest["classes"] == ["a", "b", "c"]
    assert {name: r["image/class/label"] for name, r in _records(tmp_path / "out").items()} == \
        {f"train/p{i}.jpg": i % 3 for i in range(6)}



@pytest.mark.slow
def test_a_cut_file_counts_as_the_rows_it_held_and_a_missing_file_of_a_set_is_named(tmp_path, caplog):
    """Half of a split cut off used to publish the other half with exit 0: its rows now fail the budget."""
    src = tmp_path / "snapshot" / "data"
    paths = hub_data.write_split(str(src), "train", hub_data.rows(60, 0), shards=2)
    hub_data.write_split(str(src), "test", hub_data.rows(9, 100), shards=3)
    (src / "test-00002-of-00003.parquet").unlink()
    data = open(paths[1], "rb").read()
    open(paths[1], "wb").write(data[:len(data) // 2])  # cut: its footer is gone
    with pytest.raises(TooManyRejectedError, match=r"about \d+ more inputs in files refused whole"):
        _convert(tmp_path / "snapshot", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with caplog.at_level("WARNING"):
        manifest = _convert(tmp_path / "snapshot", tmp_path / "out", max_bad_fraction=0.5)
    assert manifest["splits"]["train"]["num_examples"] == 30
    warned = "\n".join(record.getMessage() for record in caplog.records)
    assert re.search(r"data/train-00001-of-00002.parquet could not be read: the train split loses about (1[5-9]|2\d) "
                     "rows", warned), warned
    assert "data/test-00002-of-00003.parquet is missing from" in warned


@pytest.mark.slow
def test_rows_of_local_paths_are_read_with_local_paths_and_every_rejection_names_its_file_and_row(tmp_path):
    """datasets' to_parquet of local image files writes absolute paths and no bytes: read with --local-paths."""
    import datasets

    pictures = tmp_path / "pictures"
    pictures.mkdir()
    paths = []
    for i in range(3):
        (pictures / f"{i}.jpg").write_bytes(hub_data.photo(i))
        paths.append(str(pictures / f"{i}.jpg"))
    (pictures / "2.jpg").write_bytes(b"no image")
    features = datasets.Features({"image": datasets.Image(), "labels": datasets.ClassLabel(names=list(hub_data.NAMES))})
    src = tmp_path / "local"
    src.mkdir()
    datasets.Dataset.from_dict({"image": paths, "labels": [0, 1, 2]}, features=features).to_parquet(
        str(src / "train-00000-of-00001.parquet"))
    with pytest.raises(TooManyRejectedError, match="absolute-path 3.*: pass --local-paths to read those files"):
        _convert(src, tmp_path / "refused")
    report = json.loads((tmp_path / "refused.rejected.jsonl").read_text().splitlines()[0])
    assert "pass --local-paths" in report["detail"] and "row group 0 row 0" in report["detail"]
    manifest = _convert(src, tmp_path / "out", max_bad_fraction=0.5, encode=EncodeOptions(local_paths=True))
    assert manifest["splits"]["train"]["num_examples"] == 2
    records = _records(tmp_path / "out")
    assert sorted(records) == [f"train/{paths[0].lstrip('/')}", f"train/{paths[1].lstrip('/')}"]  # no "train//"
    assert records[f"train/{paths[0].lstrip('/')}"]["image/encoded"] == hub_data.photo(0)
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejected] == ["not-an-image"]
    assert rejected[0]["detail"].startswith("train-00000-of-00001.parquet row group 0 row 2: ")


def test_flags_that_label_images_otherwise_are_refused_for_one_parquet_file_too(tmp_path):
    """--val-labels was silently ignored for a single .parquet SRC (its check came after an early return)."""
    path = hub_data.write_split(str(tmp_path / "d"), "train", hub_data.rows(3, 0))[0]
    (tmp_path / "val.csv").write_text("ImageId,PredictionString\n")
    with pytest.raises(InputError, match="--val-labels: .* is a Parquet dataset"):
        _convert(path, tmp_path / "out", val_labels=str(tmp_path / "val.csv"))


def test_a_workers_reader_opens_each_file_once_for_all_its_row_groups(tmp_path, monkeypatch):
    """Each row group used to reopen its file (and read its footer again): files stay open for the chunk."""
    from beam_jobs.sources.hub import hub_cells

    table = pa.Table.from_pydict(hub_data.rows(6, 0), schema=hub_data.features().arrow_schema)
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet", row_group_size=2)
    opened = []
    real = hub_cells.open_table

    def counted(src, path):
        opened.append(path)
        return real(src, path)

    monkeypatch.setattr(hub_cells, "open_table", counted)
    reader = hub_cells.CellReader(str(tmp_path))
    try:
        images = [reader.read(hub_cells.cell_locator("train-00000-of-00001.parquet", group, row, "image"))
                  for group in range(3) for row in range(2)]
    finally:
        reader.close()
    assert images == [hub_data.photo(i) for i in range(6)]
    assert opened == ["train-00000-of-00001.parquet"]


def test_the_launcher_opens_each_file_once_and_reads_its_small_columns_once(tmp_path, monkeypatch):
    """The plan opened each file three times (footer, path digests, rows) and read its path and label columns
    twice: now once, the values waiting in a scratch file until the rows are listed."""
    from beam_jobs.planning import listing
    from beam_jobs.sources.hub import hub, hub_tables

    table = pa.Table.from_pydict(hub_data.rows(6, 0), schema=hub_data.features().arrow_schema)
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet", row_group_size=2)
    opened, groups_read = [], []
    real_open, real_group = hub_tables.open_table, hub_tables._ParquetTable.group

    def counted_open(src, path):
        opened.append(path)
        return real_open(src, path)

    def counted_group(self, index, columns):
        groups_read.append((index, tuple(columns)))
        return real_group(self, index, columns)

    monkeypatch.setattr(hub_tables, "open_table", counted_open)
    monkeypatch.setattr(hub_tables._ParquetTable, "group", counted_group)
    plan = hub.plan(str(tmp_path), listing.list_tree(str(tmp_path)), None, 0.0, 0, None, None, None,
                    scratch=str(tmp_path))
    assert len(list(plan.refs)) == 6
    assert opened == ["train-00000-of-00001.parquet"]
    assert groups_read == [(group, ("image.path", "labels")) for group in range(3)]


def test_a_parquet_rows_read_error_is_an_unreadable_item_not_an_archives():
    """CellError subclassed ArchiveError: code catching an archive's errors caught a Parquet row's too."""
    from beam_jobs.sources.archives import archive_members
    from beam_jobs.sources.hub import hub_cells

    error = hub_cells.CellError("missing-image", "train.parquet row group 0 row 2: no image bytes")
    assert isinstance(error, archive_members.UnreadableItem) and error.reason == "missing-image"
    assert not isinstance(error, archive_members.ArchiveError)
    assert archive_members.ArchiveError("cut").reason == "corrupt-member"
