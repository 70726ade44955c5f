"""CVAT for images 1.1 as CVAT exports it: meta labels as ids from 1, subsets as splits, shapes' extents as boxes."""

from __future__ import annotations

import json
import shutil
import zipfile

import numpy as np
import pytest

from beam_jobs import annotations
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from beam_jobs.sources.archives import archive_members
from tests.conftest import REPO
from tests.object_data import jpeg, object_records, picture, red_fraction, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
# Datumaro's copy of a real CVAT project export (tests/data/cvat/README.md).
PROJECT_EXPORT = f"{REPO}/tests/data/cvat/project_export/annotations.xml"


def _objects(plan) -> dict[str, tuple[str, annotations.Objects, str]]:
    """relpath -> (split, objects, locator) of every planned image."""
    return {ref.relpath: (ref.split, annotations.decode(ref.annotation), ref.source) for ref in plan.refs}


def _boxes(objects: annotations.Objects) -> list[tuple]:
    return [(box.name.rsplit(" ", 2)[-2], box.label, box.xmin, box.ymin, box.xmax, box.ymax) for box in objects.boxes]


def _task_xml(labels, images, subset="", top="task") -> str:
    """annotations.xml as CVAT writes a task's export: ``images`` are ``(attributes, shapes XML)``."""
    meta = "".join(f"<label><name>{name}</name><color>#ff0000</color><type>any</type><attributes/></label>"
                   for name in labels)
    parts = [f'<?xml version="1.0" encoding="utf-8"?>\n<annotations>\n  <version>1.1</version>\n  <meta>\n'
             f"    <{top}><id>7</id><name>t</name><size>{len(images)}</size><mode>annotation</mode>"
             f"<subset>{subset}</subset><labels>{meta}</labels></{top}>\n"
             "    <dumped>2024-05-02 10:00:00.000000+00:00</dumped>\n  </meta>\n"]
    for index, (attributes, shapes) in enumerate(images):
        attrs = " ".join(f'{key}="{value}"' for key, value in {"id": index, **attributes}.items())
        parts.append(f"  <image {attrs}>\n    {shapes}\n  </image>\n")
    return "".join(parts) + "</annotations>\n"


def _box(label, x0, y0, x1, y1, extra="") -> str:
    return (f'<box label="{label}" source="manual" occluded="0" xtl="{x0:.2f}" ytl="{y0:.2f}" xbr="{x1:.2f}" '
            f'ybr="{y1:.2f}" z_order="0"{extra}></box>')


