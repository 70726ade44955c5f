"""Masks (issue #59, docs/update.md): an update keeps a shard that lost a few records as it is and lists the
records its version reads (``live``); every reader reads those runs, never the records between them.

One real conversion and one real update (in this process, the in-memory runner) of small generated class
folders, shared by every test here: in train, one shard loses three scattered records (masked), another
all but a few (compacted), and new images come in. After the update the masked records' frames are
overwritten with garbage on disk, so any read of them fails: every read below succeeding is the proof they
are skipped, not read.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import reader
import record_schema
from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.files import version_store
from beam_jobs.options import ConvertOptions
from reader import order, record_index
from reader.frames import extent_records
from reader.records import SegmentReader, file_order, interleave_records
from reader.tools import verify
from reader.tools.contact_sheet import split_features
from record_files import versions

pytestmark = pytest.mark.slow  # a conversion and an update (~20 s), then a pipeline or two a test

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
BATCH = 4


def _image(path: str, seed: int) -> None:
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (24, 20), tuple(rng.randrange(256) for _ in range(3))).save(path, quality=90)


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, val_fraction=0.25, near_distance=3, shards=2)


def _path_of(raw: bytes) -> str:
    return tf.train.Example.FromString(raw).features.feature[record_schema.FILENAME].bytes_list.value[0].decode()


def _records(out: str, version=None) -> dict[str, tuple[str, int, str, int]]:
    """path -> (split, label id, shard file relative to OUT, index in the file) of every record a version
    reads, each extent read with ``extent_records`` (a seek to its first record)."""
    info = reader.dataset_info(out, version=version)
    found = {}
    for split in info.splits.values():
        for shard in split.shards:
            for k, raw in enumerate(extent_records(shard.path, shard.index_path, shard.first, shard.num_examples)):
                feature = tf.train.Example.FromString(raw).features.feature
                path = feature[record_schema.FILENAME].bytes_list.value[0].decode()
                assert path not in found, f"{path} is in version {info.version} twice"
                found[path] = (split.name, feature[record_schema.LABEL].int64_list.value[0],
                               os.path.relpath(shard.path, out), shard.first + k)
    return found


def _src_images(src: str) -> set[str]:
    return {f"{cls}/{name}" for cls in os.listdir(src) for name in os.listdir(os.path.join(src, cls))}


def _garble_masked(out: str, entry: dict) -> int:
    """Overwrite every frame of ``entry``'s file outside its live runs with bytes no reader could parse."""
    live = {first + k for first, count in entry["live"] for k in range(count)}
    with open(os.path.join(out, entry["dali_index"])) as handle:
        frames = [tuple(map(int, line.split())) for line in handle if line.strip()]
    with open(os.path.join(out, entry["file"]), "r+b") as handle:
        for record, (offset, size) in enumerate(frames):
            if record not in live:
                handle.seek(offset)
                handle.write(b"\xa5" * size)
    return len(frames) - len(live)


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    """(src, out, before, manifest, kept, thinned): version 1's records, version 2's manifest (it masks ``kept``
    and compacts ``thinned``, two train shard files of version 1)."""
    root = tmp_path_factory.mktemp("masks")
    src, out = str(root / "src"), str(root / "out")
    for cls in ("cat", "dog"):
        for i in range(24):
            _image(os.path.join(src, cls, f"{i}.jpg"), sum(map(ord, cls)) * 100 + i)
    conversion.run(_options(src, out), FAST, show_progress=False)
    before = _records(out)
    by_file = collections.defaultdict(list)
    for path, (split, _, file, _) in sorted(before.items(), key=lambda item: item[1][3]):
        if split == "train":
            by_file[file].append(path)
    kept, thinned = sorted(by_file)[:2]
    for path in [by_file[kept][i] for i in (2, 7, 8)] + by_file[thinned][:-4]:  # 3 scattered; all but 4
        os.remove(os.path.join(src, path))
    for i in range(4):
        _image(os.path.join(src, "cat", f"new{i}.jpg"), 900 + i)
    done = update.run(_options(src, out), FAST)
    assert done.version == 2
    manifest = json.loads(open(os.path.join(out, versions.manifest_path(2))).read())
    report = verify.verify(out)
    assert report.ok and report.records_masked == 3, report.format()
    # its count is the version's records (the manifest's), the masked ones in its files said apart
    assert f" {sum(split['num_examples'] for split in manifest['splits'].values())} records (and 3 masked ones" \
        in report.format()
    entry = next(shard for shard in manifest["splits"]["train"]["shards"] if shard["file"] == kept)
    assert _garble_masked(out, entry) == 3
    return src, out, before, manifest, kept, thinned


