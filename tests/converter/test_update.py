"""``--update`` (issue #59): a dataset that grows is a series of versions, each holding exactly SRC as it was.

The rule every update is held to: the latest version holds exactly SRC (every image once, in its class),
every unchanged image keeps its split, its class id and its shard file (unless that shard lost a record
and was compacted), and every earlier version still reads as it was. Small generated class folders; the
conversions run in this process on the in-memory runner, a kill in its own process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import random
import shutil
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from PIL import Image

import record_schema
from beam_jobs import faults
from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from reader.frames import extent_records
from reader.info import dataset_info, latest_version
from record_files import versions
from tests.conftest import run_converter
from tests.in_process import cli_in_forked_process

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _image(path: str, seed: int) -> None:
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (24, 20), tuple(rng.randrange(256) for _ in range(3))).save(path, quality=90)


def _source(root: str) -> str:
    src = os.path.join(root, "src")
    for cls in ("cat", "dog"):
        for i in range(8):
            _image(os.path.join(src, cls, f"{i}.jpg"), sum(map(ord, cls)) * 100 + i)
    return src


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, val_fraction=0.25, near_distance=3, shards=3)


def _records(out: str, version=None) -> dict[str, tuple[str, int, str]]:
    """path -> (split, label id, shard file relative to OUT) of every record a version's shards hold."""
    info = dataset_info(out, version=version)
    found = {}
    for split in info.splits.values():
        for shard in split.shards:  # extents: a masked shard's runs only (tests/reader/test_masks.py)
            for raw in extent_records(shard.path, shard.index_path, shard.first, shard.num_examples):
                feature = tf.train.Example.FromString(raw).features.feature
                path = feature[record_schema.FILENAME].bytes_list.value[0].decode()
                assert path not in found, f"{path} is in version {info.version} twice"
                found[path] = (split.name, feature[record_schema.LABEL].int64_list.value[0],
                               os.path.relpath(shard.path, out))
    return found


def _src_images(src: str) -> dict[str, str]:
    """path -> class of every image in SRC (but the files named broken*, which are rejected)."""
    return {f"{cls}/{name}": cls for cls in sorted(os.listdir(src)) for name in os.listdir(os.path.join(src, cls))
            if not name.startswith("broken")}


def _check_rule(src: str, out: str, before: dict, changed: set[str]) -> dict:
    """The latest version holds exactly SRC, each record labelled by its folder; every image unchanged since
    ``before`` keeps its split and id, and its shard file unless that shard was compacted (a masked one is kept) or,
    small, merged into the version's compacted/ shards."""
    now, info = _records(out), dataset_info(out)
    assert set(now) == set(_src_images(src))
    for path, cls in _src_images(src).items():
        assert info.classes[now[path][1]] == cls
    touched = {before[path][2] for path in before if path in changed or path not in now}
    listed = {os.path.relpath(shard.path, out) for split in info.splits.values() for shard in split.shards}
    compacted = touched - listed
    for path, (split, label, shard) in before.items():
        if path in now and path not in changed:
            assert now[path][:2] == (split, label), path
            # A small shard (an earlier update's) may be merged with others though it lost nothing: its records
            # move into the version's compacted/ shards (docs/update.md, "Merging small shards").
            if shard not in compacted and not (shard not in listed and "/compacted/" in now[path][2]):
                assert now[path][2] == shard, path
    return now


def _files(out: str) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(folder, name), out): open(os.path.join(folder, name), "rb").read()
            for folder, _, names in os.walk(out) for name in names}


def _content(out: str) -> dict[str, bytes]:
    """Every file but those that hold the time of the run (manifests, the Croissant card)."""
    return {name: data for name, data in _files(out).items()
            if os.path.basename(name) not in (record_schema.MANIFEST_FILE, "croissant.json")}


