"""``--update`` of images inside archives (issue #59): a member's identity is its path in the extraction, its stamp
its header's (a tar member's size and modification time, a zip member's size and CRC-32), so no byte of an
unchanged member is read (beam_jobs/planning/item_stamps.py).

The rule of tests/converter/test_update.py: after members are added, changed and deleted, the latest version holds
exactly SRC's members; every unchanged one keeps its split, id and shard file; nothing changed writes no version;
and the updated version holds what a fresh conversion of the new SRC holds, record by record. SRC is a tar, a zip
and a compressed tar, one class each (``cat.tar`` reads as the folder ``cat/``), converted once for the module;
WebDataset shards, whose sibling label member relabels an image; and ImageNet as it ships (a tar of class tars).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import shutil
import tarfile
import zipfile
import zlib

import pytest
from PIL import Image

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.source_stamps import SourceStamps
from beam_jobs.stage_records import ImageRef
from record_files import versions
from tests.archive_data import imagenet_archives, webdataset_shards
from tests.conftest import write_imagenet_tree
from tests.converter.test_update import FAST
from tests.update_data import assert_unchanged_kept
from tests.update_data import version_records as _records


def _jpeg(seed: int) -> bytes:
    rng = random.Random(seed)
    data = io.BytesIO()
    Image.new("RGB", (24, 20), tuple(rng.randrange(256) for _ in range(3))).save(data, "JPEG", quality=90)
    return data.getvalue()


def _write(src: str, members: dict[str, dict[str, tuple[bytes, int]]]) -> None:
    """Each archive (``cat.tar``, ``dog.zip``, ``bird.tar.gz``) of ``members`` (name -> (bytes, mtime)), written anew
    only when its members differ from what is there (an archive left alone keeps its own stamp)."""
    for archive, files in members.items():
        path = os.path.join(src, archive)
        if archive.endswith(".zip"):
            data = io.BytesIO()
            with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as out:
                for name, (content, mtime) in sorted(files.items()):
                    out.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, mtime % 60)), content)
        else:
            data = io.BytesIO()
            with tarfile.open(fileobj=data, mode="w:gz" if archive.endswith(".gz") else "w",
                              format=tarfile.GNU_FORMAT) as out:
                for name, (content, mtime) in sorted(files.items()):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(content), mtime
                    out.addfile(info, io.BytesIO(content))
        if os.path.exists(path) and _members_of(path) == files:
            continue
        with open(path, "wb") as handle:
            handle.write(data.getvalue())


def _members_of(path: str) -> dict:
    if path.endswith(".zip"):
        with zipfile.ZipFile(path) as archive:
            return {info.filename: (archive.read(info), info.date_time[5]) for info in archive.infolist()}
    with tarfile.open(path) as archive:
        return {info.name: (archive.extractfile(info).read(), int(info.mtime)) for info in archive.getmembers()}


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, val_fraction=0.25, near_distance=3, shards=2)


def _expected(members: dict) -> dict[str, tuple[str, bytes]]:
    """path -> (class, bytes) of every member: ``cat.tar``'s ``3.jpg`` is ``cat/3.jpg``, of class cat."""
    return {f"{archive.split('.')[0]}/{name}": (archive.split(".")[0], content)
            for archive, files in members.items() for name, (content, _) in files.items()}


def _check(out: str, members: dict, before: dict, changed: set[str]) -> dict:
    """The latest version holds exactly SRC's members; each unchanged one keeps split, class and shard file (a
    masked shard is reused whole; only a compacted one moves its survivors)."""
    now = _records(out)
    assert {path: (cls, data) for path, (_, cls, _, data) in now.items()} == _expected(members)
    assert_unchanged_kept(out, now, before, changed)
    return now


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[str, dict, dict]:
    """``(root holding src and out, members, records)``: the archives, converted once for the module."""
    root = str(tmp_path_factory.mktemp("archives"))
    members = {archive: {f"{i}.jpg": (_jpeg(seed * 100 + i), 1_700_000_000 + i) for i in range(5)}
               for seed, archive in enumerate(("cat.tar", "dog.zip", "bird.tar.gz"))}
    os.makedirs(os.path.join(root, "src"))
    _write(os.path.join(root, "src"), members)
    conversion.run(_options(os.path.join(root, "src"), os.path.join(root, "out")), FAST, show_progress=False)
    return root, members, _check(os.path.join(root, "out"), members, {}, set())


def _copy(converted, tmp_path) -> tuple[str, str, dict, dict]:
    root, members, records = converted
    shutil.copytree(os.path.join(root, "src"), tmp_path / "src", copy_function=shutil.copy2)  # stamps kept
    shutil.copytree(os.path.join(root, "out"), tmp_path / "out")
    return str(tmp_path / "src"), str(tmp_path / "out"), {a: dict(f) for a, f in members.items()}, records