def test_an_update_masks_a_shard_that_lost_a_few_records_and_compacts_one_that_lost_most(masked):
    src, out, before, manifest, kept, thinned = masked
    assert manifest["requires"] == ["live"]
    files = {shard["file"]: shard for shard in manifest["splits"]["train"]["shards"]}
    assert kept in files and thinned not in files  # the masked file listed as it was; the thinned one copied
    entry = files[kept]
    size = sum(1 for v in before.values() if v[2] == kept)
    assert entry["file_records"] == size and entry["num_examples"] == size - 3
    assert entry["live"] == [[0, 2], [3, 4], [9, size - 9]]
    assert any(name.startswith("versions/00002/compacted/") for name in files)
    changes = manifest["changes"]
    assert (changes["masked_shards"], changes["compacted_shards"], changes["recompacted"]) == (1, 1, 4)
    # The rule, with masks: exactly SRC; every unchanged image keeps its split, id and shard file (also in the
    # masked shard, at its index), unless its shard was compacted.
    now = _records(out)
    assert set(now) == _src_images(src)
    for path, (split, label, file, index) in before.items():
        if path in now:
            assert now[path][:2] == (split, label)
            if file != thinned:
                assert now[path][2:] == (file, index), path
    assert reader.dataset_info(out).split("train").num_examples == sum(1 for v in now.values() if v[0] == "train")


def test_the_training_order_reads_each_record_once_an_epoch_and_resumes_mid_epoch(masked):
    src, out, _, _, _, _ = masked
    split = reader.dataset_info(out).split("train")
    assert split.masked and len(split.shards) > len(set(split.files))
    layout = order.stream_layout(split.num_examples, 1, window=4)  # G = 1: an epoch is every record
    for epoch in (1,):  # an epoch past the first: its keys start at N
        records = order.host_records(split.files, [s.num_examples for s in split.shards],
                                     [s.index_path for s in split.shards], layout, 5,
                                     tf.constant(epoch * layout.steps_per_epoch, tf.int64), epoch + 1, 1, 0,
                                     SegmentReader(), [s.first for s in split.shards])
        pairs = list(records.as_numpy_iterator())
        assert sorted(int(key) - epoch * split.num_examples for _, key in pairs) == list(range(split.num_examples))
        paths = [_path_of(raw) for raw, _ in pairs]
        assert sorted(paths) == sorted(p for p, v in _records(out).items() if v[0] == "train")

    def batches(steps: int, **kwargs) -> list:
        data = reader.build_dataset(out, batch_size=BATCH, image_size=16, seed=3,
                                    options=reader.ReadOptions(window=4), **kwargs)
        return [(i.numpy(), l.numpy()) for i, l in data.take(steps)]

    assert split.num_examples // BATCH >= 5  # step 2 is mid-epoch, and the 2 steps after it too
    whole, resumed = batches(5), batches(3, start=2)
    assert len(resumed) == 3 and all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                                     for a, b in zip(whole[2:], resumed))


def test_the_buffered_path_and_evaluation_read_exactly_the_versions_records(masked):
    src, out, _, _, _, _ = masked
    info = reader.dataset_info(out)
    train = {p for p, v in _records(out).items() if v[0] == "train"}
    split = info.split("train")
    order_ = file_order(split.files, [s.num_examples for s in split.shards], seed=1, extents=split.shards)
    assert sorted(_path_of(raw) for raw in interleave_records(order_).as_numpy_iterator()) == sorted(train)
    labels = np.concatenate([l.numpy() for _, l in reader.build_dataset(out, "train", batch_size=5, image_size=16,
                                                                        training=False)])
    assert len(labels) == len(train)
    assert collections.Counter(labels.tolist()) == collections.Counter(
        info.classes.index(path.split("/")[0]) for path in train)


