"""Every source names each file of SRC it skips (``skipped.jsonl``: path, reason, detail), not only counts it.

YOLO, the Hub's Parquet, label files, ImageNet and WebDataset once counted theirs without naming them (and some
counted none: a README beside a Roboflow YOLO export, a file a label file does not list). Each test here builds a
small export shaped as the real one ships (Roboflow's YOLOv8 export, a ``huggingface-cli download`` snapshot, a
Kaggle-style CSV beside its images, ILSVRC-2012 as Kaggle ships it, img2dataset's samples), with the files such
trees hold besides (READMEs, caches, an unlabelled test split, the OS's litter), and checks that every file
under SRC is exactly one of: an image planned, an annotation file read, a file named in ``skipped.jsonl``, and
that the plan's counts are those lines'.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.sources import plan_inputs
from tests.archive_data import zip_folder
from tests.object_data import jpeg, picture, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _files(root: pathlib.Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


def _named(plan) -> dict[str, str]:
    """``{path: reason}`` of the plan's skipped files, checked against its counts (each counted file named)."""
    lines = [json.loads(line) for line in plan.skipped_files.lines()]
    assert all(line["detail"] for line in lines), lines
    named = {line["path"]: line["reason"] for line in lines}
    assert len(named) == len(lines)
    counts: dict[str, int] = {}
    for reason in named.values():
        counts[reason] = counts.get(reason, 0) + 1
    assert dict(plan.skipped) == dict(sorted(counts.items()))
    return named


def _accounted(root: pathlib.Path, plan, read: set[str]) -> dict[str, str]:
    """Every file under ``root`` is planned, read, or named as skipped (one of the three); the named ones."""
    planned = {ref.relpath for ref in plan.refs}
    named = _named(plan)
    assert not planned & set(named) and not read & set(named) and not planned & read
    assert _files(root) == planned | read | set(named)
    return named


def _image(seed: int = 0) -> bytes:
    return jpeg(picture(16, 12, [], seed=seed))


# --- YOLO: Roboflow's YOLOv8 export ----------------------------------------------------------------------------


def _roboflow_yolo(root: pathlib.Path) -> None:
    write_file(str(root / "data.yaml"), "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n"
               "nc: 1\nnames: ['can']\n")
    write_file(str(root / "README.dataset.txt"), "# cans > 2023\nLicense: CC BY 4.0\n")
    write_file(str(root / "README.roboflow.txt"), "Roboflow is an end-to-end computer vision platform\n")
    for split, stems in (("train", ("a", "b")), ("valid", ("c",)), ("test", ("d",))):
        for index, stem in enumerate(stems):
            write_file(str(root / split / "images" / f"{stem}.jpg"), _image(index))
            write_file(str(root / split / "labels" / f"{stem}.txt"), "0 0.5 0.5 0.25 0.25\n")
    write_file(str(root / "valid/labels/gone.txt"), "0 0.5 0.5 0.25 0.25\n")  # its image deleted
    write_file(str(root / "train/labels.cache"), b"\x80\x04cache")  # what Ultralytics' trainer leaves
    write_file(str(root / "extra/images/e.jpg"), _image(5))  # no yaml key names extra/
    write_file(str(root / "extra/labels/e.txt"), "0 0.5 0.5 0.25 0.25\n")
    write_file(str(root / "train/images/.DS_Store"), b"\x00\x00\x00\x01Bud1")
    write_file(str(root / "annotations.json"), "{}")  # an annotation file of another tool


def test_a_yolo_export_names_its_readmes_caches_orphan_labels_and_images_outside_the_yaml(tmp_path):
    root = tmp_path / "cans"
    _roboflow_yolo(root)
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))
    labels = {f"{split}/labels/{stem}.txt" for split, stem in (("train", "a"), ("train", "b"), ("valid", "c"),
                                                                 ("test", "d"))}
    named = _accounted(root, plan, {"data.yaml"} | labels)
    assert named == {"README.dataset.txt": "not-an-image", "README.roboflow.txt": "not-an-image",
                     "train/labels.cache": "not-an-image", "valid/labels/gone.txt": "no-image",
                     "extra/images/e.jpg": "not-in-yaml-folders", "extra/labels/e.txt": "not-in-yaml-folders",
                     "train/images/.DS_Store": "system-file", "annotations.json": "annotations-not-read"}
    assert any("annotations.json: an annotation file that no source read" in w for w in plan.warnings)


def test_a_yolo_conversion_writes_the_skipped_files_it_names(tmp_path):
    root = tmp_path / "cans"
    _roboflow_yolo(root)
    out = tmp_path / "out"
    run(ConvertOptions(src=str(root), out=str(out), shards=1), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    lines = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert manifest["num_skipped"] == manifest["num_skipped_listed"] == len(lines) == 8
    assert {line["path"] for line in lines} >= {"valid/labels/gone.txt", "extra/images/e.jpg"}


# --- The Hub's Parquet: a snapshot as huggingface-cli download leaves it ---------------------------------------


def test_a_hub_snapshot_names_its_other_splits_metadata_and_litter(tmp_path):
    from tests import hub_data

    root = tmp_path / "snapshot"
    hub_data.write_split(str(root / "data"), "train", hub_data.rows(4, 0))
    hub_data.write_split(str(root / "data"), "unsupervised", hub_data.rows(2, 50))  # imdb's: no such split here
    write_file(str(root / "README.md"), "---\nlicense: mit\n---\n# A test dataset\n")
    write_file(str(root / ".gitattributes"), "*.parquet filter=lfs diff=lfs merge=lfs -text\n")
    write_file(str(root / "dataset_infos.json"), "{}")  # the Hub's older metadata
    write_file(str(root / "LICENSE"), "MIT\n")
    write_file(str(root / "samples/one.jpg"), _image())
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))
    assert plan.split_sizes() == {"train": 4}
    named = _named(plan)
    assert named == {"data/unsupervised-00000-of-00001.parquet": "other-split", ".gitattributes": "hidden",
                     "dataset_infos.json": "annotations-not-read", "LICENSE": "not-an-image",
                     "samples/one.jpg": "not-in-layout"}
    assert not any("dataset_infos.json" in w for w in plan.warnings)  # the datasets library's own: no warning
    assert _files(root) == set(named) | {"README.md", "data/train-00000-of-00001.parquet"}

    hub_data.write_split(str(root / "small"), "train", hub_data.rows(2, 80))  # a second config
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out"), config="small"))
    assert plan.split_sizes() == {"train": 2}
    assert _named(plan)["data/train-00000-of-00001.parquet"] == "other-config"