@pytest.mark.slow
def test_updates_hold_exactly_src_keep_splits_ids_and_shards_and_old_versions_read_as_they_were(tmp_path, caplog):
    src = _source(str(tmp_path))
    outs = [str(tmp_path / "out"), str(tmp_path / "twin")]  # the same SRC through the same updates, twice
    conversion.run(_options(src, outs[0]), FAST, show_progress=False)
    shutil.copytree(outs[0], outs[1])  # the conversion's determinism is tests/converter/test_pinned_output.py's
    first = _records(outs[0])

    # Nothing changed: no version, not a byte written.
    files = _files(outs[0])
    assert update.run(_options(src, outs[0]), FAST).version is None
    assert _files(outs[0]) == files

    # Added images (one re-encoded, a PNG; one rejected) and a new class: every old shard reused, the new
    # class gets the next id.
    for i in range(3):
        _image(os.path.join(src, "bird", f"{i}.jpg"), 100 + i)
        _image(os.path.join(src, "cat", f"new{i}.jpg"), 200 + i)
    Image.new("RGB", (20, 24), (9, 99, 199)).save(os.path.join(src, "dog", "new.png"))
    with open(os.path.join(src, "dog", "broken.jpg"), "wb") as handle:
        handle.write(b"not an image")
    with caplog.at_level(logging.WARNING, logger="beam_jobs.pipeline.budgets"):
        done = [update.run(_options(src, out), FAST) for out in outs]
    assert [d.version for d in done] == [2, 2] and done[0].changes["added"] == 8
    # 1 of the 8 (12.5%) is past the budget, which the version's images pass: published, and said
    assert "1 of the 8 images this update converted were rejected (12.5%" in caplog.text
    second = _check_rule(src, outs[0], first, set())
    assert dataset_info(outs[0]).classes == ("cat", "dog", "bird")
    assert {shard for _, _, shard in first.values()} <= {shard for _, _, shard in second.values()}
    assert "requires" not in dataset_info(outs[0]).manifest  # no mask: readers before masks read it
    # --rehash compares each file with the source's SHA-256 the version recorded, not the stored image's:
    # nothing changed, no version, though the PNG was re-encoded and the broken file stored nothing.
    assert update.run(_options(src, outs[0]), FAST, rehash=True).version is None

    # A changed image, a deleted one, a class that loses every image: masks, stable ids.
    _image(os.path.join(src, "cat", "0.jpg"), 999)
    os.remove(os.path.join(src, "dog", "3.jpg"))
    shutil.rmtree(os.path.join(src, "bird"))
    done = [update.run(_options(src, out), FAST) for out in outs]
    assert [d.version for d in done] == [3, 3]
    assert (done[0].changes["changed"], done[0].changes["deleted"]) == (1, 4)
    _check_rule(src, outs[0], second, {"cat/0.jpg"})
    assert dataset_info(outs[0]).classes == ("cat", "dog", "bird")

    # Every version reads as it was; the twin has the same bytes and content versions.
    assert latest_version(outs[0]) == 3
    assert _records(outs[0], version=1) == first and _records(outs[0], version=2) == second
    assert _content(outs[0]) == _content(outs[1])
    # Shards that lost one record of several are masked (reused, their survivors listed), not copied.
    assert dataset_info(outs[0]).manifest["requires"] == ["live"] and done[0].changes["masked_shards"] >= 1
    assert not any(name.startswith("versions/00003/compacted/") for name in _files(outs[0]))
    assert [dataset_info(outs[0], version=v).fingerprint for v in (1, 2, 3)] == \
        [dataset_info(outs[1], version=v).fingerprint for v in (1, 2, 3)]

    # A deletion-only version (no pipeline run): its manifest is its own, not version 3's with new counts.
    third = _records(outs[0])
    path = os.path.join(outs[0], versions.manifest_path(3))
    with open(path) as handle:
        manifest = json.load(handle)
    with open(path, "w") as handle:  # dated long ago, so a copied date shows
        json.dump(dict(manifest, created="2000-01-01T00:00:00+00:00"), handle)
    os.remove(os.path.join(src, "dog", "4.jpg"))
    done = update.run(_options(src, outs[0]), FAST)
    assert (done.version, done.changes["deleted"], done.changes["added"]) == (4, 1, 0)
    _check_rule(src, outs[0], third, set())
    with open(os.path.join(outs[0], versions.manifest_path(4))) as handle:
        manifest = json.load(handle)
    assert manifest["created"] > "2026" and manifest["duplicates"]["num_groups"] == 0
    # Rows kept through compaction carry their source's hash: --rehash still finds nothing changed.
    assert update.run(_options(src, outs[0]), FAST, rehash=True).version is None


