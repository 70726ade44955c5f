"""``--update`` of a label file's images (issue #59): a label is the file's, not the folder's.

The rule of tests/converter/test_update.py, for a source whose labels and splits are cells of a table: the latest
version holds exactly the rows the label file lists, each labelled as the file says; an image listed as before
keeps its split, id and shard file; an image the file labels otherwise (the same bytes) is a changed image,
written anew in the split it had; a new class gets the next id; a row removed deletes its record though the file
stays in SRC. One conversion and its updates in this process, on the in-memory runner.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from reader.frames import extent_records
from reader.info import dataset_info
from record_files import versions
from tests.converter.test_update import FAST, _image, _records


def _write_labels(path: str, rows: dict[str, str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("path,label\n" + "".join(f"{name},{label}\n" for name, label in sorted(rows.items())))


def _options(src: str, out: str) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, annotations=os.path.join(src, "labels.csv"), val_fraction=0.25,
                          near_distance=3, shards=2)


@pytest.fixture(scope="module")
def updated(tmp_path_factory):
    """A label file's 12 images converted, then updated once (2 relabelled, 1 row removed, 2 added): SRC, OUT,
    the rows listed now, version 1's records and the update's summary. Shared: one conversion for the tests."""
    tmp_path = tmp_path_factory.mktemp("label-file")
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    rows = {}
    for i in range(12):
        _image(os.path.join(src, "img", f"{i}.jpg"), 300 + i)
        rows[f"img/{i}.jpg"] = ("cat", "dog")[i % 2]
    _write_labels(os.path.join(src, "labels.csv"), rows)  # in SRC, as a Kaggle export ships it: never an image
    conversion.run(_options(src, out), FAST, show_progress=False)
    first = _records(out)
    assert dataset_info(out).classes == ("cat", "dog") and set(first) == set(rows)

    # The same bytes under other labels (one a new class), a row removed (its file stays), two rows added.
    rows.update({"img/1.jpg": "cat", "img/2.jpg": "bird"})
    del rows["img/3.jpg"]
    for name, label in (("new0", "bird"), ("new1", "cat")):
        _image(os.path.join(src, "img", f"{name}.jpg"), sum(map(ord, name)))
        rows[f"img/{name}.jpg"] = label
    _write_labels(os.path.join(src, "labels.csv"), rows)
    return src, out, rows, first, update.run(_options(src, out), FAST)


@pytest.mark.slow
def test_a_relabelled_row_is_a_changed_image_in_its_split_a_new_class_the_next_id_a_removed_row_deleted(updated):
    src, out, rows, first, done = updated
    assert done.version == 2, done
    assert {key: done.changes[key] for key in ("added", "changed", "relabelled", "deleted")} == \
        {"added": 2, "changed": 2, "relabelled": 2, "deleted": 1}

    info, now = dataset_info(out), _records(out)
    assert info.classes == ("cat", "dog", "bird")  # stable ids: the new class is the next one
    assert set(now) == set(rows)  # img/3.jpg is in SRC still, but listed no more: deleted
    for path, label in rows.items():
        assert info.classes[now[path][1]] == label, path
    relabelled = {"img/1.jpg", "img/2.jpg"}
    compacted = {first[path][2] for path in relabelled | {"img/3.jpg"}}
    for path, (split, label, shard) in first.items():
        if path in relabelled:
            assert now[path][0] == split, path  # written anew, in the split it had
            assert not now[path][2].startswith(versions.VERSIONS_DIR + "/00002/compacted"), path
        elif path in now:
            assert now[path][:2] == (split, label), path
            if shard not in compacted:
                assert now[path][2] == shard, path

    # The labels recorded in version 2's sources table are read back: nothing changed, no version, with or
    # without --rehash.
    assert update.run(_options(src, out), FAST).version is None
    assert update.run(_options(src, out), FAST, rehash=True).version is None
    assert _records(out, version=1) == first


def test_a_split_a_label_file_states_anew_converts_the_image_into_it_without_a_carve(tmp_path):
    """In process, no conversion: without --val-fraction the split SRC states is the image's, so a label file that
    moves an image (same bytes, same label) makes it a changed image in the stated split; a row recorded before
    labels (UNKNOWN) is compared by its stamp alone."""
    from beam_jobs.planning import changes
    from beam_jobs.stage_records import ImageRef

    (tmp_path / "img").mkdir()
    rows = []
    for name in ("a", "b", "c"):
        (tmp_path / "img" / f"{name}.jpg").write_bytes(name.encode())
        stat = os.stat(tmp_path / "img" / f"{name}.jpg")
        rows.append(versions.SourceRow(f"img/{name}.jpg", "train", "s0", len(rows), stat.st_size, stat.st_mtime_ns,
                                       "ab" * 32, "", label=0 if name != "c" else versions.UNKNOWN))
    refs = [ImageRef("test", "img/a.jpg", 0), ImageRef("train", "img/b.jpg", 1), ImageRef("train", "img/c.jpg", 1)]
    (tmp_path / "scratch").mkdir()
    found = changes.compare(refs, str(tmp_path), ["x", "y"], iter(rows), ["x"], 0.0, 0,
                            scratch=str(tmp_path / "scratch"))
    assert found.classes == ("x", "y")
    assert [(ref.relpath, ref.split, ref.label) for ref in found.refs] == [("img/a.jpg", "test", 0),
                                                                           ("img/b.jpg", "train", 1)]
    assert (found.changed, found.relabelled, found.added, found.deleted) == (2, 1, 0, 0)
    # The unchanged row is written back with the label it has now; a relabel of it was not seen: the update
    # warns, naming the fresh conversion that would see it.
    assert [(row.path, row.label) for row, _ in found.unchanged] == [("img/c.jpg", 1)]
    from beam_jobs.update import checks

    assert found.unlabelled == 1
    options = ConvertOptions(src=str(tmp_path), out="OUT", annotations="labels.csv")
    warning = checks.unlabelled_warning(options, 3, found.unlabelled)
    assert "1 image(s) of version 3 of OUT have no label recorded" in warning and "--overwrite" in warning
    assert checks.unlabelled_warning(dataclasses.replace(options, annotations=None), 3, 1) is None
    assert checks.unlabelled_warning(options, 3, 0) is None


def test_a_listed_file_still_missing_stays_rejected_and_changes_nothing(tmp_path):
    """A label file that lists a file SRC lacks: the conversion rejected it (missing-file); listed again and still
    missing, it is the same rejection, unchanged, not a deletion that would publish a version of nothing. One
    rejected for another reason (corrupt) whose file is gone now is not kept under that reason: a changed image,
    converted again, which its read rejects as missing-file."""
    from beam_jobs.planning import changes
    from beam_jobs.stage_records import ImageRef

    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(b"a")
    stat = os.stat(tmp_path / "img" / "a.jpg")
    rows = [versions.SourceRow("img/a.jpg", "train", "s0", 0, stat.st_size, stat.st_mtime_ns, "ab" * 32, "", 0),
            versions.SourceRow("img/corrupt.jpg", "", "", -1, 12, 34, ""),
            versions.SourceRow("img/gone.jpg", "", "", -1, versions.UNKNOWN, versions.UNKNOWN, "")]
    refs = [ImageRef("train", name, 0) for name in ("img/a.jpg", "img/corrupt.jpg", "img/gone.jpg")]
    (tmp_path / "scratch").mkdir()
    found = changes.compare(refs[::2], str(tmp_path), ["x"], iter(rows[::2]), ["x"], 0.0, 0,
                            scratch=str(tmp_path / "scratch"), missing_before={"img/gone.jpg"})
    assert found.nothing and found.rejected_kept == {"img/gone.jpg"}
    assert [row for row, _ in found.unchanged] == rows[::2]

    found = changes.compare(refs, str(tmp_path), ["x"], iter(rows), ["x"], 0.0, 0, scratch=str(tmp_path / "scratch"),
                            missing_before={"img/gone.jpg"})
    assert (found.changed, found.added, found.deleted) == (1, 0, 0) and found.rejected_kept == {"img/gone.jpg"}
    assert [(ref.relpath, ref.split) for ref in found.refs] == [("img/corrupt.jpg", "train")]
    assert found.stamps["img/corrupt.jpg"] == (versions.UNKNOWN, versions.UNKNOWN)
    assert found.source_sha256("img/corrupt.jpg") == ""  # its row: a rejection without a stamp or a hash


@pytest.mark.slow
def test_the_dataset_commands_take_a_version_and_name_the_versions_there_are_for_one_that_is_not(
        updated, tmp_path, capsys):
    """verify, inspect, report and card read ``--version N`` (default: the latest), each version's own files
    with it; a version OUT does not have is an error naming it and the versions it has; reindex rebuilds the
    shards' indexes of every version. In process."""
    from converter import card, dataset_commands

    _, out, rows, first, _ = updated
    for version, images in ((1, len(first)), (2, len(rows)), (None, len(rows))):
        flag = ["--version", str(version)] if version else []
        assert dataset_commands.verify([out, *flag]) == 0, capsys.readouterr()
        assert f"{images} records" in capsys.readouterr().out
        assert dataset_commands.inspect([out, *flag]) == 0
        assert f"{images} images" in capsys.readouterr().out
    dest = tmp_path / "report"
    dest.mkdir()
    assert dataset_commands.report([out, "--version", "1", "--dest", str(dest)]) == 0
    figures = json.loads((dest / "report.json").read_text())["splits"]  # version 1's: 12 images, 2 classes
    assert sum(split["images"] for split in figures["splits"].values()) == len(first)
    assert figures["croissant"].endswith("out/croissant.json")
    assert dataset_commands.report([out, "--dest", str(dest)]) == 0  # the latest: version 2, its own card
    figures = json.loads((dest / "report.json").read_text())
    assert sum(split["images"] for split in figures["splits"]["splits"].values()) == len(rows)
    assert figures["splits"]["croissant"].endswith("out/versions/00002/croissant.json")
    assert figures["classes"]["label_map"] == {"0": "cat", "1": "dog", "2": "bird"}
    # reindex rebuilds the indexes of every version's shards: one only version 1 reads (compacted since) and one
    # of version 2's own.
    only_first = {shard.index_path for split in dataset_info(out, version=1).splits.values() for shard in split.shards}
    only_first -= {shard.index_path for split in dataset_info(out).splits.values() for shard in split.shards}
    own = next(shard.index_path for split in dataset_info(out).splits.values() for shard in split.shards
               if "/versions/00002/" in shard.index_path)
    lost = sorted(only_first)[:1] + [own]
    kept = {path: open(path, "rb").read() for path in lost}
    for path in lost:
        os.remove(path)
    assert dataset_commands.reindex([out]) == 0
    assert "rebuilt 2 record indexes" in capsys.readouterr().out
    assert {path: open(path, "rb").read() for path in lost} == kept
    assert card.main([out, "--version", "2"]) == 0
    assert os.path.exists(os.path.join(out, versions.in_version(2, "croissant.json")))
    for command in (dataset_commands.verify, dataset_commands.inspect):
        assert command([out, "--version", "3"]) == 1
        assert "version 3 of " in capsys.readouterr().err
    assert dataset_commands.report([out, "--version", "3", "--dest", str(dest)]) == 1
    err = capsys.readouterr().err
    assert "version 3 of" in err and "it has versions 1, 2" in err, err
    assert card.main([out, "--version", "3"]) == 1
    assert "it has versions 1, 2" in capsys.readouterr().err


