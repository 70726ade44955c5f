"""Real exports of Roboflow, Ultralytics, CVAT and Label Studio, planned and converted as they ship.

The annotation files are copies of what those tools wrote, kept in public repositories
(tests/data/exports/README.md names each). Each test lays the tree out as the tool writes it, draws the
images (red boxes on noise) at the size the annotations record, and checks what the plan makes of it
against values parsed here from the same files, independently of the sources' readers: the source chosen,
the classes and their ids (id 0 is the background; a source whose class indexes start at 0 is written one
higher), the splits, every object's class and box, and that nothing is dropped without a warning.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from beam_jobs import annotations
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.sources import SOURCES, Request, plan_inputs
from tests.conftest import REPO
from tests.object_data import jpeg, object_records, picture, red_fraction, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
EXPORTS = Path(f"{REPO}/tests/data/exports")
COCO_SPLITS = {"train": "train", "valid": "validation", "test": "test", "default": "train"}


# --- the trees, laid out as each tool writes them --------------------------------------------------------------


def _copy(name: str, tmp_path: Path) -> Path:
    root = tmp_path / name
    shutil.copytree(EXPORTS / name, root)
    return root


def _draw(path: Path, width: int, height: int, boxes, seed: int = 0) -> None:
    """An image of ``width`` x ``height`` with each ``(x0, y0, x1, y1)`` pixel box (floats) filled red."""
    pixels = [tuple(int(round(v)) for v in box) for box in boxes]
    write_file(str(path), jpeg(picture(width, height, pixels, seed=seed)))


def _coco_images(root: Path, json_file: Path, folder: str, offset: int) -> dict[str, tuple]:
    """Draws the images a COCO file lists (``folder``/``file_name``, Windows separators read as ``/``) and returns
    ``relpath -> ((width, height), [(record class id, x0, y0, x1, y1), ...])`` as the file gives them."""
    data = json.loads(json_file.read_text())
    expected = {}
    for seed, image in enumerate(data["images"]):
        relpath = "/".join(part for part in (folder, image["file_name"].replace("\\", "/")) if part)
        boxes = [(a["category_id"] + offset, a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2],
                  a["bbox"][1] + a["bbox"][3]) for a in data["annotations"] if a["image_id"] == image["id"]]
        _draw(root / relpath, image["width"], image["height"], [box[1:] for box in boxes], seed)
        expected[relpath] = ((image["width"], image["height"]), boxes)
    return expected


def _yolo_line(line: str) -> tuple:
    """``(class, x0, y0, x1, y1)`` of a label line: ``class cx cy w h``, or a polygon's corners (its extent)."""
    label, *values = line.split()
    if len(values) == 4:
        cx, cy, w, h = map(float, values)
        return int(label), cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    xs, ys = [float(v) for v in values[0::2]], [float(v) for v in values[1::2]]
    return int(label), min(xs), min(ys), max(xs), max(ys)


def _yolo_images(root: Path, labels: dict[str, str], width: int, height: int) -> dict[str, tuple]:
    """Draws the image of each label file (``labels`` folder -> ``images``, ``.txt`` -> ``.jpg``) and returns
    ``image relpath -> [(record class id, x0, y0, x1, y1) normalized, ...]``, ids one higher than the file's."""
    expected = {}
    for seed, (label_path, text) in enumerate(sorted(labels.items())):
        image = label_path.replace("labels/", "images/").rsplit(".", 1)[0] + ".jpg"
        boxes = [_yolo_line(line) for line in text.splitlines() if line.strip()]
        _draw(root / image, width, height, [(x0 * width, y0 * height, x1 * width, y1 * height)
                                            for _, x0, y0, x1, y1 in boxes], seed)
        expected[image] = [(label + 1, x0, y0, x1, y1) for label, x0, y0, x1, y1 in boxes]
    return expected


def _label_files(root: Path) -> dict[str, str]:
    return {path.relative_to(root).as_posix(): path.read_text() for path in root.rglob("labels/*.txt")}


# --- what the plan makes of them --------------------------------------------------------------------------------


def _source(root: Path) -> str:
    """The name of the source that claims ``root``."""
    request = Request(ConvertOptions(src=str(root), out=str(root) + "-out"))
    return next(source.name for source in SOURCES if source.claims(request))


def _plan(root: Path):
    return plan_inputs(ConvertOptions(src=str(root), out=str(root) + "-out"))