@pytest.mark.slow
def test_members_added_changed_and_deleted_update_as_files_do_and_match_a_fresh_conversion(converted, tmp_path):
    src, out, members, first = _copy(converted, tmp_path)
    # The conversion stamped each member by its header (no byte to read on an update): a tar member's length and
    # mtime, a zip member's length and CRC-32.
    stamps = {row.path: (row.size, row.mtime_ns) for row in versions.iter_sources(os.path.join(out, "sources.parquet"))}
    assert stamps == {f"{archive.split('.')[0]}/{name}": (len(data), zlib.crc32(data) if archive.endswith(".zip")
                                                           else mtime * 10**9)
                      for archive, files in members.items() for name, (data, mtime) in files.items()}
    assert update.run(_options(src, out), FAST).version is None  # the same archives: nothing changed

    # cat.tar: a member added, one changed (other bytes, a new mtime), one deleted; dog.zip: a member's bytes
    # changed at the same size and time (its CRC-32 tells), one added; bird.tar.gz: a member added (read from the
    # inflated copy, which the update puts in its work folder as a conversion does).
    members["cat.tar"]["9.jpg"] = (_jpeg(909), 1_700_000_100)
    members["cat.tar"]["1.jpg"] = (_jpeg(901), 1_700_000_101)
    del members["cat.tar"]["2.jpg"]
    old = members["dog.zip"]["3.jpg"][0]
    members["dog.zip"]["3.jpg"] = (old[:-3] + bytes([old[-3] ^ 1]) + old[-2:], members["dog.zip"]["3.jpg"][1])
    members["dog.zip"]["7.jpg"] = (_jpeg(907), 1_700_000_107)
    members["bird.tar.gz"]["8.jpg"] = (_jpeg(908), 1_700_000_108)
    _write(src, members)
    done = update.run(_options(src, out), FAST)
    assert (done.version, done.changes["added"], done.changes["changed"], done.changes["deleted"]) == (2, 3, 2, 1)
    _check(out, members, first, {"cat/1.jpg", "dog/3.jpg"})

    # Nothing changed since: no version; --rehash reads every member's bytes and finds them the same.
    assert update.run(_options(src, out), FAST).version is None
    assert update.run(_options(src, out), FAST, rehash=True).version is None

    # What a fresh conversion of the new SRC holds, record by record (bytes and class; splits are the update's).
    fresh = str(tmp_path / "fresh")
    conversion.run(_options(src, fresh), FAST, show_progress=False)
    assert {p: r[1:2] + r[3:] for p, r in _records(out).items()} == {p: r[1:2] + r[3:] for p, r in _records(fresh).items()}


@pytest.mark.slow
def test_an_archive_rewritten_with_the_same_members_is_unchanged_and_a_deleted_archive_deletes_its_members(
        converted, tmp_path):
    src, out, members, first = _copy(converted, tmp_path)
    # The same members written into a new file (a new archive stamp, the same headers): nothing to convert.
    os.remove(os.path.join(src, "cat.tar"))
    _write(src, members)
    assert update.run(_options(src, out), FAST).version is None
    os.remove(os.path.join(src, "bird.tar.gz"))
    del members["bird.tar.gz"]
    done = update.run(_options(src, out), FAST)
    assert (done.version, done.changes["deleted"], done.changes["added"]) == (2, 5, 0)
    _check(out, members, first, set())
    # A version that converted nothing records SRC's archives as they are now (the next update trusts their headers).
    manifest = json.load(open(os.path.join(out, versions.manifest_path(2))))
    assert sorted(manifest["source_archives"]) == ["cat.tar", "dog.zip"]
    cat = os.path.join(src, "cat.tar")  # rewritten above: not version 1's identity
    assert manifest["source_archives"]["cat.tar"] == f"{os.path.getsize(cat)} bytes, modified {os.path.getmtime(cat)!r}"
    # A tar member rewritten at the same size and header time (tarfile's default 0, ``tar --mtime``): its header
    # cannot tell, the tar's own stamp does, so its members are compared by their bytes (the review's U1).
    old, mtime = members["cat.tar"]["3.jpg"]
    members["cat.tar"]["3.jpg"] = (old[:-3] + bytes([old[-3] ^ 1]) + old[-2:], mtime)
    _write(src, members)
    done = update.run(_options(src, out), FAST)
    assert (done.version, done.changes["changed"], done.changes["added"], done.changes["deleted"]) == (3, 1, 0, 0)
    _check(out, members, first, {"cat/3.jpg"})