def _files_mlcroissant_reads(card: str) -> tuple[list[str], list[str]]:
    """(every FileObject's file, the shards' FileSet's files) as mlcroissant resolves them from the card at
    ``card``, real paths, after checking the card has no error: what a user of the card opens."""
    import mlcroissant
    from mlcroissant._src.operation_graph.operations.download import get_download_filepath
    from mlcroissant._src.operation_graph.operations.filter import FilterFiles

    dataset = mlcroissant.Dataset(jsonld=card)
    assert not dataset.metadata.ctx.issues.errors, dataset.metadata.ctx.issues.errors
    objects = [os.path.realpath(get_download_filepath(node)) for node in dataset.metadata.distribution
               if isinstance(node, mlcroissant.FileObject)]
    graph = dataset.operations.operations
    (listing,) = [op for op in graph.nodes if isinstance(op, FilterFiles) and op.node.id == "tfrecord-shards"]
    found = listing.call(*[op.call() for op in graph.predecessors(listing)])
    return objects, sorted(os.path.realpath(path.filepath) for path in found)


@pytest.mark.slow
def test_every_version_s_croissant_card_resolves_its_own_shards_from_its_folder(updated, monkeypatch):
    """mlcroissant resolves a card's URLs against the card's folder: version 2's (in versions/00002/, written by
    the update and again by ``converter card OUT``) reaches every shard it reads, reused from OUT's top,
    compacted or new, and no other; version 1's card still reads version 1's shards."""
    from converter import card as card_command
    from record_files import croissant

    _, out, _, _, _ = updated
    for version in (1, 2):
        shards = sorted(os.path.realpath(shard.path) for split in dataset_info(out, version=version).splits.values()
                        for shard in split.shards)
        path = os.path.join(out, versions.in_version(version, croissant.CROISSANT_FILE))
        written = open(path, encoding="utf-8").read()
        objects, listed = _files_mlcroissant_reads(path)
        assert sorted(objects) == listed == shards, version
        if version == 2:
            assert any("/compacted/" in name for name in shards) and any(
                os.path.dirname(name) == os.path.realpath(out) for name in shards)
            assert card_command.main([out]) == 0  # the latest version's, the same card
            assert open(path, encoding="utf-8").read() == written
            monkeypatch.chdir(out)  # named for the folder, not "."
            assert card_command.main(["."]) == 0 and open(path, encoding="utf-8").read() == written