def test_a_version_pointer_is_read_and_a_version_beyond_it_refused(tmp_path):
    out = tmp_path / "out"
    (out / versions.VERSIONS_DIR).mkdir(parents=True)
    (out / versions.POINTER_FILE).write_text("7\n")
    assert latest_version(str(out)) == 7
    with pytest.raises(ValueError, match="version 8 of .* does not exist: it has no version at all"):
        dataset_info(str(out), version=8)
    (out / versions.POINTER_FILE).write_text("junk")
    with pytest.raises(ValueError, match="version pointer is damaged"):
        latest_version(str(out))


def test_a_version_that_requires_a_feature_this_release_does_not_know_is_refused_by_both_sides(tmp_path):
    """A manifest's "requires" names what a reader must know to read it right (masks are "live", known:
    docs/update.md, tests/reader/test_masks.py): the reader and the updater refuse an unknown one, naming it and
    the manifest, instead of reading the version wrong."""
    from beam_jobs.files import version_store

    manifest = {"format_version": record_schema.FORMAT_VERSION, "classes": ["a"], "splits": {},
                "requires": ["live", "sparse"]}
    (tmp_path / record_schema.MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="manifest.json requires sparse, which this release does not know"):
        dataset_info(str(tmp_path))
    with pytest.raises(version_store.VersionError, match="requires sparse"):
        version_store.read(str(tmp_path), 1)
    (tmp_path / record_schema.MANIFEST_FILE).write_text(json.dumps(dict(manifest, requires=["live"])))
    assert dataset_info(str(tmp_path)).classes == ("a",)


def test_the_sources_table_gives_back_its_rows_sorted_and_the_same_rows_the_same_bytes():
    rows = [versions.SourceRow("b.jpg", "train", "versions/00002/train-00000-of-00001.tfrecord", 0, 10, 5, "ab", "ef"),
            versions.SourceRow("a.jpg", "", "", -1, versions.UNKNOWN, versions.UNKNOWN, "", "cd")]
    data = versions.sources_bytes(rows)
    assert versions.read_sources(data, "t") == sorted(rows, key=lambda row: row.path)
    assert versions.sources_bytes(reversed(rows)) == data
    assert not versions.read_sources(data, "t")[0].stamped
    # A table written before the source_sha256 column still reads, its rows without one.
    old = pa.Table.from_pydict({name: [getattr(rows[0], name)] for name in (
        "path", "split", "file", "index", "size", "mtime_ns", "sha256")})
    sink = io.BytesIO()
    pq.write_table(old, sink)
    assert versions.read_sources(sink.getvalue(), "t") == [dataclasses.replace(rows[0], source_sha256="")]



def test_the_sources_table_written_as_a_stream_is_the_same_bytes_and_reads_back_a_group_at_a_time(
        tmp_path, monkeypatch):
    """An update writes the table from a merge of sorted streams (write_sources), a row group at a time: the bytes
    sources_bytes gives for the same rows; rows out of order are refused, naming them."""
    monkeypatch.setattr(versions, "_ROW_GROUP", 4)  # several row groups from 10 rows
    rows = [versions.SourceRow(f"c/{i:02d}.jpg", "train", "s0", i, 10 + i, 5, "ab", "ef" if i % 2 else "")
            for i in range(10)]
    versions.write_sources(str(tmp_path / "t.parquet"), iter(rows))
    assert (tmp_path / "t.parquet").read_bytes() == versions.sources_bytes(reversed(rows))
    assert list(versions.iter_sources(str(tmp_path / "t.parquet"))) == rows
    with pytest.raises(ValueError, match="out of order .'c/00.jpg' after 'c/01.jpg'"):
        versions.write_sources(str(tmp_path / "u.parquet"), iter([rows[1], rows[0]]))


