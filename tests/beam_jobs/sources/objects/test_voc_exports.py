"""Pascal VOC as Roboflow exports it: each split a folder of ``.jpg`` beside ``.xml``, alone or beside VOC's own layout.

The XMLs are written as Roboflow writes them (tab-indented; ``<folder></folder>``, ``<path>``, ``<source>
<database>roboflow.ai</database>``, ``<segmented>``, ``<occluded>``; ``bndbox`` in the order xmin, xmax, ymin,
ymax; images named ``<name>_jpg.rf.<hash>.jpg``), after the sample Roboflow's "Pascal VOC XML" export gives in
Datumaro's Roboflow format page (datumaro docs, "Roboflow", PascalVOC) and in public READMEs of exported sets
(``animals.v2-release.voc``); the top holds ``README.dataset.txt`` and ``README.roboflow.txt`` as every
Roboflow export does. Images are drawn (red boxes on noise) at the sizes the XMLs give.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_jobs import annotations
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from tests.object_data import jpeg, object_records, picture, red_fraction, voc_xml, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def roboflow_xml(name: str, width: int, height: int, objects) -> str:
    """An XML as Roboflow's Pascal VOC export writes it: ``(class, (xmin, ymin, xmax, ymax))`` objects."""
    parts = [f"<annotation>\n\t<folder></folder>\n\t<filename>{name}</filename>\n\t<path>{name}</path>\n\t<source>\n"
             f"\t\t<database>roboflow.ai</database>\n\t</source>\n\t<size>\n\t\t<width>{width}</width>\n"
             f"\t\t<height>{height}</height>\n\t\t<depth>3</depth>\n\t</size>\n\t<segmented>0</segmented>\n"]
    for label, (x0, y0, x1, y1) in objects:
        parts.append(f"\t<object>\n\t\t<name>{label}</name>\n\t\t<pose>Unspecified</pose>\n\t\t<truncated>0</truncated>\n"
                     f"\t\t<difficult>0</difficult>\n\t\t<occluded>0</occluded>\n\t\t<bndbox>\n\t\t\t<xmin>{x0}</xmin>\n"
                     f"\t\t\t<xmax>{x1}</xmax>\n\t\t\t<ymin>{y0}</ymin>\n\t\t\t<ymax>{y1}</ymax>\n\t\t</bndbox>\n"
                     "\t</object>\n")
    return "".join(parts) + "</annotation>\n"


def roboflow_split(root, split: str, images: dict) -> None:
    """``images``: stem -> (width, height, [(class, 0-based pixel box)]): each a JPEG with its XML beside it."""
    for index, (stem, (width, height, objects)) in enumerate(sorted(images.items())):
        name = f"{stem}_jpg.rf.{index:032x}.jpg"
        write_file(str(root / split / name), jpeg(picture(width, height, [box for _, box in objects], seed=index)))
        voc = [(label, (x0 + 1, y0 + 1, x1, y1)) for label, (x0, y0, x1, y1) in objects]  # 1-based, inclusive
        write_file(str(root / split / (name[:-4] + ".xml")), roboflow_xml(name, width, height, voc))


def roboflow_readmes(root) -> None:
    write_file(str(root / "README.roboflow.txt"), "\nanimals - v2 release\n==============================\n\n"
               "This dataset was exported via roboflow.com\n")
    write_file(str(root / "README.dataset.txt"), "# animals > release\nhttps://universe.roboflow.com/\n\n"
               "Provided by a Roboflow user\nLicense: CC BY 4.0\n")