def _planned(plan) -> dict[str, tuple[str, annotations.Objects, str]]:
    """relpath -> (split, objects, locator) of every planned image."""
    return {ref.relpath: (ref.split, annotations.decode(ref.annotation), ref.source) for ref in plan.refs}


def _boxes(objects: annotations.Objects) -> list[tuple]:
    return [(box.label, box.xmin, box.ymin, box.xmax, box.ymax) for box in objects.boxes]


def _assert_objects(found: dict, expected: dict, splits: dict[str, str], frame=None) -> None:
    """Every listed image planned in its split, read from its file (no refusal), with its objects as given."""
    assert sorted(found) == sorted(expected)
    for relpath, want in expected.items():
        split, objects, source = found[relpath]
        assert split == splits[relpath], relpath
        assert not source.startswith("!"), (relpath, source)  # a locator, not a refusal
        assert objects.rejected == (), (relpath, objects.rejected)
        if frame is None:  # COCO: pixel boxes in the frame the JSON gives
            size, boxes = want
            assert objects.frame == size, relpath
        else:
            boxes = want
            assert objects.frame == frame, relpath
        got = _boxes(objects)
        assert [box[0] for box in got] == [box[0] for box in boxes], relpath
        assert [v for box in got for v in box[1:]] == pytest.approx([v for box in boxes for v in box[1:]]), relpath


def _assert_on_red(out: Path, expected_labels: dict[str, list[int]]) -> None:
    """The records: one per image, each object's class as given and its box on the red it was drawn over."""
    records = object_records(out)
    assert sorted(records) == sorted(expected_labels)
    for name, labels in expected_labels.items():
        record = records[name]
        assert record["image/object/class/label"] == labels, name
        for box in record["boxes"]:
            assert red_fraction(record["pixels"], box) > 0.9, (name, box)


# --- Roboflow ---------------------------------------------------------------------------------------------------


@pytest.fixture
def roboflow_coco(tmp_path):
    root = _copy("roboflow_coco", tmp_path)
    expected, splits = {}, {}
    for folder in ("train", "valid", "test"):
        found = _coco_images(root, root / folder / "_annotations.coco.json", folder, offset=0)
        expected.update(found)
        splits.update({relpath: COCO_SPLITS[folder] for relpath in found})
    return root, expected, splits


def test_roboflows_coco_export_plans_its_three_splits_without_the_project_category(roboflow_coco):
    root, expected, splits = roboflow_coco
    assert _source(root) == "coco"
    plan = _plan(root)
    # Category 0 ("objects", supercategory none, no annotations) names the project: left out, said once.
    assert plan.classes == ("", "bull", "pig") and plan.class_id_offset == 0
    assert plan.split_counts == {"train": 3, "validation": 2, "test": 2}
    _assert_objects(_planned(plan), expected, splits)
    assert plan.warnings == ("category 0 ('objects') has no objects: left out (it names the project in a Roboflow "
                             "export; id 0 is the records' background)",)
    # README.roboflow.txt is no image (skipped, named in skipped.jsonl), and no image is outside the JSON.
    assert plan.skipped == {"not-an-image": 1}


def test_roboflows_coco_export_converts_with_each_box_on_its_object(roboflow_coco, tmp_path):
    root, expected, _ = roboflow_coco
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(root), out=str(out), shards=1), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == ["", "bull", "pig"] and manifest["class_id_offset"] == 0
    assert {split: s["num_examples"] for split, s in manifest["splits"].items()} == \
        {"train": 3, "validation": 2, "test": 2}
    assert "objects" not in (out / "label_map.pbtxt").read_text()
    _assert_on_red(out, {relpath: [box[0] for box in boxes] for relpath, (_, boxes) in expected.items()})


