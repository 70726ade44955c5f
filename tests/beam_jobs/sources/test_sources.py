"""Input sources other than class folders: label files and ImageNet's flat validation folder."""

from __future__ import annotations

import json

import pytest

from beam_jobs.planning.discover import InputError, list_tree
from beam_jobs.sources import imagenet, label_file


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def _labelled(plan):
    return {(ref.split, ref.relpath, plan.classes[ref.label]) for ref in plan.refs}


@pytest.mark.parametrize("form", ["csv", "tsv", "jsonl"])
def test_a_label_file_in_each_form_gives_the_same_plan(tmp_path, form):
    rows = [("a/1.jpg", "dog", ""), ("b/2.jpg", "cat", "val"), ("3.jpg", "dog", "test"), ("c/4.png", "cat", "train")]
    if form == "jsonl":
        text = "\n".join(json.dumps({"path": p, "label": label, **({"split": s} if s else {})}) for p, label, s in rows)
    else:
        sep = "," if form == "csv" else "\t"
        text = sep.join(("path", "label", "split")) + "\n" + "\n".join(sep.join(row) for row in rows) + "\n"
    plan = label_file.plan("SRC", _write(tmp_path / f"labels.{form}", text), None, 0.0, 0)
    assert plan.classes == ("cat", "dog")
    assert _labelled(plan) == {("train", "a/1.jpg", "dog"), ("validation", "b/2.jpg", "cat"),
                               ("test", "3.jpg", "dog"), ("train", "c/4.png", "cat")}


def test_integer_labels_keep_their_numeric_order(tmp_path):
    text = "path,label\n" + "".join(f"{i}.jpg,{i}\n" for i in (10, 2, 9, 0, 1))
    plan = label_file.plan("SRC", _write(tmp_path / "l.csv", text), None, 0.0, 0)
    assert plan.classes == ("0", "1", "2", "9", "10")
    assert {ref.relpath: ref.label for ref in plan.refs}["10.jpg"] == 4


@pytest.mark.parametrize(("text", "message"), [
    ("path,label\na.jpg,x\nb.jpg,y\na.jpg,z\n", r"lists 'a.jpg' twice: lines 2 and 4"),
    ("path,label\na.jpg,x\nb.jpg\n", r"line 3 has 1 fields; the header has 2"),
    ("file,class\na.jpg,x\n", r"header naming the columns 'path' and 'label'"),
    ("path,label,split\na.jpg,x,holdout\n", r"line 2: split 'holdout' is not one of"),
    ("path,label\n../etc/passwd,x\n", r"line 2: path '../etc/passwd' must be relative to --src"),
    ("path,label\na.jpg,\n", r"line 2 has no label"),
    ('{"path": "a.jpg", "label": "x"}\n{"path": "b.jpg", "label": \n', r"line 2 is not valid JSON"),
])
def test_malformed_label_files_are_input_errors_naming_the_line(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        label_file.plan("SRC", _write(tmp_path / "labels.csv", text), None, 0.0, 0)


def _imagenet_tree(root, wnids=("n01440764", "n01443537", "n02119789")):
    for wnid in wnids:
        (root / "train" / wnid).mkdir(parents=True)
        for i in range(2):
            (root / "train" / wnid / f"{wnid}_{i}.JPEG").write_bytes(b"x")
    (root / "val").mkdir()
    names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 5)]
    for name in names:
        (root / "val" / name).write_bytes(b"x")
    return names


def test_imagenet_val_labels_in_both_published_forms(tmp_path):
    names = _imagenet_tree(tmp_path)
    truth = ["n02119789", "n01440764", "n01443537", "n02119789"]
    kaggle = "ImageId,PredictionString\n" + "".join(
        f"{name[:-5]},{wnid} 1 2 3 4 {wnid} 5 6 7 8\n" for name, wnid in reversed(list(zip(names, truth))))
    txt = "".join(f"{wnid}\n" for wnid in truth)
    for form, text in (("csv", kaggle), ("txt", txt)):
        plan = imagenet.plan(str(tmp_path), list_tree(str(tmp_path)), _write(tmp_path / f"gt.{form}", text), None, 0)
        assert plan.classes == ("n01440764", "n01443537", "n02119789")  # sorted wnids, 0-based
        val = {ref.relpath: plan.classes[ref.label] for ref in plan.refs if ref.split == "validation"}
        assert val == {f"val/{name}": wnid for name, wnid in zip(names, truth)}
        assert sum(ref.split == "train" for ref in plan.refs) == 6


def test_imagenet_val_labels_that_do_not_cover_the_folder_are_errors(tmp_path):
    _imagenet_tree(tmp_path)
    with pytest.raises(InputError, match="has 3 labels, one per line .* holds 4 images"):
        imagenet.plan(str(tmp_path), list_tree(str(tmp_path)), _write(tmp_path / "gt.txt", "n01440764\n" * 3), None, 0)
    with pytest.raises(InputError, match="names classes with no train folder: \\['n09999999'\\]"):
        imagenet.plan(str(tmp_path), list_tree(str(tmp_path)), _write(tmp_path / "gt.txt", "n09999999\n" * 4), None, 0)


def test_synsets_give_each_class_its_text(tmp_path):
    mapping = _write(tmp_path / "LOC_synset_mapping.txt", "n01440764 tench, Tinca tinca\nn02119789 kit fox, Vulpes macrotis\n")
    assert imagenet.read_synsets(mapping, ["n02119789", "n01440764"]) == ("kit fox, Vulpes macrotis", "tench, Tinca tinca")
    with pytest.raises(InputError, match=r"no text for classes \['n01443537'\]"):
        imagenet.read_synsets(mapping, ["n01443537"])


@pytest.mark.parametrize("form", ["csv", "jsonl"])
def test_a_label_file_with_other_column_names_is_read_through_columns(tmp_path, form):
    rows = [("a.jpg", "dog", "train"), ("b.jpg", "cat", "val")]
    if form == "jsonl":
        text = "\n".join(json.dumps({"image": p, "breed": label, "fold": s}) for p, label, s in rows)
    else:
        text = "image,breed,fold\n" + "\n".join(",".join(row) for row in rows) + "\n"
    plan = label_file.plan("SRC", _write(tmp_path / f"l.{form}", text), None, 0.0, 0, ("image", "breed", "fold"))
    assert _labelled(plan) == {("train", "a.jpg", "dog"), ("validation", "b.jpg", "cat")}


def test_ids_without_an_extension_resolve_to_the_one_image_file_of_that_name(tmp_path):
    (tmp_path / "train").mkdir()
    for name in ("a.jpg", "b.jpeg", "b.txt", "c", "c.png", "d.tar.png", "e.jpg"):
        (tmp_path / "train" / name).write_bytes(b"x")
    listed = [(2, "train/a"), (3, "train/b"), (4, "train/c"), (5, "train/d.tar"), (6, "train/e.jpg"),
              (7, "train/f"), (8, "nowhere/g")]
    assert label_file.resolve_ids(str(tmp_path), "labels.csv", listed) == {
        "train/a": "train/a.jpg",  # the id plus an image extension
        "train/b": "train/b.jpeg",  # b.txt is no image
        # c names a file itself; e.jpg has its extension; f and g name nothing (missing-file later)
        "train/d.tar": "train/d.tar.png",
    }
    (tmp_path / "train" / "a.PNG").write_bytes(b"x")
    with pytest.raises(InputError, match=r"labels.csv line 2 lists 'train/a', which could be train/a.PNG and "
                                         r"train/a.jpg; list the file with its extension"):
        label_file.resolve_ids(str(tmp_path), "labels.csv", listed)