def _flat_listing(root, images: int):
    """``images`` empty files in 4 class folders, the listing of them in split order (as a carve lists them), and
    the rows of a version that holds them all (a shard of 100 each)."""
    from beam_jobs.stage_records import ImageRef

    refs, rows = [], []
    for i in range(images):
        relpath = f"c{i % 4}/{i:06d}.jpg"
        os.makedirs(root / f"c{i % 4}", exist_ok=True)
        (root / relpath).write_bytes(b"")
        refs.append(ImageRef("validation" if i % 5 == 0 else "train", relpath, i % 4))
    refs.sort(key=lambda ref: (ref.split, ref.relpath))
    for position, ref in enumerate(sorted(refs, key=lambda ref: ref.relpath)):
        stat = os.stat(root / ref.relpath)
        rows.append(versions.SourceRow(ref.relpath, ref.split, f"s{position // 100}", position % 100, stat.st_size,
                                       stat.st_mtime_ns, "ab" * 32, "cd" * 32))
    return refs, rows


@pytest.mark.slow
def test_the_comparison_sorts_the_listing_in_runs_and_holds_memory_flat_in_the_images(tmp_path, monkeypatch):
    """A merge-join of the listing (sorted in spilled runs, merged a few at a time) and the sources table (in path
    order): the same changes whatever the run size, and a peak of traced memory that grows by a small fraction
    of a row an image, once the runs and the row groups are smaller than the images (by default, from 50,000
    and 16,384 on)."""
    import gc
    import tracemalloc

    from beam_jobs.files import external_sort
    from beam_jobs.planning import changes

    def changes_of(images: int, run: int, traced: bool = True) -> tuple:
        root = tmp_path / f"{images}-{run}"
        refs, rows = _flat_listing(root, images)
        listing = [ref for k, ref in enumerate(refs) if k % 50]  # 2% deleted: every shard compacted
        monkeypatch.setattr(changes, "SORT_RUN_BYTES", run * 100)  # ``run`` refs of ~100 bytes held in memory
        monkeypatch.setattr(external_sort, "FAN_IN", 4)  # 1,000 images: ~16 runs merged 4 at a time
        monkeypatch.setattr(versions, "_ROW_GROUP", 256)
        (root / "scratch").mkdir()
        # Without the cyclic collector while traced: when it ran decided the peak (the same code measured 49 or
        # 144 B an image as unrelated modules changed); without it, garbage the comparison makes counts in full.
        gc.collect()
        gc.disable()
        if traced:  # tracing slows every allocation about threefold: only the two runs compared for memory
            tracemalloc.start()
        try:
            found = changes.compare(listing, str(root), ["c0", "c1", "c2", "c3"], iter(rows),
                                    ["c0", "c1", "c2", "c3"], 0.0, 0, scratch=str(root / "scratch"))
            versions.write_sources(str(root / "sources.parquet"), (row for row, _ in found.unchanged))
            peak = tracemalloc.get_traced_memory()[1] if traced else 0
        finally:
            tracemalloc.stop()
            gc.enable()
        kept = [(row.path, row.file, row.index, label) for row, label in found.unchanged]
        return (found.counts(), kept, {file: index.tolist() for file, index in found.survivors.items()}), peak

    whole, _ = changes_of(1000, 10**6, traced=False)
    runs, small = changes_of(1000, 64)
    assert runs == whole and whole[0]["deleted"] == 1000 // 50 and whole[0]["compacted_shards"] == 10
    _, large = changes_of(4000, 64)
    # A row an image held (a dict of the version's rows, the listing's stamps) cost about 1,300 B an image; what
    # still grows here is per compacted shard and fills blocks of constant size (flat from 100,000 to 300,000
    # images at the defaults: docs/converter.md).
    assert (large - small) / 3000 < 120, (small, large, (large - small) / 3000)