# --- A label file beside its images (Kaggle's train.csv) -------------------------------------------------------


def _kaggle(root: pathlib.Path) -> None:
    for index, name in enumerate(("a", "b", "c")):
        write_file(str(root / "train" / f"{name}.jpg"), _image(index))
    write_file(str(root / "train.csv"), "id,breed\ntrain/a,cat\ntrain/b,dog\n")  # ids without extension
    write_file(str(root / "test/t.jpg"), _image(9))  # Kaggle's unlabelled test images
    write_file(str(root / "sample_submission.csv"), "id,cat,dog\n")
    write_file(str(root / "train/.hidden.jpg"), _image(3))


@pytest.mark.parametrize("scratch", [False, True], ids=["held", "in-hash-ranges"])
def test_a_label_file_names_every_file_under_src_it_does_not_list(tmp_path, scratch):
    root = tmp_path / "dogs"
    _kaggle(root)
    folder = tmp_path / "scratch"
    folder.mkdir()
    options = ConvertOptions(src=str(root), out=str(tmp_path / "out"), annotations=str(root / "train.csv"),
                             annotation_columns=("id", "breed"))
    plan = plan_inputs(options, scratch=str(folder) if scratch else None)
    named = _accounted(root, plan, {"train.csv"})
    assert named == {"train/c.jpg": "not-in-annotations", "test/t.jpg": "not-in-annotations",
                     "sample_submission.csv": "not-an-image", "train/.hidden.jpg": "hidden"}


def test_a_label_file_over_an_archive_names_the_members_it_does_not_list(tmp_path):
    tree = tmp_path / "tree"
    _kaggle(tree)
    (tree / "train.csv").unlink()
    labels = tmp_path / "train.csv"
    labels.write_text("path,label\ntrain/a.jpg,cat\ntrain/b.jpg,dog\n")
    archive = zip_folder(tree, tmp_path / "dogs.zip")
    plan = plan_inputs(ConvertOptions(src=archive, out=str(tmp_path / "out"), annotations=str(labels)))
    assert _named(plan) == {"train/c.jpg": "not-in-annotations", "test/t.jpg": "not-in-annotations",
                            "sample_submission.csv": "not-an-image", "train/.hidden.jpg": "hidden"}


# --- ImageNet as Kaggle ships it ---------------------------------------------------------------------------------


def test_imagenet_names_its_test_split_readme_and_what_lies_outside_train_and_val(tmp_path, sample_images):
    from tests.conftest import write_imagenet_tree

    root = tmp_path / "CLS-LOC"
    root.mkdir()
    write_imagenet_tree(root, root, sample_images)  # LOC_val_solution.csv and LOC_synset_mapping.txt inside SRC
    write_file(str(root / "test/ILSVRC2012_test_00000001.JPEG"), _image())
    write_file(str(root / "val/n01440764/moved.JPEG"), _image(1))  # a val image someone sorted into a class
    write_file(str(root / "val/.DS_Store"), b"\x00\x00\x00\x01Bud1")
    write_file(str(root / "README.txt"), "ILSVRC 2012\n")
    write_file(str(root / "train/n01440764/.n01440764_9.JPEG"), _image(2))
    options = ConvertOptions(src=str(root), out=str(tmp_path / "out"), val_labels=str(root / "LOC_val_solution.csv"),
                             synsets=str(root / "LOC_synset_mapping.txt"))
    plan = plan_inputs(options)
    assert plan.split_sizes() == {"train": 6, "validation": 4}
    named = _accounted(root, plan, {"LOC_val_solution.csv", "LOC_synset_mapping.txt"})
    assert named == {"test/ILSVRC2012_test_00000001.JPEG": "not-in-layout",
                     "val/n01440764/moved.JPEG": "not-in-layout", "val/.DS_Store": "system-file",
                     "README.txt": "not-an-image", "train/n01440764/.n01440764_9.JPEG": "hidden"}


# --- WebDataset samples (img2dataset) ----------------------------------------------------------------------------


def test_webdataset_names_each_label_member_and_metadata_member_it_does_not_convert(tmp_path):
    root = tmp_path / "shard"
    for index in range(3):
        key = f"00000{index:04d}"
        write_file(str(root / f"{key}.jpg"), _image(index))
        write_file(str(root / f"{key}.cls"), str(index % 2))
        write_file(str(root / f"{key}.json"), json.dumps({"label": index % 2, "caption": "a cat"}))
        write_file(str(root / f"{key}.txt"), "a cat")
    write_file(str(root / "._000000000.jpg"), b"\x00\x05\x16\x07")  # macOS's AppleDouble litter
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out"), label_member="cls"))
    named = _accounted(root, plan, set())
    assert named == {**{f"00000{i:04d}.{ext}": "sample-metadata" for i in range(3) for ext in ("cls", "json", "txt")},
                     "._000000000.jpg": "hidden"}
    assert not any("annotation file" in w for w in plan.warnings)  # a sample's .json is its metadata