def test_a_tar_members_header_decides_only_while_its_tar_is_the_recorded_one(tmp_path):
    """A tar member's equal stamp says unchanged only while its tar's own identity is the one the latest version
    recorded; where none was recorded (a manifest without ``source_archives``), not for a header time of 0. A zip
    member's CRC-32 always decides."""
    member = lambda stamp: archive_members.Member("x.jpg", 512, 10, 10, stamp=stamp)
    tar, zipped = (ImageRef("train", "a/x.jpg", 0, archive_members.locator(name, member(0)))
                   for name in ("a.tar", "b.zip"))
    stamped = ImageRef("train", "a/y.jpg", 0, archive_members.locator("a.tar", member(10**18)))
    now = {"a.tar": "2048 bytes, modified 2.0", "b.zip": "99 bytes, modified 1.0"}
    same = SourceStamps(str(tmp_path), archives=now, recorded=dict(now))
    changed = SourceStamps(str(tmp_path), archives=now, recorded={"a.tar": "2048 bytes, modified 1.0"})
    unknown = SourceStamps(str(tmp_path), archives=now)
    assert [same.stamp_decides(ref) for ref in (tar, stamped, zipped)] == [True, True, True]
    assert [changed.stamp_decides(ref) for ref in (tar, stamped, zipped)] == [False, False, True]
    assert changed.reads_bytes(tar) and not same.reads_bytes(tar)
    assert [unknown.stamp_decides(ref) for ref in (tar, stamped, zipped)] == [False, True, True]


@pytest.mark.slow
def test_a_webdataset_sample_relabelled_by_its_label_member_is_a_changed_image(tmp_path):
    """WebDataset (``--label-member``): the image member's header is unchanged, its sibling ``.json`` says another
    class: a relabelled image, the rest unchanged (their shard reused or masked, not rewritten)."""
    tree = tmp_path / "tree"
    for cls in ("cat", "dog"):
        (tree / cls).mkdir(parents=True)
        for i in range(4):
            (tree / cls / f"{i}.jpg").write_bytes(_jpeg(sum(map(ord, cls)) + i))
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    webdataset_shards(tree, src, shards=2)
    options = dataclasses.replace(_options(src, out), val_fraction=0.0, label_member="json:label")
    conversion.run(options, FAST, show_progress=False)
    before = _records(out)
    path = os.path.join(src, "00000.tar")
    members = {name: data for name, (data, _) in _members_of(path).items()}
    label = next(name for name in sorted(members) if name.endswith(".json"))
    flipped = {"cat": "dog", "dog": "cat"}[json.loads(members[label])["label"]]
    members[label] = json.dumps({"label": flipped}).encode()
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:  # the same headers, but the label's size
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    done = update.run(options, FAST)
    assert (done.changes["changed"], done.changes["relabelled"], done.changes["added"]) == (1, 1, 0)
    now = _records(out)
    image = "00000/" + label[:-len(".json")] + ".jpg"
    assert now[image][1] == flipped and set(now) == set(before)
    assert all(now[p][:3] == before[p][:3] for p in before if p != image)
    assert update.run(options, FAST).version is None


@pytest.mark.slow
def test_imagenet_as_it_ships_updates_a_class_tar_inside_the_train_tar_and_a_relabelled_val_image(tmp_path):
    """ImageNet (``--val-labels``, ``--synsets``) in its archives: the train tar of class tars rewritten with an
    image added to one class tar (members inside a member: each stamped by its own header), and the val labels
    file relabelling one image; the rest unchanged; the version holds exactly SRC (checked record by record
    against the version before, not by a second conversion: the first test compares one)."""
    images = {kind: _jpeg(seed) for seed, kind in enumerate(
        ("jpeg_rgb", "png_rgb", "jpeg_cmyk", "jpeg_gray", "jpeg_progressive", "jpeg_exif_rotated"))}
    tree, labels = tmp_path / "tree", tmp_path / "labels"
    labels.mkdir()
    write_imagenet_tree(tree, labels, images)
    src = imagenet_archives(tree, tmp_path / "src")
    options = ConvertOptions(src=src, out=str(tmp_path / "out"), near_distance=3, shards=2,
                             val_labels=str(labels / "LOC_val_solution.csv"),
                             synsets=str(labels / "LOC_synset_mapping.txt"))
    conversion.run(options, FAST, show_progress=False)
    before = _records(options.out)
    assert update.run(options, FAST).version is None
    solution = labels / "LOC_val_solution.csv"
    solution.write_text(solution.read_text().replace("ILSVRC2012_val_00000002,n01440764",
                                                     "ILSVRC2012_val_00000002,n01443537"))
    (tree / "train" / "n01440764" / "n01440764_9.JPEG").write_bytes(_jpeg(99))
    imagenet_archives(tree, tmp_path / "src")  # every archive written anew: the same headers but one
    done = update.run(options, FAST)
    assert (done.changes["added"], done.changes["changed"], done.changes["relabelled"], done.changes["deleted"]) == (
        1, 1, 1, 0)
    # Exactly SRC (without a second conversion): the records before and the added image, its bytes; every kept
    # record as it was (split, class, shard, bytes); the relabelled image in its new class, its bytes the same.
    now = _records(options.out)
    relabelled, added = "val/ILSVRC2012_val_00000002.JPEG", "train/n01440764/n01440764_9.JPEG"
    assert set(now) == set(before) | {added}
    assert now[added][1:2] + now[added][3:] == ("n01440764", _jpeg(99))
    assert all(now[p] == before[p] for p in before if p != relabelled)
    assert (now[relabelled][1], now[relabelled][3]) == ("n01443537", before[relabelled][3])
    assert update.run(options, FAST).version is None
