"""The Croissant card (record_files/croissant.py, record_files/dataset_card.py, converter/card.py).

On real converted datasets (the demo's classification from tests/conftest.py; objects, multi-label and
segmentation converted here in-process from a few generated images): mlcroissant validates every card
with no error and, once a license and citation are given, no warning; each shard's FileObject carries the
file's own sha256 and size; the record fields follow the task; card files that are wrong say which file
and which field.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil

import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from converter import card as card_command
from record_files import croissant
from record_files.dataset_card import CardError, DatasetCard, card_from_flags, load_card
from tests.conftest import REPO
from tests.object_data import class_mask_png, jpeg, picture, write_coco, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
# What mlcroissant says of a card that gives no license, citation or date: what only a person can say.
MISSING = {'Property "https://schema.org/license" is recommended, but does not exist.',
           'Property "http://mlcommons.org/croissant/citeAs" is recommended, but does not exist.',
           'Property "https://schema.org/datePublished" is recommended, but does not exist.'}
FULL_CARD = """\
name: shapes
description: Circles, squares and triangles drawn by converter.demo.
license: https://creativecommons.org/licenses/by/4.0/
citation: |
  @misc{shapes2026, title={Shapes}, year={2026}}
url: https://example.org/shapes
version: "2.1.0"
date_published: 2026-11-01
creators:
  - Ada Lovelace
  - {name: Example Lab, type: organization, url: https://example.org}
keywords: [shapes, demo]
"""


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, demo_dataset) -> dict[str, str]:
    """task -> a converted dataset folder of one's own (the demo's is copied: session fixtures stay untouched)."""
    root = tmp_path_factory.mktemp("croissant")
    out = {"classification": shutil.copytree(demo_dataset, str(root / "shapes-tfrecords"))}
    images, annotations, files = [], [], {}
    for index, (width, height, boxes) in enumerate([(120, 90, [(10, 10, 50, 40)]),
                                                    (100, 140, [(20, 30, 90, 120), (5, 5, 40, 40)])]):
        images.append({"id": index + 1, "file_name": f"{index}.jpg", "width": width, "height": height})
        for number, (x0, y0, x1, y1) in enumerate(boxes):
            annotations.append({"id": 10 * index + number, "image_id": index + 1, "category_id": 1 + 2 * (number % 2),
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
        files[f"{index}.jpg"] = jpeg(picture(width, height, boxes, seed=index))
    categories = [{"id": 1, "name": "even"}, {"id": 3, "name": "odd"}]  # COCO's ids, with a gap
    write_coco(str(root / "coco"), "train2017", images, annotations, categories, files)
    write_coco(str(root / "coco"), "val2017", images, annotations, categories, files)
    out["objects"] = str(root / "boxes")
    run(ConvertOptions(src=str(root / "coco"), out=out["objects"], shards=1), FAST, show_progress=False)
    tags = {"a": "clear primary", "b": "water", "c": "", "d": "clear water haze"}
    for index, name in enumerate(tags):
        write_file(str(root / "tags" / f"{name}.jpg"), jpeg(picture(40, 30, [], seed=index)))
    write_file(str(root / "tags.csv"), "image_name,tags\n" + "".join(f"{n},{t}\n" for n, t in tags.items()))
    out["multilabel"] = str(root / "tagged")
    run(ConvertOptions(src=str(root / "tags"), out=out["multilabel"], shards=1, annotations=str(root / "tags.csv"),
                       annotation_columns=("image_name", "tags"), label_separator=" "), FAST, show_progress=False)
    for index, (width, height, box, class_id) in enumerate([(120, 90, (10, 10, 60, 50), 1),
                                                            (90, 140, (30, 60, 90, 140), 2)]):
        for split in ("training", "validation"):
            write_file(str(root / f"seg/images/{split}/{index}.jpg"), jpeg(picture(width, height, [box], seed=index)))
            write_file(str(root / f"seg/annotations/{split}/{index}.png"), class_mask_png(width, height, box, class_id))
    write_file(str(root / "seg-labels.txt"), "background\nroad\ncar\n")
    out["segmentation"] = str(root / "masks")
    run(ConvertOptions(src=str(root / "seg"), out=out["segmentation"], shards=1,
                       labels_file=str(root / "seg-labels.txt")), FAST, show_progress=False)
    return out


def _manifest(folder: str) -> dict:
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _fields(jsonld: dict, record_set: str) -> dict[str, dict]:
    """Field id -> field, sub-fields included, of one record set."""
    found = {}

    def walk(fields):
        for field in fields:
            found[field["@id"]] = field
            walk(field.get("subField", []))

    walk(next(r for r in jsonld["recordSet"] if r["@id"] == record_set)["field"])
    return found


def _warnings(path: str) -> tuple[list[str], set[str]]:
    errors, warnings = croissant.croissant_issues(path)
    return errors, {w.split("] ", 1)[-1] for w in warnings}


@pytest.mark.parametrize("task", ["classification", "objects", "multilabel", "segmentation"])
def test_mlcroissant_validates_the_default_card(datasets, task):
    path = croissant.write_croissant(datasets[task])
    assert path == os.path.join(datasets[task], "croissant.json")
    errors, warnings = _warnings(path)
    assert errors == []
    assert warnings == MISSING, "the only warnings: no license, citation or date was given"
    jsonld = json.load(open(path, encoding="utf-8"))
    assert jsonld["conformsTo"] == "http://mlcommons.org/croissant/1.1"
    assert jsonld["name"] == os.path.basename(datasets[task])
    assert "imgshards" in jsonld["description"] and task in jsonld["description"]
    assert not {"license", "citeAs", "creator", "url", "datePublished"} & set(jsonld)
    assert [name for name in os.listdir(datasets[task]) if name.startswith(".")] == [], "no temp file left"


def test_a_full_card_file_leaves_no_warning(datasets, tmp_path):
    card_file = tmp_path / "card.yaml"
    card_file.write_text(FULL_CARD)
    path = croissant.write_croissant(datasets["classification"], load_card(str(card_file)))
    assert _warnings(path) == ([], set())
    jsonld = json.load(open(path, encoding="utf-8"))
    assert jsonld["license"] == "https://creativecommons.org/licenses/by/4.0/"
    assert jsonld["citeAs"].startswith("@misc{shapes2026") and jsonld["version"] == "2.1.0"
    assert jsonld["datePublished"] == "2026-11-01"
    assert jsonld["creator"] == [{"@type": "sc:Person", "name": "Ada Lovelace"},
                                 {"@type": "sc:Organization", "name": "Example Lab", "url": "https://example.org"}]


@pytest.mark.parametrize("task", ["classification", "objects"])
def test_each_shard_is_a_file_object_with_its_own_sha256_and_size(datasets, task):
    folder = datasets[task]
    jsonld = croissant.build_croissant(_manifest(folder))
    files = [item for item in jsonld["distribution"] if item["@type"] == "cr:FileObject"]
    shards = sorted(name for name in os.listdir(folder) if name.endswith(".tfrecord"))
    assert sorted(item["contentUrl"] for item in files) == shards
    for item in files:
        data = open(os.path.join(folder, item["contentUrl"]), "rb").read()
        assert item["sha256"] == hashlib.sha256(data).hexdigest()
        assert item["contentSize"] == f"{len(data)} B"
        assert item["encodingFormat"] == "application/x-tfrecord"
    (file_set,) = [item for item in jsonld["distribution"] if item["@type"] == "cr:FileSet"]
    assert sorted(file_set["includes"]) == sorted(f"{split}-*-of-*.tfrecord" for split in _manifest(folder)["splits"])


def test_splits_and_classes_are_inline_record_sets(datasets):
    manifest = _manifest(datasets["objects"])
    jsonld = croissant.build_croissant(manifest)
    splits, classes = jsonld["recordSet"][0], jsonld["recordSet"][1]
    assert splits["dataType"] == "cr:Split"
    assert splits["data"] == [
        {"splits/name": "train", "splits/url": "cr:TrainingSplit",
         "splits/num_examples": manifest["splits"]["train"]["num_examples"]},
        {"splits/name": "validation", "splits/url": "cr:ValidationSplit",
         "splits/num_examples": manifest["splits"]["validation"]["num_examples"]}]
    assert classes["dataType"] == "sc:Enumeration"
    # The record's label ids are COCO's (1 and 3): the ids without a class are not in the label map.
    assert [(row["classes/label"], row["classes/name"]) for row in classes["data"]] == [(1, "even"), (3, "odd")]
    split = _fields(jsonld, "records")["records/split"]
    assert split["references"] == {"field": {"@id": "splits/name"}}
    assert split["source"]["extract"] == {"fileProperty": "filename"}


def test_record_fields_follow_the_task(datasets):
    by_task = {task: _fields(croissant.build_croissant(_manifest(folder)), "records")
               for task, folder in datasets.items()}
    label = by_task["classification"]["records/label"]
    assert label["dataType"] == ["sc:Integer", "cr:Label"]
    assert label["source"]["extract"] == {"column": "image/class/label"}
    assert label["references"] == {"field": {"@id": "classes/label"}}
    assert by_task["classification"]["records/image"]["dataType"] == "sc:ImageObject"
    assert "records/objects" not in by_task["classification"]
    assert by_task["multilabel"]["records/label"]["isArray"] is True
    objects = by_task["objects"]
    assert objects["records/objects"]["isArray"] is True and objects["records/objects"]["dataType"] == "cr:Label"
    assert objects["records/objects/bbox"]["dataType"] == "cr:BoundingBox"
    assert [f["source"]["extract"]["column"] for f in objects["records/objects/bbox"]["subField"]] == [
        "image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax", "image/object/bbox/ymax"]
    assert objects["records/objects/label"]["references"] == {"field": {"@id": "classes/label"}}
    mask = by_task["segmentation"]["records/class_mask"]
    assert mask["dataType"] == ["cr:SegmentationMask", "sc:ImageObject"]
    assert mask["source"]["extract"] == {"column": "image/segmentation/class/encoded"}


def test_the_same_conversion_writes_the_same_card(datasets):
    """Byte for byte, as the shards are: the conversion's time (the manifest's ``created``) is not in it."""
    manifest = _manifest(datasets["classification"])
    later = {**manifest, "created": "2030-01-01T00:00:00+00:00"}
    assert croissant.croissant_text(croissant.build_croissant(manifest)) == croissant.croissant_text(
        croissant.build_croissant(later))


@pytest.mark.parametrize("text, field", [
    ("name: x\nlicence: MIT\n", "'licence' (did you mean 'license'?)"),
    ("version: 1.0\n", "'version' must be text, not float 1.0 (quote it"),
    ("citation: [a, b]\n", "'citation' must be text"),
    ("license: [MIT, 3]\n", "'license' must be text, not int 3"),
    ("creators: [{name: A, role: x}]\n", "'creators[0].role'"),
    ("creators: [{name: A, type: robot}]\n", "'creators[0].type' is 'robot'"),
    ("creators: [{url: https://a.org}]\n", "'creators[0].name' is missing"),
    ("description: '  '\n", "'description' is empty"),
    ("- just\n- a list\n", "must hold a mapping"),
    ("name: [unclosed\n", "not valid YAML"),
])
def test_card_file_errors_name_the_file_and_the_field(tmp_path, text, field):
    path = tmp_path / "card.yaml"
    path.write_text(text)
    with pytest.raises(CardError) as err:
        load_card(str(path))
    assert str(err.value).startswith(f"--card {path}: ") and field in str(err.value)


def test_json_cards_and_flags(tmp_path):
    path = tmp_path / "card.json"
    path.write_text(json.dumps({"license": ["MIT", "CC-BY-4.0"], "citation": "file's", "keywords": "one"}))
    assert load_card(str(path)) == DatasetCard(license=("MIT", "CC-BY-4.0"), citation="file's", keywords=("one",))
    path.write_text('{"name": "x",}')
    with pytest.raises(CardError, match=f"--card {path}: not valid JSON"):
        load_card(str(path))
    with pytest.raises(CardError, match="--card .*missing.yaml: cannot read it"):
        load_card(str(tmp_path / "missing.yaml"))
    path.write_text(json.dumps({"license": "MIT", "citation": "file's", "name": "n"}))
    flags = card_from_flags(str(path), ["Apache-2.0"], "the flag's")
    assert flags == DatasetCard(name="n", license=("Apache-2.0",), citation="the flag's"), "flags win"
    assert card_from_flags(None, None, None) is None


def test_the_card_command(datasets, tmp_path, capsys):
    folder = datasets["multilabel"]
    path = tmp_path / "card.yaml"
    path.write_text(FULL_CARD)
    assert card_command.main([folder, "--card", str(path), "--license", "CC0-1.0", "--check"]) == 0
    out, err = capsys.readouterr()
    assert out == f"wrote {os.path.join(folder, 'croissant.json')}\n" and err == ""
    jsonld = json.load(open(os.path.join(folder, "croissant.json"), encoding="utf-8"))
    assert jsonld["license"] == "CC0-1.0" and jsonld["name"] == "shapes"
    path.write_text("lisence: MIT\n")
    with pytest.raises(SystemExit) as stop:
        card_command.main([folder, "--card", str(path)])
    assert stop.value.code == 2
    assert f"--card {path}: unknown field 'lisence' (did you mean 'license'?)" in capsys.readouterr().err
    # the dataset at fault (not the command line): exit 1 with "error: ...", as verify, inspect and report
    assert card_command.main([str(tmp_path / "nothing-here")]) == 1
    assert "holds no manifest.json: not a converted dataset" in capsys.readouterr().err
    assert card_command.main([folder, "--version", "7"]) == 1
    assert "version 7 of" in capsys.readouterr().err


def test_the_card_modules_import_neither_tensorflow_nor_beam():
    for name in ("croissant.py", "dataset_card.py"):
        tree = ast.parse(open(os.path.join(REPO, "record_files", name), encoding="utf-8").read())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & {"tensorflow", "apache_beam"}, name