def test_roboflows_yolo_export_reads_its_yaml_paths_inside_src_and_numbers_classes_from_1(tmp_path):
    root = _copy("roboflow_yolo", tmp_path)
    # 640x640: the export's README says "Resize to 640x640 (Stretch)".
    expected = _yolo_images(root, _label_files(root), 640, 640)
    assert _source(root) == "yolo"
    plan = _plan(root)
    assert plan.classes == ("", "can", "milk_jug", "non_white_jug", "plastic_bottle") and plan.class_id_offset == 1
    assert plan.split_counts == {"train": 1, "validation": 2, "test": 1}
    splits = {relpath: COCO_SPLITS[relpath.split("/")[0]] for relpath in expected}
    _assert_objects(_planned(plan), expected, splits, frame=annotations.NORMALIZED)
    # README.roboflow.txt and README.dataset.txt are neither images nor label files (skipped, named); roboflow: is
    # no split. The README's licence is offered for the card, in one line (tests/beam_jobs/sources/test_stated_license.py).
    assert [w for w in plan.warnings if not w.startswith("license: CC-BY-4.0")] == []
    assert plan.skipped == {"not-an-image": 2}


# --- Ultralytics ------------------------------------------------------------------------------------------------

# coco8's label files ship in a release zip, not in git: these lines are ours, in Ultralytics' format, under
# coco8's image names (four train, four val). One image has an empty label file, one has none: both are images
# without objects for Ultralytics.
COCO8_LABELS = {
    "labels/train/000000000009.txt": "45 0.479492 0.688771 0.955609 0.5955\n50 0.637063 0.732938 0.494125 0.510583\n",
    "labels/train/000000000025.txt": "23 0.770336 0.489695 0.335891 0.697559\n",
    "labels/train/000000000030.txt": "",
    "labels/val/000000000036.txt": "25 0.475759 0.414523 0.951518 0.672422\n0 0.671279 0.617945 0.645759 0.726859\n",
    "labels/val/000000000042.txt": "16 0.513133 0.556089 0.716781 0.808617\n",
    "labels/val/000000000049.txt": "0 0.2 0.25 0.1 0.3\n17 0.6 0.6 0.3 0.4\n58 0.9 0.1 0.1 0.15\n",
    "labels/val/000000000061.txt": "0 0.32 0.5 0.2 0.6\n",
}


def test_an_ultralytics_dataset_named_by_its_yaml_plans_its_splits_with_ids_one_higher(tmp_path):
    root = tmp_path / "coco8"
    shutil.copytree(EXPORTS / "ultralytics_coco8", root)
    for path, text in COCO8_LABELS.items():
        write_file(str(root / path), text)
    expected = _yolo_images(root, COCO8_LABELS, 64, 48)
    _draw(root / "images/train/000000000034.jpg", 64, 48, [])  # no label file: no objects
    expected["images/train/000000000034.jpg"] = []
    names = [line.split(": ", 1)[1] for line in (root / "coco8.yaml").read_text().splitlines()
             if line.startswith("  ") and ": " in line]
    assert _source(root) == "yolo"
    plan = _plan(root)
    # path: coco8 (the author's layout) is read as SRC, and test: (empty) as no test split.
    assert plan.classes == ("", *names) and len(names) == 80 and plan.class_id_offset == 1
    assert plan.split_counts == {"train": 4, "validation": 4}
    splits = {relpath: "train" if "/train/" in relpath else "validation" for relpath in expected}
    _assert_objects(_planned(plan), expected, splits, frame=annotations.NORMALIZED)
    assert plan.warnings == () and not plan.skipped


# --- CVAT -------------------------------------------------------------------------------------------------------


def test_cvats_coco_1_0_export_reads_instances_default_beside_images(tmp_path):
    root = _copy("cvat_coco", tmp_path)
    expected = _coco_images(root, root / "annotations/instances_default.json", "images", offset=0)
    assert _source(root) == "coco"
    plan = _plan(root)
    assert plan.classes == ("", "NONSUB_NITREA_GRANUL", "SUB_PIHC_GRANUL", "NONSUB_NITREA_PRILL", "SUB_PIHC_PRILL",
                            "NONSUB_GRANUL", "NONSUB_PRILL", "ANOMALI") and plan.class_id_offset == 0
    assert plan.split_counts == {"train": 3}  # a task without subsets: "default"
    _assert_objects(_planned(plan), expected, dict.fromkeys(expected, "train"))
    # Six of the seven classes have no object in these three images: they keep their ids (the run says so).
    assert plan.warnings == () and not plan.skipped


# --- Label Studio -----------------------------------------------------------------------------------------------


@pytest.fixture
def label_studio_yolo(tmp_path):
    root = _copy("label_studio_yolo", tmp_path)
    # 800x600: the repository's images are.
    return root, _yolo_images(root, _label_files(root), 800, 600)


