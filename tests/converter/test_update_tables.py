"""The records table of a version an update writes (issues #56 x #59, docs/update.md "Records tables"):
one row a record the version reads, in its record order, its footer's figures the version's; and what reads it
(repeat factors on a masked source, the report, a mixture's leak check, the Croissant card).

One real conversion and two real updates (in this process, the in-memory runner) of small generated class
folders, shared by every test here: the first update masks a train shard (3 scattered records deleted),
compacts another (all but 4 deleted) and adds 4 images; the second deletes one more record of the masked shard
and adds 2, so its table is composed from a version's table. A twin of OUT taken before the updates goes
through the same updates: the same tables, byte for byte.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import shutil

import pytest
import tensorflow as tf
from PIL import Image

import reader
import record_schema
from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from reader.frames import extent_records
from reader.info import open_records_table
from reader.tools import verify
from reader.tools.report_stats import SplitStats
from record_files import idx, versions

pytestmark = pytest.mark.slow  # a conversion and four updates (~30 s on a loaded machine)

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _image(path: str, seed: int) -> None:
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    size = (24 + seed % 5, 20 + seed % 3)  # sides differ: the footer's side figures are not all one bin
    Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3))).save(path, quality=90)


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, val_fraction=0.25, near_distance=3, shards=2)


def _manifest(out: str, number: int) -> dict:
    with open(os.path.join(out, versions.manifest_path(number)), encoding="utf-8") as handle:
        return json.load(handle)


def _read(out: str, version: int) -> dict[str, list[tuple]]:
    """Per split, (shard, index, offset, path, features) of every record the version reads, in its order: the
    shard its file's place in the manifest, the offset its record index's."""
    info = reader.dataset_info(out, version=version)
    found = {}
    for split in info.splits.values():
        files = list(dict.fromkeys(shard.path for shard in split.shards))
        rows = found[split.name] = []
        for extent in split.shards:
            with open(idx.index_filename(extent.path)) as handle:
                offsets = [int(line.split()[0]) for line in handle if line.strip()]
            for k, raw in enumerate(extent_records(extent.path, extent.index_path, extent.first, extent.num_examples)):
                feature = tf.train.Example.FromString(raw).features.feature
                rows.append((files.index(extent.path), extent.first + k, offsets[extent.first + k],
                             feature[record_schema.FILENAME].bytes_list.value[0].decode(), feature))
    return found


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """(out, twin): OUT after a conversion and two updates (versions 2 and 3), and its twin, the same SRC
    through the same updates."""
    root = tmp_path_factory.mktemp("tables")
    src, out, twin = str(root / "src"), str(root / "out"), str(root / "twin")
    for cls in ("cat", "dog"):
        for i in range(16):
            _image(os.path.join(src, cls, f"{i}.jpg"), sum(map(ord, cls)) * 100 + i)
    conversion.run(_options(src, out), FAST, show_progress=False)
    shutil.copytree(out, twin)
    by_file = collections.defaultdict(list)
    for shard, _, _, path, _ in _read(out, 1)["train"]:
        by_file[shard].append(path)
    kept, thinned = by_file[0], by_file[1]
    for path in [kept[i] for i in (1, 4, 5)] + thinned[:-4]:  # masked: 3 scattered; compacted: all but 4
        os.remove(os.path.join(src, path))
    for i in range(4):
        _image(os.path.join(src, "cat", f"new{i}.jpg"), 900 + i)
    for target in (out, twin):
        assert update.run(_options(src, target), FAST).version == 2
    os.remove(os.path.join(src, kept[7]))
    for i in range(2):
        _image(os.path.join(src, "dog", f"new{i}.jpg"), 950 + i)
    for target in (out, twin):
        assert update.run(_options(src, target), FAST).version == 3
    return out, twin


def test_the_updates_mask_compact_and_add(grown):
    out, _ = grown
    changes = _manifest(out, 2)["changes"]
    assert changes["masked_shards"] == 1 and changes["compacted_shards"] == 1 and changes["new_shards"] >= 1
    assert any("live" in shard for shard in _manifest(out, 3)["splits"]["train"]["shards"])


@pytest.mark.parametrize("version", [2, 3])
def test_a_versions_table_has_a_row_for_each_record_it_reads_in_its_order(grown, version):
    out, _ = grown
    manifest, info = _manifest(out, version), reader.dataset_info(out, version=version)
    records = _read(out, version)
    for name, split in info.splits.items():
        listed = manifest["splits"][name]["records_table"]
        path = os.path.join(out, listed["file"])
        assert listed["file"] == f"{versions.version_dir(version)}/{record_schema.records_table_filename(name)}"
        with open(path, "rb") as handle:
            data = handle.read()
        assert (len(data), hashlib.sha256(data).hexdigest(), listed["num_rows"]) == (
            listed["num_bytes"], listed["sha256"], split.num_examples)
        rows = [row for group in open_records_table(split).row_groups(("shard", "index", "offset", "path"))
                for row in zip(*(group.column(c).to_pylist() for c in ("shard", "index", "offset", "path")))]
        assert rows == [record[:4] for record in records[name]]
    report = verify.verify(out, version=version)  # every row against its record: classes, sizes, SHA-256
    assert report.ok, report.format()


@pytest.mark.parametrize("version", [2, 3])
def test_a_versions_footer_holds_the_figures_of_the_records_it_reads(grown, version):
    out, _ = grown
    info = reader.dataset_info(out, version=version)
    for name, records in _read(out, version).items():
        scanned = SplitStats(name)
        for *_, feature in records:
            scanned.add(feature, info.task)
        assert open_records_table(info.splits[name]).stats(name).to_json() == scanned.to_json()


def test_the_same_src_through_the_same_updates_gives_the_same_tables(grown):
    out, twin = grown
    for version in (2, 3):
        for name, split in _manifest(out, version)["splits"].items():
            table = split["records_table"]
            assert table == _manifest(twin, version)["splits"][name]["records_table"]
            with open(os.path.join(out, table["file"]), "rb") as mine, \
                    open(os.path.join(twin, table["file"]), "rb") as theirs:
                assert mine.read() == theirs.read()


def test_repeat_factors_read_a_masked_versions_table_and_its_records_alone(grown):
    """Repeat factors on a masked source (refused before the version had a table): the factors are those of its
    table's classes, and an epoch reads exactly the version's records, each as often as its factor says."""
    from reader.mixtures.pipeline import _present, _source_records
    from reader.mixtures.repeat_factor import image_classes

    out, _ = grown
    info = reader.dataset_info(out)
    split = info.split("train")
    assert split.masked
    labels = [feature[record_schema.LABEL].int64_list.value[0] for *_, feature in _read(out, 3)["train"]]
    classes = image_classes(info, split)
    assert [list(classes.values[a:b]) for a, b in zip(classes.starts[:-1], classes.starts[1:])] == [[x] for x in labels]
    plan = reader.mixture([(out, 1.0)], "train", 4, repeat_factor=reader.RepeatFactor(0.9), leaks="ignore")
    source = plan.sources[0]
    (stream,) = _source_records(plan, [_present(source)], [5], tf.zeros([1], tf.int64))
    epoch = source.factors.epoch_records
    read = collections.Counter(tf.train.Example.FromString(raw).features.feature[record_schema.FILENAME]
                               .bytes_list.value[0].decode() for raw, _ in stream.take(epoch).as_numpy_iterator())
    paths = [path for _, _, _, path, _ in _read(out, 3)["train"]]
    assert set(read) <= set(paths) and sum(read.values()) == epoch
    assert epoch > len(paths)  # the rare class repeated: the factors were applied


def test_the_report_of_an_updated_version_draws_from_its_tables_as_a_scan_would(grown, tmp_path, caplog):
    from reader.tools.report import write_report

    out, _ = grown
    figures = {}
    for name, scan in (("tables", False), ("scan", True)):
        (tmp_path / name).mkdir()
        with caplog.at_level("WARNING"):
            paths = write_report(out, str(tmp_path / name), scan=scan)
        with open(paths.json, encoding="utf-8") as handle:
            figures[name] = json.load(handle)
    assert not [r for r in caplog.records if "reads every record" in r.getMessage()]
    assert figures["tables"].pop("figures_from") == "records tables" and figures["scan"].pop("figures_from") == "scan"
    assert figures["tables"] == figures["scan"]


def test_a_mixtures_leak_check_reads_an_updated_versions_tables(grown):
    from reader.mixtures.leaks import find_leaks

    out, twin = grown
    infos = [reader.dataset_info(out), reader.dataset_info(twin)]
    found, unchecked = find_leaks(infos, ["out", "twin"], "train")
    assert unchecked == []
    records = _read(out, 3)
    evaluation = {path for name, rows in records.items() if name != "train" for _, _, _, path, _ in rows}
    assert found and {leak.path for leak in found} <= {path for *_, path, _ in records["train"]}
    assert {leak.other_path for leak in found} <= evaluation  # the version's records only, none it deleted


def test_a_masked_version_has_no_croissant_card_and_the_card_command_says_why(grown, capsys):
    """A Croissant FileObject is a whole file: mlcroissant would read a masked file's deleted records, so no card
    of a masked version is written, and asking for one names the masked files and what to do."""
    from converter import card
    from record_files.croissant import MaskedVersionError, build_croissant

    out, _ = grown
    masked = [shard["file"] for shard in _manifest(out, 3)["splits"]["train"]["shards"] if "live" in shard]
    assert not os.path.exists(os.path.join(out, versions.in_version(3, "croissant.json")))
    with pytest.raises(MaskedVersionError, match="mlcroissant would read the deleted records too") as refused:
        build_croissant(_manifest(out, 3))
    assert all(name in str(refused.value) for name in masked) and "--overwrite" in str(refused.value)
    assert card.main([out, "--version", "3"]) == 1  # the version at fault, not the command line: 1, as verify's
    err = capsys.readouterr().err
    assert masked[0] in err and "version=3" in err and "records.parquet" in err
    assert not os.path.exists(os.path.join(out, versions.in_version(3, "croissant.json")))
    assert card.main([out, "--version", "1"]) == 0  # a version without masks: its card, as before


def test_repeat_factors_refuse_a_masked_version_without_a_table_naming_its_masked_files(grown, tmp_path):
    """A version an update wrote before tables (its split entries list none): the labels' pass reads whole files,
    masked records too, so repeat factors refuse it, naming the files and what to do."""
    from reader.mixtures.repeat_factor import image_classes

    out, _ = grown
    old = str(tmp_path / "old")
    shutil.copytree(out, old)
    manifest = _manifest(old, 3)
    for split in manifest["splits"].values():
        del split["records_table"]
    with open(os.path.join(old, versions.manifest_path(3)), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    info = reader.dataset_info(old)
    masked = next(os.path.basename(s["file"]) for s in manifest["splits"]["train"]["shards"] if "live" in s)
    with pytest.raises(ValueError, match=f"masks deleted records in {masked}.*--overwrite"):
        image_classes(info, info.split("train"))
