"""Damaged and hostile copies of the layouts #57 added: Roboflow's flat Pascal VOC export, CVAT's images anywhere
under SRC, and a Parquet file beside other datasets. Each damage is named (the file, and where in it), and
nothing vanishes with exit 0.

The exports are generated in the shapes the tools ship (Roboflow: ``train/``, ``valid/`` of ``.jpg`` beside
``.xml``; CVAT for images 1.1: ``annotations.xml`` and ``dataset/<class>/<name>.jpg``), then damaged as
downloads and hands damage them: an XML cut short, an image deleted, an entity bomb, a Parquet file cut short.
A kill of the converter mid-run over an existing dataset is tests/converter/test_killed_conversions_of_the_new_layouts.py.
"""

from __future__ import annotations

import pytest

from beam_jobs import annotations
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from tests.object_data import jpeg, picture, voc_xml, write_file, write_coco

# An XML entity bomb ("billion laughs"): ten levels of ten, 10^9 "lol"s if an XML reader expanded them.
BOMB = ('<?xml version="1.0"?>\n<!DOCTYPE annotation [\n<!ENTITY lol0 "lol">\n'
        + "".join(f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">\n' for i in range(1, 10))
        + ']>\n<annotation><filename>&lol9;</filename></annotation>\n')


def roboflow_voc(root) -> None:
    """Roboflow's Pascal VOC export: each split folder of ``.jpg`` beside ``.xml``, and its READMEs."""
    write_file(str(root / "README.roboflow.txt"), "Roboflow is an end-to-end computer vision platform\n")
    for split, names in (("train", ("fox1", "fox2", "cat3")), ("valid", ("fox4", "cat5"))):
        for index, name in enumerate(names):
            write_file(str(root / split / f"{name}.jpg"), jpeg(picture(40, 30, [(4, 4, 20, 20)], seed=index)))
            write_file(str(root / split / f"{name}.xml"), voc_xml(40, 30, [(name[:3], (5, 5, 20, 20), 0)]))


def cvat_anywhere(root) -> None:
    """CVAT for images 1.1 whose images lie in class folders under ``dataset/``, not ``images/``."""
    images = "".join(f'<image id="{i}" name="{name}" width="40" height="30"><box label="{name.split("/")[0]}" '
                     f'xtl="4" ytl="4" xbr="20" ybr="20" occluded="0"/></image>\n'
                     for i, name in enumerate(("cat/1.jpg", "cat/2.jpg", "dog/3.jpg")))
    write_file(str(root / "annotations.xml"),
               '<?xml version="1.0" encoding="utf-8"?>\n<annotations><version>1.1</version><meta><task><labels>'
               "<label><name>cat</name></label><label><name>dog</name></label></labels></task></meta>\n"
               + images + "</annotations>\n")
    for index, name in enumerate(("cat/1.jpg", "cat/2.jpg", "dog/3.jpg")):
        write_file(str(root / "dataset" / name), jpeg(picture(40, 30, [(4, 4, 20, 20)], seed=index)))


def _refused(plan) -> dict[str, tuple[str, str]]:
    """relpath -> (reason, detail) of the plan's images refused before they are read."""
    found = {}
    for ref in plan.refs:
        if ref.source.startswith("!"):
            reason, _, detail = ref.source[1:].partition("\t")
            found[ref.relpath] = (reason, detail)
    return found


def test_a_roboflow_voc_export_with_a_cut_xml_a_deleted_image_and_an_entity_bomb_names_each(tmp_path):
    root = tmp_path / "animals.voc"
    roboflow_voc(root)
    xml = (root / "valid/cat5.xml").read_text()
    (root / "valid/cat5.xml").write_text(xml[:len(xml) // 2])  # a download cut short
    (root / "train/fox2.jpg").unlink()  # its image deleted: its XML stays
    write_file(str(root / "train/bomb.jpg"), jpeg(picture(40, 30, [])))
    write_file(str(root / "train/bomb.xml"), BOMB)
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))
    refused = _refused(plan)
    assert set(refused) == {"valid/cat5.jpg", "train/fox2.jpg", "train/bomb.jpg"}
    assert refused["valid/cat5.jpg"][0] == "bad-annotation"
    assert refused["valid/cat5.jpg"][1].startswith("valid/cat5.xml is not valid XML: ") and "line" in \
        refused["valid/cat5.jpg"][1]
    assert refused["train/fox2.jpg"] == ("missing-file", "train/fox2.xml annotates it, but train/fox2.jpg (or "
                                         "another image extension) is not there (its objects: fox 1)")
    assert refused["train/bomb.jpg"][0] == "bad-annotation" and "train/bomb.xml" in refused["train/bomb.jpg"][1]
    # The deleted image's objects go with its rejection, so validation counts them (num_objects_of_rejected_images).
    lost = next(ref for ref in plan.refs if ref.relpath == "train/fox2.jpg")
    assert [box.label for box in annotations.decode(lost.annotation).boxes] == [plan.classes.index("fox")]
    planned = sorted(ref.relpath for ref in plan.refs if not ref.source.startswith("!"))
    assert planned == ["train/cat3.jpg", "train/fox1.jpg", "valid/fox4.jpg"]


def test_cvat_with_images_anywhere_names_a_cut_annotations_xml_a_missing_image_and_an_entity_bomb(tmp_path):
    root = tmp_path / "task"
    cvat_anywhere(root)
    (root / "dataset/cat/2.jpg").unlink()
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))
    refused = _refused(plan)
    assert list(refused.values()) == [("missing-file", "annotations.xml names cat/2.jpg, but it is not at "
                                       "images/cat/2.jpg, cat/2.jpg nor anywhere under --src by that name")]
    assert sorted(ref.relpath for ref in plan.refs if not ref.source.startswith("!")) == \
        ["dataset/cat/1.jpg", "dataset/dog/3.jpg"]

    text = (root / "annotations.xml").read_text()
    (root / "annotations.xml").write_text(text[:text.index('<image id="1"') + 30])
    with pytest.raises(InputError, match=r"task/annotations\.xml is not valid XML: .*line 4, column"):
        plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))
    (root / "annotations.xml").write_text(BOMB.replace("annotation", "annotations"))
    with pytest.raises(InputError, match=r"task/annotations\.xml is not valid XML"):
        plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))


def test_a_cut_or_empty_parquet_file_beside_other_datasets_is_refused_naming_each_not_read(tmp_path):
    """A Parquet file beside COCO and CVAT datasets: the refusal names each dataset and its command before any
    Parquet file is opened, so a cut or empty one changes nothing."""
    from tests import hub_data

    root = tmp_path / "downloads"
    cvat_anywhere(root / "cvat_task")
    write_coco(str(root / "coco"), "train2017", [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30}],
               [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 4, 16, 16], "area": 256, "iscrowd": 0}],
               [{"id": 1, "name": "fox"}], {"a.jpg": jpeg(picture(40, 30, []))})
    [parquet] = hub_data.write_split(str(root), "train", hub_data.rows(3, 0))
    messages = []
    for damage in ("cut", "empty"):
        data = open(parquet, "rb").read()
        with open(parquet, "wb") as handle:
            handle.write(data[:len(data) // 2] if damage == "cut" else b"")
        with pytest.raises(InputError) as raised:
            plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "out")))
        messages.append(str(raised.value))
    for message in messages:
        assert "holds datasets, not classes" in message
        for name in ("coco/ (COCO)", "cvat_task/ (CVAT for images)", "train-00000-of-00001.parquet (Parquet)"):
            assert name in message, message
        assert f"python -m converter --src {root}/coco" in message