@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> str:
    """A folder holding ``src`` and ``out``, its conversion: made once, copied by each killed update's test."""
    root = tmp_path_factory.mktemp("converted")
    src = _source(str(root))
    conversion.run(_options(src, str(root / "out")), FAST, show_progress=False)
    return str(root)


@pytest.mark.e2e
@pytest.mark.parametrize("point", ["before-commit", "version-moved"])
def test_a_killed_update_leaves_the_latest_version_whole_and_the_same_command_finishes_it(tmp_path, point,
                                                                                          converted):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    shutil.copytree(os.path.join(converted, "src"), src)  # copied with its files' modification times
    shutil.copytree(os.path.join(converted, "out"), out)
    _image(os.path.join(src, "cat", "new.jpg"), 5)
    os.remove(os.path.join(src, "dog", "1.jpg"))
    before = _files(out)
    command = ["--src", src, "--out", out, "--val-fraction", "0.25", "--near-distance", "3", "--update",
               "--no-progress", *FAST]
    # In a process of its own, forked from one that imported Beam once (tests/in_process.py).
    killed = cli_in_forked_process(command, env={"TMPDIR": str(tmp_path), faults.ENV: f"kill@{point}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Version 1 whole and still the latest: no pointer; at most an unpublished versions/00002, read by nobody.
    assert {name: data for name, data in _files(out).items() if not name.startswith("versions/")} == before
    assert latest_version(out) == 1 and dataset_info(out).version == 1
    # The same command finishes it, in this process (run_converter: one Beam and TensorFlow start-up less; its
    # TMPDIR is tempfile's for the call, as a process's own would be).
    left_by_the_kill = set(os.listdir(tmp_path))
    finished = run_converter(*command, env={"TMPDIR": str(tmp_path)})
    assert finished.returncode == 0, finished.stderr
    assert "published version 2" in finished.stdout
    assert set(_records(out)) == set(_src_images(src))
    leftovers = [name for name in os.listdir(tmp_path) if name.startswith(".out.")]
    assert not leftovers, leftovers
    assert set(os.listdir(tmp_path)) <= left_by_the_kill, "the finished update left files in its TMPDIR"


def test_update_refuses_another_source_naming_it_options_that_shape_the_records_and_dropped_leaks(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / record_schema.MANIFEST_FILE).write_text(json.dumps(
        {"format_version": 1, "classes": ["a"], "splits": {}, "options": {"seed": 1}}))
    src = tmp_path / "coco"
    src.mkdir()
    with pytest.raises(update.UpdateRefusedError, match="--seed"):
        update.run(ConvertOptions(src=str(src), out=str(out), seed=2), FAST)
    # An image option changed: the refusal names that flag, not the two whole option groups (the trial's finding).
    shaped = ConvertOptions(src=str(src), out=str(out), seed=1,
                            encode=dataclasses.replace(ConvertOptions(src=str(src), out=str(out)).encode, max_side=64))
    (out / record_schema.MANIFEST_FILE).write_text(json.dumps(
        {"format_version": 1, "classes": ["a"], "splits": {}, "options": json.loads(json.dumps(
            shaped.to_json(), default=str))}))
    with pytest.raises(update.UpdateRefusedError, match=r"--max-side is 32 here but 64 in the latest") as refused:
        update.run(dataclasses.replace(shaped, encode=dataclasses.replace(shaped.encode, max_side=32)), FAST)
    assert "quality" not in str(refused.value)
    (out / record_schema.MANIFEST_FILE).write_text(json.dumps(
        {"format_version": 1, "classes": ["a"], "splits": {}, "options": {"seed": 1}}))
    # A version that dropped leaks: its dropped images are in no sources table, an update would convert them back.
    (out / record_schema.MANIFEST_FILE).write_text(json.dumps(
        {"format_version": 1, "classes": ["a"], "splits": {}, "options": {"seed": 1, "drop_leaks": True},
         "duplicates": {"num_dropped": 2}}))
    with pytest.raises(update.UpdateRefusedError, match="--drop-leaks.*--overwrite"):
        update.run(ConvertOptions(src=str(src), out=str(out), seed=1, drop_leaks=True), FAST)


def test_prune_keeps_every_file_a_kept_version_reads(tmp_path):
    """Version 2 reuses a shard of version 1 and one of its own that version 3 reuses; pruning 1 and 2
    deletes only what version 3 does not read (hand-made manifests: prune reads nothing else)."""
    from beam_jobs.files import version_store

    out = tmp_path / "out"

    def manifest(folder, files, number=None):
        (out / folder).mkdir(parents=True, exist_ok=True)
        body = {"format_version": 1, "classes": [], "splits": {"train": {"shards": [{"file": f} for f in files]}}}
        (out / folder / record_schema.MANIFEST_FILE).write_text(json.dumps(dict(body, version=number)))

    for name in ("a.tfrecord", "b.tfrecord", "versions/00002/c.tfrecord", "versions/00002/d.tfrecord",
                 "versions/00003/e.tfrecord"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(hashlib.sha256(name.encode()).digest())
    manifest(".", ["a.tfrecord", "b.tfrecord"])
    manifest("versions/00002", ["a.tfrecord", "versions/00002/c.tfrecord", "versions/00002/d.tfrecord"], 2)
    manifest("versions/00003", ["versions/00002/c.tfrecord", "versions/00003/e.tfrecord"], 3)
    (out / "labels.txt").write_text("")
    (out / "notes.txt").write_text("mine")
    version_store.write_pointer(str(out), 3)
    pruned = version_store.prune(str(out), keep=1)
    assert pruned.versions == (1, 2)
    left = sorted(os.path.relpath(os.path.join(f, n), out) for f, _, names in os.walk(out) for n in names)
    assert left == ["notes.txt", "versions/00002/c.tfrecord", "versions/00003/e.tfrecord",
                    "versions/00003/manifest.json", "versions/latest"]


def test_an_image_gone_between_listing_and_comparing_is_deleted_and_one_kept_by_its_source_hash(tmp_path):
    """In process, no conversion: ``compare`` stats each listed file; one gone since is deleted, not a
    traceback; with --rehash, a file whose bytes are the source's the version recorded is unchanged, though
    its stored image's hash differs (re-encoded)."""
    from beam_jobs.planning import changes
    from beam_jobs.stage_records import ImageRef

    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.png").write_bytes(b"png bytes")
    source = hashlib.sha256(b"png bytes").hexdigest()
    refs = [ImageRef("train", "cat/a.png", 0), ImageRef("train", "cat/gone.jpg", 0)]
    previous = [versions.SourceRow("cat/a.png", "train", "s0", 0, 1, 1, "ab" * 32, source),
                versions.SourceRow("cat/gone.jpg", "train", "s0", 1, 1, 1, "cd" * 32, "cd" * 32)]
    (tmp_path / "scratch").mkdir()
    found = changes.compare(refs, str(tmp_path), ["cat"], previous, ["cat"], 0.0, 0, rehash=True,
                            scratch=str(tmp_path / "scratch"))
    assert (found.added, found.changed, found.deleted) == (0, 0, 1)
    assert found.survivors["s0"].tolist() == [0]  # its shard lost cat/gone.jpg: compacted, a.png its survivor
    assert [(row.path, row.source_sha256, label) for row, label in found.unchanged] == [("cat/a.png", source, (0,))]