def test_a_mixture_and_the_reports_scan_read_exactly_the_versions_records(masked):
    from reader.mixtures.sources import source_records

    src, out, _, _, _, _ = masked
    info = reader.dataset_info(out)
    train = sorted(p for p, v in _records(out).items() if v[0] == "train")
    plan = reader.mixture([(out, 1.0)], "train", BATCH, leaks="ignore")
    split = info.split("train")
    (stream,) = source_records(plan, [split], [7], tf.zeros([1], tf.int64))
    # Each record's key names its place in the version's sequence of records (its extents one after another):
    # the record read there is the one the sequence holds, and an epoch reads each at most once.
    sequence = [_path_of(raw) for s in split.shards
                for raw in extent_records(s.path, s.index_path, s.first, s.num_examples)]
    layout = plan.sources[0].layout
    epoch = layout.steps_per_epoch * layout.batch_size
    pairs = list(stream.take(2 * epoch).as_numpy_iterator())
    assert [_path_of(raw) for raw, _ in pairs] == [sequence[key % len(sequence)] for _, key in pairs]
    assert len({key for _, key in pairs[:epoch]}) == epoch and sorted(sequence) == train
    assert sorted(f[record_schema.FILENAME].bytes_list.value[0].decode()
                  for f in split_features(info, info.split("train"))) == train
    from reader.tools.report import write_report
    paths = write_report(out, scan=True)  # the scan reads the extents (the tables: test_update_tables)
    assert json.loads(open(paths.json).read())["splits"]["splits"]["train"]["images"] == len(train)


def test_a_reader_that_does_not_know_masks_refuses_and_one_without_requires_is_refused(masked, tmp_path,
                                                                                      monkeypatch):
    _, out, _, manifest, kept, _ = masked
    path = os.path.join(out, versions.manifest_path(2))
    monkeypatch.setattr(versions, "KNOWN_REQUIREMENTS", frozenset())  # a release before masks
    with pytest.raises(ValueError, match="requires live, which this release does not know"):
        reader.dataset_info(out)
    with pytest.raises(version_store.VersionError, match="requires live"):
        version_store.read(out, 2)
    monkeypatch.undo()
    unmasked = json.loads(json.dumps(manifest))
    for shard in unmasked["splits"]["train"]["shards"]:
        shard.pop("live", None)
    assert versions.digest(versions.manifest_content(manifest)) != \
        versions.digest(versions.manifest_content(unmasked))  # the content version names the masks too
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / record_schema.MANIFEST_FILE).write_text(json.dumps({**manifest, "requires": []}))
    with pytest.raises(ValueError, match="does not list requires"):
        reader.dataset_info(str(copy))
    bad = json.loads(json.dumps(manifest))
    next(s for s in bad["splits"]["train"]["shards"] if s["file"] == kept)["live"] = [[3, 4], [0, 2], [9, 9]]
    (copy / record_schema.MANIFEST_FILE).write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="not ascending"):
        reader.dataset_info(str(copy))
    assert os.path.exists(path)


def test_prune_and_reindex_keep_a_masked_file_while_a_kept_version_reads_it(masked, tmp_path):
    _, out, _, _, kept, thinned = masked
    copy = str(tmp_path / "out")
    shutil.copytree(out, copy)
    version_store.prune(copy, 1)
    assert os.path.exists(os.path.join(copy, kept)) and not os.path.exists(os.path.join(copy, thinned))
    assert set(_records(copy)) == set(_records(out))
    rebuilt = record_index.rebuild(copy)  # a masked file's index describes the file: intact, not rewritten
    assert not rebuilt.written and not rebuilt.failed, rebuilt.format()


def test_inspect_counts_only_the_versions_records_and_the_tfds_export_refuses_a_masked_version(masked, capsys):
    """inspect's keypoint and caption counts read each extent (it read a masked file whole once per run: the
    deleted records too, counted twice); TFDS reads whole files by its template, so its metadata for a version
    that masks records (or keeps earlier versions' files) is refused, naming the split."""
    from reader.tools import inspect as inspect_tool

    _, out, _, _, _, _ = masked
    train = reader.dataset_info(out).split("train")
    counted = inspect_tool._count_extras(train, points=False, captions=True)
    assert counted.images == train.num_examples and counted.of == ""
    # The shard table is of files (a masked file is listed once per live run) and of each one's live records.
    row = next(line.split() for line in inspect_tool.summarize(out).splitlines() if line.startswith("train "))
    live = {path: sum(s.num_examples for s in train.shards if s.path == path) for path in set(train.files)}
    assert len(live) < len(train.shards)  # the masked file is listed more than once
    assert (int(row[1]), int(row[-2]), int(row[-1])) == (len(live), min(live.values()), max(live.values())), row
    from converter import dataset_commands

    assert dataset_commands.versions([out]) == 0
    assert "1 masked" in capsys.readouterr().out.splitlines()[-1]  # versions counts the masked shard
    pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed: pip install '.[tfds]'")
    from reader.tools.tfds_metadata import write_tfds_metadata

    with pytest.raises(ValueError, match="split 'train' of this version skips records"):
        write_tfds_metadata(out)
