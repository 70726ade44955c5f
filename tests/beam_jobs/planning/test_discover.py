"""Listing SRC: layouts, label ids, skipped files, links, and the errors users meet."""

from __future__ import annotations

import collections
import os

import pytest

from beam_jobs.planning.discover import InputError, Listing, list_tree, plan_inputs, read_labels_file


def _touch(root, *relpaths):
    for rel in relpaths:
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(b"x")


def _by_split(plan):
    out = collections.defaultdict(list)
    for ref in plan.refs:
        out[ref.split].append((ref.relpath, plan.classes[ref.label]))
    return dict(out)


def test_class_folders_make_one_train_split_with_sorted_label_ids():
    plan = plan_inputs(Listing(("dog/b.jpg", "cat/a.jpg", "dog/sub/c.png")))
    assert plan.classes == ("cat", "dog")
    assert _by_split(plan) == {"train": [("cat/a.jpg", "cat"), ("dog/b.jpg", "dog"), ("dog/sub/c.png", "dog")]}


def test_roboflows_classification_export_reads_valid_as_the_validation_split():
    """Roboflow's folder export: train/, valid/, test/, each holding the class folders."""
    plan = plan_inputs(Listing(("train/cat/a.jpg", "valid/dog/b.jpg", "Test/cat/c.jpg")))
    assert plan.classes == ("cat", "dog")
    assert _by_split(plan) == {"train": [("train/cat/a.jpg", "cat")], "validation": [("valid/dog/b.jpg", "dog")],
                               "test": [("Test/cat/c.jpg", "cat")]}


def test_integer_class_folders_get_numeric_label_ids_as_a_label_file_gives_them(tmp_path):
    """Folders 0 1 2 10 are labels 0 1 2 3 in that order (Keras' string order would make 10 label 2)."""
    plan = plan_inputs(Listing(("10/a.jpg", "2/b.jpg", "0/c.jpg", "1/d.jpg")))
    assert plan.classes == ("0", "1", "2", "10")
    from beam_jobs.options import ConvertOptions
    from beam_jobs.sources import plan_inputs as plan_source

    _touch(tmp_path / "src", "x/a.jpg", "x/b.jpg", "x/c.jpg", "x/d.jpg")
    (tmp_path / "labels.csv").write_text("path,label\nx/a.jpg,10\nx/b.jpg,2\nx/c.jpg,0\nx/d.jpg,1\n")
    options = ConvertOptions(src=str(tmp_path / "src"), out=str(tmp_path / "out"),
                             annotations=str(tmp_path / "labels.csv"))
    assert plan_source(options, str(tmp_path)).classes == plan.classes
    mixed = plan_inputs(Listing(("10/a.jpg", "2/b.jpg", "cat/c.jpg")))
    assert mixed.classes == ("10", "2", "cat")  # not all integers: sorted as text


def test_classes_that_differ_only_in_case_are_a_warning():
    plan = plan_inputs(Listing(("Cat/a.jpg", "cat/b.jpg", "dog/c.jpg")))
    assert plan.classes == ("Cat", "cat", "dog")
    assert any("1 group of classes differs only in case (Cat / cat)" in w and "case-insensitive" in w
               for w in plan.warnings), plan.warnings


def test_split_folders_share_label_ids_even_when_a_class_is_missing_from_one():
    plan = plan_inputs(Listing(("train/cat/1.jpg", "train/dog/2.jpg", "train/emu/3.jpg", "val/emu/4.jpg", "test/dog/5.jpg")))
    assert plan.classes == ("cat", "dog", "emu")
    labels = {ref.relpath: ref.label for ref in plan.refs}
    assert labels["val/emu/4.jpg"] == labels["train/emu/3.jpg"] == 2
    assert {ref.split for ref in plan.refs} == {"train", "validation", "test"}