def test_a_missing_version_is_named_with_the_versions_there_are():
    assert versions.missing_version(9, [1, 2, 3, 4], "OUT") == (
        "version 9 of OUT does not exist: it has versions 1 to 4 (python -m converter versions lists them)")
    assert "it has versions 3, 5 (older versions were pruned)" in versions.missing_version(1, [3, 5], "OUT")
    assert "it has version 1 " in versions.missing_version(2, [1], "OUT")
    assert "no version at all" in versions.missing_version(1, [], "OUT")


def _tags(out: str) -> dict[str, tuple[str, ...]]:
    """path -> the class names of every record the latest version reads (a multi-label record's list)."""
    import tensorflow as tf

    info, found = dataset_info(out), {}
    for split in info.splits.values():
        for shard in split.shards:  # extents: a masked shard's runs only
            for raw in extent_records(shard.path, shard.index_path, shard.first, shard.num_examples):
                feature = tf.train.Example.FromString(raw).features.feature
                path = feature["image/filename"].bytes_list.value[0].decode()
                found[path] = tuple(sorted(info.classes[i] for i in feature["image/class/label"].int64_list.value))
    return found


@pytest.mark.slow
def test_a_multi_label_file_updates_tag_sets_as_labels(tmp_path):
    """Planet's layout (image_name,tags; ids without their extension; space-separated tags): a changed tag set of
    the same bytes is a relabelled image, a new tag the next id, an image's per-class counts kept exact."""
    src, out = str(tmp_path / "train-jpg"), str(tmp_path / "out")
    tags = {"train_0": "haze primary", "train_1": "clear primary water", "train_2": "clear", "train_3": "cloudy",
            "train_4": "", "train_5": "water haze"}
    for i in range(7):
        _image(os.path.join(src, f"train_{i}.jpg"), 700 + i)

    def options() -> ConvertOptions:
        with open(os.path.join(str(tmp_path), "tags.csv"), "w", encoding="utf-8") as handle:
            handle.write("image_name,tags\n" + "".join(f"{name},{cell}\n" for name, cell in sorted(tags.items())))
        return ConvertOptions(src=src, out=out, annotations=os.path.join(str(tmp_path), "tags.csv"), shards=1,
                              annotation_columns=("image_name", "tags"), label_separator=" ", near_distance=3)

    conversion.run(options(), FAST, show_progress=False)
    assert dataset_info(out).classes == ("clear", "cloudy", "haze", "primary", "water")
    tags.update({"train_2": "clear water", "train_5": "water haze fog", "train_6": "fog"})
    del tags["train_3"]
    done = update.run(options(), FAST)
    assert {key: done.changes[key] for key in ("added", "changed", "relabelled", "deleted")} == \
        {"added": 1, "changed": 2, "relabelled": 2, "deleted": 1}
    info = dataset_info(out)
    assert info.classes == ("clear", "cloudy", "haze", "primary", "water", "fog")
    assert _tags(out) == {f"{name}.jpg": tuple(sorted(cell.split())) for name, cell in tags.items()}
    # Images per class: the unchanged records' ids counted with the new ones' (cloudy lost its one image).
    counts = [sum(name in cell.split() for cell in tags.values()) for name in info.classes]
    assert list(info.splits["train"].label_counts) == counts == [2, 0, 2, 2, 3, 2]
    assert update.run(options(), FAST).version is None


def test_a_shard_that_lost_every_record_counts_as_emptied_not_compacted(tmp_path):
    """compacted_shards counts the shards written anew (format.md: "new shards"); one whose every record went is
    not written: emptied_shards."""
    from beam_jobs.planning import changes
    from beam_jobs.stage_records import ImageRef

    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(b"a")
    stat = os.stat(tmp_path / "img" / "a.jpg")
    rows = [versions.SourceRow("img/a.jpg", "train", "s0", 0, stat.st_size, stat.st_mtime_ns, "ab" * 32, "", 0),
            versions.SourceRow("img/b.jpg", "train", "s1", 0, 1, 1, "cd" * 32, "", 0)]
    (tmp_path / "scratch").mkdir()
    found = changes.compare([ImageRef("train", "img/a.jpg", 0)], str(tmp_path), ["x"], iter(rows), ["x"], 0.0, 0,
                            scratch=str(tmp_path / "scratch"))
    counts = found.counts()
    assert (counts["deleted"], counts["compacted_shards"], counts["emptied_shards"]) == (1, 0, 1)
    assert found.reused == {"s0"}