def test_label_studios_yolo_export_reads_classes_txt_and_its_corner_lines_as_boxes(label_studio_yolo):
    root, expected = label_studio_yolo
    names = (root / "classes.txt").read_text().split("\n")[:-1]
    notes = json.loads((root / "notes.json").read_text())
    assert [c["name"] for c in sorted(notes["categories"], key=lambda c: c["id"])] == names  # the two agree
    assert _source(root) == "yolo"
    plan = _plan(root)
    assert plan.classes == ("", *names) and plan.class_id_offset == 1
    assert plan.split_counts == {"train": 3}
    _assert_objects(_planned(plan), expected, dict.fromkeys(expected, "train"), frame=annotations.NORMALIZED)
    assert plan.warnings == () and plan.skipped == {"annotations-not-read": 1}  # notes.json: named, not warned of


def test_label_studios_yolo_export_converts_with_each_box_on_its_object(label_studio_yolo, tmp_path):
    root, expected = label_studio_yolo
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(root), out=str(out), shards=1), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["class_id_offset"] == 1 and manifest["classes"][1:4] == ["blue(2x2x2)", "blue(3x3x3)",
                                                                             "blue(4x4x4)"]
    _assert_on_red(out, {relpath: [box[0] for box in boxes] for relpath, boxes in expected.items()})


def test_label_studios_coco_export_numbers_its_categories_from_0_and_is_written_one_higher(tmp_path):
    root = _copy("label_studio_coco", tmp_path)
    expected = _coco_images(root, root / "result.json", "", offset=1)
    assert _source(root) == "coco"
    plan = _plan(root)
    assert plan.classes == ("", "carros", "motos") and plan.class_id_offset == 1
    assert plan.split_counts == {"train": 3}
    _assert_objects(_planned(plan), expected, dict.fromkeys(expected, "train"))
    assert not plan.skipped
    assert plan.warnings == ("the category ids start at 0: written one higher, as id 0 is the records' background "
                             "(the manifest's class_id_offset is 1)",)


def test_label_studios_coco_export_made_on_windows_finds_images_named_with_backslashes(tmp_path):
    """Label Studio on Windows writes ``file_name: images\\\\<name>`` (os.path.join); its zip holds ``images/<name>``.
    A backslash there is the separator, not a name leaving SRC."""
    root = _copy("label_studio_coco_windows", tmp_path)
    assert '"images\\\\' in (root / "result.json").read_text()  # as written: a JSON-escaped backslash
    expected = _coco_images(root, root / "result.json", "", offset=1)
    assert sorted(path.relative_to(root).as_posix() for path in root.rglob("*.jpg")) == sorted(expected)
    plan = _plan(root)
    assert plan.classes == ("", "Chair", "Painting", "Plant", "Sofa", "Table") and plan.class_id_offset == 1
    assert plan.split_counts == {"train": 2}
    _assert_objects(_planned(plan), expected, dict.fromkeys(expected, "train"))
    assert not plan.skipped
    assert plan.warnings == ("the category ids start at 0: written one higher, as id 0 is the records' background "
                             "(the manifest's class_id_offset is 1)",)


def test_a_label_studio_export_whose_class_0_has_no_objects_keeps_its_ids(tmp_path):
    """Label Studio lists every label of the project as a category, numbered from 0, used or not: an export of
    the tasks that hold only ``motos`` (Label Studio exports a filtered view's tasks) has ``carros`` (0) unused.
    That is a class, not Roboflow's project category (``supercategory: none``): ``motos`` is id 2 in every
    export of the project, whichever tasks it holds."""
    root = _copy("label_studio_coco", tmp_path)
    data = json.loads((root / "result.json").read_text())
    data["images"] = [image for image in data["images"] if image["id"] == 6]
    data["annotations"] = [ann for ann in data["annotations"] if ann["image_id"] == 6]
    assert {ann["category_id"] for ann in data["annotations"]} == {1}
    (root / "result.json").write_text(json.dumps(data, indent=2))
    expected = _coco_images(root, root / "result.json", "", offset=1)
    plan = _plan(root)
    assert plan.classes == ("", "carros", "motos") and plan.class_id_offset == 1
    _assert_objects(_planned(plan), expected, dict.fromkeys(expected, "train"))
    assert [box.label for _, objects, _ in _planned(plan).values() for box in objects.boxes] == [2, 2, 2]