def test_labels_file_pins_ids_and_unknown_classes_are_an_error(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("zebra\ncat\ndog\n")
    names = read_labels_file(str(labels))
    plan = plan_inputs(Listing(("cat/a.jpg", "dog/b.jpg")), labels=names)
    assert plan.classes == ("zebra", "cat", "dog")
    assert [ref.label for ref in plan.refs] == [1, 2]
    with pytest.raises(InputError, match=r"\['emu'\] are not in --labels"):
        plan_inputs(Listing(("cat/a.jpg", "emu/b.jpg")), labels=names)


@pytest.mark.parametrize("text,message", [("", "is empty"), ("a\n\nb\n", "line 2 is blank"), ("a\nb\na\n", "more than once")])
def test_bad_labels_files_are_explained(tmp_path, text, message):
    labels = tmp_path / "labels.txt"
    labels.write_text(text)
    with pytest.raises(InputError, match=message):
        read_labels_file(str(labels))


def test_hidden_system_and_stray_files_are_skipped_and_counted():
    plan = plan_inputs(
        Listing(("README.md", "cat/.DS_Store", "cat/Thumbs.db", "cat/desktop.ini", ".git/x", "cat/.hidden.jpg", "cat/a.jpg"))
    )
    assert [ref.relpath for ref in plan.refs] == ["cat/a.jpg"]
    assert plan.skipped == {"hidden": 2, "stray-file": 1, "system-file": 3}


def test_an_empty_class_folder_is_an_error_naming_it():
    with pytest.raises(InputError, match="SRC/train/dog holds no images"):
        plan_inputs(Listing(("train/cat/a.jpg",), dirs=("train", "train/cat", "train/dog")))


def test_no_images_at_all_is_an_error():
    with pytest.raises(InputError, match="holds no images"):
        plan_inputs(Listing(("notes.txt",)))


def test_val_and_validation_together_are_an_error():
    with pytest.raises(InputError, match="same split twice"):
        plan_inputs(Listing(("val/cat/a.jpg", "validation/cat/b.jpg")))


def test_val_fraction_carves_a_stratified_deterministic_validation_split():
    files = tuple(f"{c}/{i:03d}.jpg" for c in ("cat", "dog") for i in range(50))
    plan = plan_inputs(Listing(files), val_fraction=0.2, seed=3)
    val = [ref for ref in plan.refs if ref.split == "validation"]
    assert collections.Counter(ref.label for ref in val) == {0: 10, 1: 10}
    assert plan == plan_inputs(Listing(tuple(reversed(files))), val_fraction=0.2, seed=3)
    other = plan_inputs(Listing(files), val_fraction=0.2, seed=4)
    assert {r.relpath for r in other.refs if r.split == "validation"} != {r.relpath for r in val}


def test_val_fraction_on_a_tree_with_splits_is_an_error():
    with pytest.raises(InputError, match="single-split"):
        plan_inputs(Listing(("train/cat/a.jpg", "test/cat/b.jpg")), val_fraction=0.1)


def test_listing_follows_links_without_looping_and_keeps_unicode_names(tmp_path):
    root = tmp_path / "src"
    _touch(str(root), "chat noir/été 1.jpg", "猫/画像.png", "dog/a.jpg")
    os.symlink(str(root), str(root / "dog" / "loop"))  # a loop back to the top
    os.symlink(str(root / "dog" / "a.jpg"), str(root / "dog" / "linked.jpg"))
    os.symlink(str(root / "missing"), str(root / "dog" / "dangling.jpg"))
    listing = list_tree(str(root))
    assert listing.files == ("chat noir/été 1.jpg", "dog/a.jpg", "dog/linked.jpg", "猫/画像.png")
    assert listing.skipped == {"repeated-folder-link": 1, "not-a-regular-file": 1}


def test_missing_src_is_an_error_naming_it(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        list_tree(str(tmp_path / "nope"))


def test_images_directly_in_src_are_named_with_the_layout_expected():
    with pytest.raises(InputError, match=r"3 files sit at its top level \(a.jpg, b.jpg, c.png\); expected SRC/<class>"):
        plan_inputs(Listing(("a.jpg", "b.jpg", "c.png")))


def test_a_single_class_is_a_warning_naming_the_likely_mistake():
    plan = plan_inputs(Listing(("cat/a.jpg", "cat/b.jpg")), src="imgs")
    assert plan.warnings == ("imgs has a single class (cat): every record gets label 0. If imgs/cat holds the "
                             "class folders, pass it as --src",)


def test_classes_in_labels_without_images_are_listed():
    plan = plan_inputs(Listing(("cat/a.jpg", "dog/b.jpg")), labels=["cat", "dog", "emu", "fox"])
    assert plan.warnings == ("--labels names 2 classes with no images: emu, fox",)


def test_val_fraction_states_the_one_image_rule_and_warns_when_validation_outgrows_train():
    files = tuple(f"cat/{i}.jpg" for i in range(10)) + ("dog/only.jpg",)
    plan = plan_inputs(Listing(files), val_fraction=0.9)
    splits = _by_split(plan)
    assert ("dog/only.jpg", "dog") in splits["train"] and len(splits["validation"]) == 9
    assert plan.warnings == (
        "--val-fraction: classes dog have a single image, which stays in train (a class is split only when it "
        "has two or more images)",
        "split validation has 9 images, more than train's 2 (--val-fraction 0.9)",
    )


def test_imagenets_flat_val_folder_without_val_labels_is_a_warning_naming_the_folder_and_the_flag():
    files = ("train/n01/a.JPEG", "train/n02/b.JPEG", *(f"val/ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 31)))
    plan = plan_inputs(Listing(files, ("train", "train/n01", "train/n02", "val")), src="CLS-LOC")
    assert plan.skipped == {"stray-file": 30}
    (warning,) = plan.warnings
    assert warning.startswith("30 images directly in CLS-LOC/val were skipped (val/ILSVRC2012_val_00000001.JPEG, ")
    assert "If CLS-LOC/val is ImageNet's flat validation folder, give its labels with --val-labels" in warning


def test_src_pointed_at_a_class_folder_warns_that_its_own_images_were_skipped():
    plan = plan_inputs(Listing(("a.jpg", "b.jpg", "notes.txt", "closeups/c.jpg", "closeups/d.jpg", "night/e.jpg"),
                               ("closeups", "night")), src="dogs")
    assert [ref.relpath for ref in plan.refs] == ["closeups/c.jpg", "closeups/d.jpg", "night/e.jpg"]
    assert plan.warnings == ("2 images at the top level of dogs were skipped (a.jpg, b.jpg): only dogs/<class>/<image> "
                             "is read. If dogs is one class's folder, pass the folder that holds the class folders "
                             "as --src",)


def test_a_converted_dataset_under_src_is_skipped_with_a_warning_never_read_as_a_class():
    files = ("shapes/circle/a.jpg", "shapes/square/b.jpg", "shapes-tfrecords/manifest.json",
             "shapes-tfrecords/labels.txt", "shapes-tfrecords/train-00000-of-00001.tfrecord", "other/c.jpg")
    plan = plan_inputs(Listing(files, ("other", "shapes", "shapes/circle", "shapes/square", "shapes-tfrecords")),
                       src="data")
    assert plan.classes == ("other", "shapes")
    assert plan.skipped == {"converted-dataset": 3}
    assert plan.warnings[0] == ("data/shapes-tfrecords is a converted dataset (it holds manifest.json and shards), "
                                "not a class: skipped. Point --src at the folder of images")