@pytest.fixture
def project_export(tmp_path):
    """The real project export's annotations.xml, its images drawn where CVAT puts them: images/<subset>/<name>."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(PROJECT_EXPORT, root / "annotations.xml")
    for subset in ("Train", "Test", "Validation"):
        write_file(str(root / f"images/{subset}/img0.jpg"), jpeg(picture(8, 8, [(0, 2, 4, 4)])))
        write_file(str(root / f"images/{subset}/img1.jpg"), jpeg(picture(10, 10, [])))
    return root


def test_a_real_project_export_plans_its_labels_from_1_its_subsets_and_each_shapes_extent(project_export):
    plan = plan_inputs(ConvertOptions(src=str(project_export)))
    assert plan.classes == ("", "label1", "label2") and plan.task == "objects"
    assert plan.split_counts == {"train": 2, "validation": 2, "test": 2}
    found = _objects(plan)
    assert sorted(found) == [f"images/{subset}/img{i}.jpg" for subset in ("Test", "Train", "Validation")
                             for i in (0, 1)]
    split, img0, source = found["images/Validation/img0.jpg"]
    assert split == "validation" and source == "" and img0.frame == (8, 8) and img0.upright
    # The occluded box as given; the polyline's extent.
    assert _boxes(img0) == [("box", 1, 0, 2, 4, 4), ("polyline", 2, 1, 2, 7, 8)]
    assert img0.boxes[0].name == "annotations.xml image img0.jpg box 1" and not img0.boxes[0].truncated
    split, img1, _ = found["images/Train/img1.jpg"]
    assert split == "train" and img1.frame == (10, 10)
    assert _boxes(img1) == [("polygon", 1, 1, 2, 6, 5), ("points", 2, 1, 2, 5, 6)]
    # CVAT's ids repeat across a project's tasks (id 0 in each subset); the records' ids come from the paths.
    assert len({objects.source_id for _, objects, _ in found.values()}) == 6
    assert plan.warnings == () and "not-in-annotations" not in plan.skipped


def test_the_zip_cvat_downloads_plans_as_its_extraction(project_export, tmp_path):
    archive = tmp_path / "project.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for path in sorted(project_export.rglob("*")):
            if path.is_file():
                out.write(path, path.relative_to(project_export).as_posix())
    plan = plan_inputs(ConvertOptions(src=str(archive), out=str(tmp_path / "out")))
    folder = plan_inputs(ConvertOptions(src=str(project_export), out=str(tmp_path / "out")))
    assert plan.classes == folder.classes and plan.split_counts == folder.split_counts
    zipped, unzipped = _objects(plan), _objects(folder)
    assert sorted(zipped) == sorted(unzipped)
    assert all(zipped[path][1] == unzipped[path][1] and zipped[path][2] for path in zipped)  # read from the zip


def test_subsets_are_splits_in_any_case_and_default_is_train(tmp_path):
    names = {"a.jpg": "Train", "b.jpg": "VAL", "c.jpg": "default", "d.jpg": "testing", "e.jpg": "Valid"}
    images = [({"name": name, "subset": subset, "task_id": 1, "width": 8, "height": 8}, "") for name, subset
              in names.items()]
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["x"], images, top="project"))
    for name, subset in names.items():
        write_file(str(tmp_path / f"images/{subset}/{name}"), jpeg(picture(8, 8, [])))
    splits = {path: split for path, (split, _, _) in _objects(plan_inputs(ConvertOptions(src=str(tmp_path)))).items()}
    assert splits == {"images/Train/a.jpg": "train", "images/VAL/b.jpg": "validation", "images/default/c.jpg": "train",
                      "images/testing/d.jpg": "test", "images/Valid/e.jpg": "validation"}


def test_a_task_export_takes_the_tasks_subset_and_a_subset_that_says_no_split_is_an_error_naming_it(tmp_path):
    image = ({"name": "a.jpg", "width": 8, "height": 8}, "")
    write_file(str(tmp_path / "images/a.jpg"), jpeg(picture(8, 8, [])))
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["x"], [image], subset="Validation"))
    assert plan_inputs(ConvertOptions(src=str(tmp_path))).split_counts == {"validation": 1}
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["x"], [image], subset="holdout"))
    with pytest.raises(InputError, match=r"annotations.xml: the subsets 'holdout' \(1 image\) say no split; the "
                                         r"subsets read are Train, Validation"):
        plan_inputs(ConvertOptions(src=str(tmp_path)))


def test_unknown_labels_missing_images_and_unlisted_files_are_each_named(tmp_path):
    images = [({"name": "a.jpg", "width": 40, "height": 30},
               _box("car", 1, 1, 9, 9) + _box("truck", 2, 2, 8, 8) + '<polygon label="" points="1,1;5,5;1,5"/>'),
              ({"name": "gone.jpg", "width": 40, "height": 30}, _box("car", 1, 1, 9, 9))]
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["car"], images))
    write_file(str(tmp_path / "images/a.jpg"), jpeg(picture(40, 30, [])))
    for name in ("x.jpg", "y.png", "notes.txt"):
        write_file(str(tmp_path / f"images/{name}"), b"not read")
    plan = plan_inputs(ConvertOptions(src=str(tmp_path)))
    found = _objects(plan)
    a = found["images/a.jpg"][1]
    assert _boxes(a) == [("box", 1, 1, 1, 9, 9)]
    assert [(name, reason) for name, reason, _ in a.rejected] == [
        ("annotations.xml image a.jpg box 2", "unknown-class"),
        ("annotations.xml image a.jpg polygon 1", "unknown-class")]
    assert "'truck' is not in the labels of <meta>" in a.rejected[0][2]
    gone = archive_members.parse_locator(found["images/gone.jpg"][2])  # listed, to be rejected naming where it looked
    assert gone.reason == "missing-file" and "annotations.xml names gone.jpg" in gone.detail
    assert "images/gone.jpg" in gone.detail and "anywhere under --src" in gone.detail
    assert plan.skipped["not-in-annotations"] == 2  # the two images; notes.txt is no image
    assert any("2 images under" in w and "images/x.jpg, images/y.png" in w for w in plan.warnings)


def test_every_cvat_shape_gives_its_extent_and_tags_and_skeletons_are_counted_in_a_warning(tmp_path):
    shapes = (_box("a", 10, 20, 30, 30, ' rotation="90.00"')  # 20 x 10 turned about its centre (20, 25): 10 x 20
              + '<ellipse label="a" source="manual" occluded="0" cx="50" cy="50" rx="10" ry="5" z_order="0"/>'
              + '<mask label="b" source="manual" occluded="0" rle="3, 4, 5" left="60" top="10" width="12" '
                'height="7" z_order="0"/>'
              + '<cuboid label="b" occluded="0" xtl1="1" ytl1="2" xbl1="1" ybl1="9" xtr1="7" ytr1="2" xbr1="7" '
                'ybr1="9" xtl2="3" ytl2="1" xbl2="3" ybl2="8" xtr2="9" ytr2="1" xbr2="9" ybr2="8" z_order="0"/>'
              + '<points label="a" points="12.5,13.25" occluded="1"/>'
              + '<box label="a" xtl="oops" ytl="1" xbr="2" ybr="3"/>'
              + '<tag label="a" source="manual"></tag>'
              + '<skeleton label="pose" source="manual" z_order="0"><points label="1" outside="0" occluded="0" '
                'points="1,1"/></skeleton>')
    write_file(str(tmp_path / "annotations.xml"), _task_xml(["a", "b", "pose"], [({"name": "s.jpg", "width": 100,
                                                                                    "height": 80}, shapes)])
               .replace("<name>pose</name>", "<name>pose</name><type>skeleton</type>").replace(
                   "</labels>", "<label><name>1</name><type>points</type><parent>pose</parent></label></labels>"))
    write_file(str(tmp_path / "images/s.jpg"), jpeg(picture(100, 80, [])))
    plan = plan_inputs(ConvertOptions(src=str(tmp_path)))
    assert plan.classes == ("", "a", "b", "pose")  # a skeleton's point labels are no classes
    objects = _objects(plan)["images/s.jpg"][1]
    assert np.allclose([box[2:] for box in _boxes(objects)],
                       [(15, 15, 25, 35), (40, 45, 60, 55), (60, 10, 72, 17), (1, 1, 9, 9), (12.5, 13.25, 12.5, 13.25)])
    assert [box[:2] for box in _boxes(objects)] == [("box", 1), ("ellipse", 1), ("mask", 2), ("cuboid", 2),
                                                    ("points", 1)]
    assert [(name, reason) for name, reason, _ in objects.rejected] == [("annotations.xml image s.jpg box 2",
                                                                        "bad-annotation")]
    assert any("not written: 1 skeletons (keypoints), 1 tags" in w for w in plan.warnings)


def test_labels_file_orders_the_ids_and_rejects_the_labels_it_does_not_list(tmp_path):
    write_file(str(tmp_path / "src/annotations.xml"), _task_xml(["car", "person"], [
        ({"name": "a.jpg", "width": 8, "height": 8}, _box("car", 1, 1, 4, 4) + _box("person", 2, 2, 6, 6))]))
    write_file(str(tmp_path / "src/images/a.jpg"), jpeg(picture(8, 8, [])))
    write_file(str(tmp_path / "labels.txt"), "person\n")
    plan = plan_inputs(ConvertOptions(src=str(tmp_path / "src"), labels_file=str(tmp_path / "labels.txt")))
    objects = _objects(plan)["images/a.jpg"][1]
    assert plan.classes == ("", "person") and [box.label for box in objects.boxes] == [1]
    assert objects.rejected[0][:2] == ("annotations.xml image a.jpg box 1", "unknown-class")


@pytest.mark.parametrize("text, message", [
    ('<annotations>\n  <meta><task><labels><label><name>a</name></label></labels></task></meta>\n  <image name="a.jpg"'
     ' width="8" height="8">\n  <box label="a"</image>\n</annotations>', r"annotations.xml is not valid XML: .*line 4"),
    ("<annotations><meta><task><labels/></task></meta><image name='a.jpg' width='8' height='8'/></annotations>",
     r"annotations.xml: its <meta> lists no <labels>; give the class names with --labels"),
    ("<annotations><meta><task><labels><label><name>a</name></label></labels></task></meta><track id='0' label='a'>"
     "<box frame='0' xtl='1' ytl='1' xbr='2' ybr='2' outside='0' occluded='0' keyframe='1'/></track></annotations>",
     r"annotations.xml holds <track> elements: it is a \"CVAT for video\" export"),
    ("<annotation><filename>a.jpg</filename></annotation>", r"annotations.xml is not CVAT's annotations.xml: its root "
                                                             r"is <annotation>"),
])
def test_an_annotations_xml_that_cannot_be_read_is_an_error_naming_the_file(tmp_path, text, message):
    write_file(str(tmp_path / "annotations.xml"), text)
    write_file(str(tmp_path / "images/a.jpg"), jpeg(picture(8, 8, [])))
    with pytest.raises(InputError, match=message):
        plan_inputs(ConvertOptions(src=str(tmp_path)))


def test_a_task_export_converts_with_its_boxes_on_their_objects(tmp_path, caplog):
    """CVAT annotates the upright image: an EXIF-turned JPEG keeps its boxes on its red rectangles."""
    root = tmp_path / "task_export"
    a_boxes = [(10, 5, 30, 20), (50, 30, 70, 44)]
    write_file(str(root / "images/a.jpg"), jpeg(picture(80, 48, a_boxes, seed=1), orientation=6))
    write_file(str(root / "images/street/b.jpg"), jpeg(picture(64, 64, [(16, 16, 48, 40)], seed=2)))
    write_file(str(root / "images/extra.jpg"), jpeg(picture(16, 16, [], seed=3)))  # in no <image>
    images = [({"name": "a.jpg", "width": 80, "height": 48},
               _box("car", *a_boxes[0]) + _box("truck", 0, 0, 5, 5) + '<polygon label="person" source="manual" '
               'occluded="1" points="50.00,30.00;70.00,30.00;70.00,44.00;50.00,44.00" z_order="0"></polygon>'),
              ({"name": "street/b.jpg", "width": 64, "height": 64},
               '<mask label="car" source="manual" occluded="0" rle="0, 768" left="16" top="16" width="32" '
               'height="24" z_order="0"></mask><tag label="person" source="manual"></tag>'),
              ({"name": "c.jpg", "width": 32, "height": 32}, "")]  # listed, not on disk
    write_file(str(root / "annotations.xml"), _task_xml(["car", "person", "bike"], images))
    out = tmp_path / "ds"
    with caplog.at_level("WARNING"):
        # a.jpg keeps its good objects beside the unknown 'truck' (by default it would be rejected whole:
        # tests/beam_jobs/test_unwritable_objects.py).
        run(ConvertOptions(src=str(root), out=str(out), shards=1, max_bad_fraction=0.5,
                           encode=EncodeOptions(keep_partial_images=True)), FAST, show_progress=False)
    assert any("1 image under" in r.getMessage() and "images/extra.jpg" in r.getMessage() for r in caplog.records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == ["", "car", "person", "bike"] and manifest["task"] == "objects"
    assert manifest["skipped_by_reason"]["not-in-annotations"] == 1
    records = object_records(out)
    a = records["images/a.jpg"]
    assert a["image/object/class/label"] == [1, 2] and a["image/object/class/text"] == [b"car", b"person"]
    assert a["pixels"].shape[:2] == (48, 80)  # turned upright, boxes kept
    assert np.allclose(a["boxes"], [(10 / 80, 5 / 48, 30 / 80, 20 / 48), (50 / 80, 30 / 48, 70 / 80, 44 / 48)])
    for box in a["boxes"]:
        assert red_fraction(a["pixels"], box) > 0.9
    b = records["images/street/b.jpg"]
    assert b["image/object/class/label"] == [1] and red_fraction(b["pixels"], b["boxes"][0]) > 0.9
    assert np.allclose(b["boxes"], [(0.25, 0.25, 0.75, 40 / 64)])
    rejected = {(r["path"], r["reason"], r.get("annotation")) for r in
                map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    assert rejected == {("images/a.jpg", "unknown-class", "annotations.xml image a.jpg box 2"),
                        ("images/c.jpg", "missing-file", None)}