def test_roboflows_pascal_voc_export_converts_its_three_split_folders_as_objects(tmp_path):
    root = tmp_path / "animals.v2-release.voc"
    roboflow_readmes(root)
    roboflow_split(root, "train", {"fox1": (64, 48, [("fox", (10, 5, 40, 30))]),
                                   "cat2": (48, 48, [("cat", (0, 0, 20, 20)), ("fox", (24, 24, 48, 48))])})
    roboflow_split(root, "valid", {"fox3": (40, 40, [("fox", (4, 4, 20, 20))])})
    roboflow_split(root, "test", {"cat4": (40, 40, [("cat", (8, 8, 32, 32))])})
    write_file(str(root / "valid/unlabelled.jpg"), jpeg(picture(16, 16, [], seed=9)))  # no XML beside it
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert plan.task == "objects"
    assert plan.split_sizes() == {"train": 2, "validation": 1, "test": 1}
    assert plan.classes[8] == "cat" and plan.classes[21] == "fox"  # VOC's cat; fox a class of its own, after VOC's
    objects = {ref.relpath: annotations.decode(ref.annotation) for ref in plan.refs}
    fox = objects[next(path for path in objects if path.startswith("train/fox1"))]
    assert [(box.label, box.xmin, box.ymin, box.xmax, box.ymax) for box in fox.boxes] == [(21, 10, 5, 40, 30)]
    assert plan.skipped["no-annotation"] == 1 and plan.skipped["not-in-layout"] == 2  # the two READMEs
    skipped = {json.loads(line)["path"]: json.loads(line)["reason"] for line in plan.skipped_files.lines()}
    assert skipped == {"README.dataset.txt": "not-in-layout", "README.roboflow.txt": "not-in-layout",
                       "valid/unlabelled.jpg": "no-annotation"}
    assert any("valid/unlabelled.jpg" in w and "no VOC XML" in w for w in plan.warnings)
    assert any("'fox'" in w and "numbered 21" in w for w in plan.warnings)


def test_a_voc_train_folder_beside_a_roboflow_valid_folder_converts_both_splits(tmp_path, caplog):
    """Issue #57 case 2: VOC's Annotations/ and JPEGImages/ in train/, Roboflow's .jpg + .xml in valid/; valid/
    was dropped without a word (exit 0, train alone published)."""
    root = tmp_path / "mixed"
    for stem, box in (("a", (10, 5, 30, 20)), ("b", (0, 0, 16, 16))):
        write_file(str(root / f"train/JPEGImages/{stem}.jpg"), jpeg(picture(48, 32, [box], seed=ord(stem))))
        write_file(str(root / f"train/Annotations/{stem}.xml"),
                   voc_xml(48, 32, [("dog", (box[0] + 1, box[1] + 1, box[2], box[3]), 0)]))
    roboflow_split(root, "valid", {"c": (40, 40, [("dog", (4, 4, 20, 24)), ("cat", (24, 8, 40, 40))]),
                                   "d": (40, 40, [("cat", (0, 0, 40, 40))])})
    out = tmp_path / "ds"
    with caplog.at_level("WARNING"):
        run(ConvertOptions(src=str(root), out=str(out), shards=1), FAST, show_progress=False)
    # Pascal's 18 ids the set does not use are the OD API's label map, not classes gone missing: no warning.
    assert not any("have no objects" in record.getMessage() for record in caplog.records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert {split: v["num_examples"] for split, v in manifest["splits"].items()} == {"train": 2, "validation": 2}
    assert manifest["splits"]["validation"]["num_objects"] == 3 and manifest["num_rejected"] == 0
    records = object_records(out)
    [c] = [record for path, record in records.items() if path.startswith("valid/c_jpg")]
    assert c["image/object/class/label"] == [12, 8]
    assert np.allclose(c["boxes"], [(4 / 40, 4 / 40, 20 / 40, 24 / 40), (24 / 40, 8 / 40, 1, 1)])
    for box in c["boxes"]:
        assert red_fraction(c["pixels"], box) > 0.9
    assert np.allclose(records["train/JPEGImages/a.jpg"]["boxes"], [(10 / 48, 5 / 32, 30 / 48, 20 / 32)])


def test_a_flat_folder_whose_xml_has_no_image_is_named_and_masks_are_refused(tmp_path):
    root = tmp_path / "export"
    roboflow_split(root, "train", {"a": (32, 32, [("dog", (1, 1, 20, 20))])})
    write_file(str(root / "train/lost.xml"), roboflow_xml("lost.jpg", 32, 32, [("dog", (1, 1, 9, 9))]))
    plan = plan_inputs(ConvertOptions(src=str(root)))
    # A missing image, rejected by name with its objects' classes, as COCO's and CVAT's are (it was a warning).
    lost = [ref for ref in plan.refs if ref.source.startswith("!")]
    assert len(plan.refs) == 2 and [ref.relpath for ref in lost] == ["train/lost.jpg"]
    assert lost[0].source.startswith("!missing-file\ttrain/lost.xml annotates it") and "dog 1" in lost[0].source
    with pytest.raises(InputError, match=r"--masks.*Roboflow"):
        plan_inputs(ConvertOptions(src=str(root), masks=True))
