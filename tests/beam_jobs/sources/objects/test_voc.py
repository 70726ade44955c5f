"""Pascal VOC as it ships: split lists, 1-based inclusive boxes, the OD API's class ids, difficult kept."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_jobs import annotations
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from beam_jobs.sources.archives import archive_members
from tests.object_data import jpeg, object_records, picture, red_fraction, voc_palette_png, voc_xml, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.mark.slow
def test_voc_converts_with_its_split_lists_and_the_od_apis_ids(tmp_path, caplog):
    root = tmp_path / "VOCdevkit" / "VOC2012"
    # Pixels 10..29 and 50..69 (0-based) are red: VOC writes them 1-based, inclusive: 11..30 and 51..70.
    write_file(str(root / "JPEGImages/2008_000001.jpg"), jpeg(picture(80, 48, [(10, 5, 30, 20), (50, 30, 70, 44)])))
    write_file(str(root / "Annotations/2008_000001.xml"),
               voc_xml(80, 48, [("dog", (11, 6, 30, 20), 0), ("person", (51, 31, 70, 44), 1), ("cat", (9, 1, 5, 5), 0)]))
    write_file(str(root / "JPEGImages/2008_000002.jpg"), jpeg(picture(40, 40, [(0, 0, 40, 40)], seed=2)))
    write_file(str(root / "Annotations/2008_000002.xml"), voc_xml(40, 40, [("cat", (1, 1, 40, 40), 0)]))
    write_file(str(root / "JPEGImages/2008_000005.jpg"), jpeg(picture(40, 40, [(0, 0, 40, 40)], seed=5)))
    write_file(str(root / "Annotations/2008_000005.xml"),
               voc_xml(40, 40, [("cat", (1, 1, 40, 40), 0), ("Dog", (1, 1, 20, 20), 0)]))  # a near miss
    write_file(str(root / "JPEGImages/2008_000003.jpg"), jpeg(picture(40, 40, [], seed=3)))
    write_file(str(root / "Annotations/2008_000003.xml"), "<annotation><object>")  # cut short
    write_file(str(root / "JPEGImages/2008_000009.jpg"), jpeg(picture(40, 40, [], seed=9)))  # in no list
    write_file(str(root / "Annotations/2008_000004.xml"), voc_xml(40, 40, [("cat", (1, 1, 40, 40), 0)]))  # no JPEG
    write_file(str(root / "ImageSets/Main/train.txt"), "2008_000001\n2008_000003\n2008_000004\n")
    write_file(str(root / "ImageSets/Main/val.txt"), "2008_000002\n2008_000005\n")
    write_file(str(root / "ImageSets/Main/trainval.txt"), "2008_000001\n2008_000002\n2008_000003\n")
    out = tmp_path / "ds"
    with caplog.at_level("WARNING"):
        run(ConvertOptions(src=str(tmp_path / "VOCdevkit"), out=str(out), shards=1, max_bad_fraction=0.7), FAST,
            show_progress=False)
    assert any("1 image of" in r.getMessage() and "2008_000009.jpg" in r.getMessage() for r in caplog.records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"][1] == "aeroplane" and manifest["classes"][12] == "dog"  # pascal_label_map.pbtxt
    assert {s: v["num_examples"] for s, v in manifest["splits"].items()} == {"train": 1, "validation": 1}
    records = object_records(out)
    first = records["VOC2012/JPEGImages/2008_000001.jpg"]
    assert first["image/object/class/label"] == [12, 15] and first["image/object/difficult"] == [0, 1]
    assert np.allclose(first["boxes"], [(10 / 80, 5 / 48, 30 / 80, 20 / 48), (50 / 80, 30 / 48, 70 / 80, 44 / 48)])
    for box in first["boxes"]:
        assert red_fraction(first["pixels"], box) > 0.9
    assert np.allclose(records["VOC2012/JPEGImages/2008_000002.jpg"]["boxes"], [(0, 0, 1, 1)])  # the whole image
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    # The box without an extent drops out of its image (counted); the near miss 'Dog' rejects its image, named.
    assert {(r["path"], r["reason"], r.get("annotation")) for r in rejected} == {
        ("VOC2012/JPEGImages/2008_000001.jpg", "box-empty", "VOC2012/Annotations/2008_000001.xml object 3"),
        ("VOC2012/JPEGImages/2008_000005.jpg", "unknown-class", None),
        ("VOC2012/JPEGImages/2008_000003.jpg", "bad-annotation", None),
        ("VOC2012/JPEGImages/2008_000004.jpg", "missing-file", None)}
    details = {r["reason"]: r["detail"] for r in rejected}
    assert details["unknown-class"].startswith(
        "VOC2012/Annotations/2008_000005.xml object 2: 'Dog' is not a VOC class: did you mean 'dog'?")
    assert "VOC2012/Annotations/2008_000004.xml" in details["missing-file"]
    assert manifest["skipped_by_reason"]["not-in-split-lists"] == 1


def test_masks_write_each_images_class_mask_on_its_pixels_and_a_mask_of_another_size_rejects_its_image(tmp_path):
    import io

    from PIL import Image

    root = tmp_path / "VOC2012"
    write_file(str(root / "JPEGImages/a.jpg"), jpeg(picture(80, 48, [(10, 5, 30, 20)])))
    write_file(str(root / "Annotations/a.xml"), voc_xml(80, 48, [("dog", (11, 6, 30, 20), 0)]))
    write_file(str(root / "SegmentationClass/a.png"), voc_palette_png(80, 48, [((10, 5, 30, 20), 12)]))
    write_file(str(root / "JPEGImages/b.jpg"), jpeg(picture(40, 40, [], seed=2)))
    write_file(str(root / "Annotations/b.xml"), voc_xml(40, 40, []))
    write_file(str(root / "SegmentationClass/b.png"), voc_palette_png(20, 20, []))  # not its image's size
    write_file(str(root / "ImageSets/Segmentation/train.txt"), "a\nb\n")
    write_file(str(root / "ImageSets/Main/train.txt"), "a\n")
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(root), out=str(out), shards=1, masks=True, max_bad_fraction=0.5,
                       encode=EncodeOptions(max_side=40)), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["features"]["image/segmentation/class/encoded"] == "bytes"
    record = object_records(out)["JPEGImages/a.jpg"]
    assert record["image/segmentation/class/format"] == [b"png"]
    ids = np.asarray(Image.open(io.BytesIO(record["image/segmentation/class/encoded"][0])))
    assert ids.shape == record["pixels"].shape[:2] == (24, 40)  # resized with the image, nearest
    assert set(np.unique(ids)) <= {0, 12, 255}
    reddish = record["pixels"][..., 0].astype(int) - record["pixels"][..., 1].astype(int) > 40
    assert reddish[ids == 12].mean() > 0.9 and (ids == 12).sum() > 20  # the dog's pixels are the red ones
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in rejected] == [("JPEGImages/b.jpg", "bad-mask")]
    assert "20x20" in rejected[0]["detail"] and "40x40" in rejected[0]["detail"]


def _voc_tree(root, objects_by_id: dict, listed=None, images=None) -> None:
    """A VOC2012 folder: an 80x48 JPEG and an XML of ``(name, box)`` objects for each id; ImageSets/Main/train.txt
    lists ``listed`` (default: every id); ``images``: the ids that have a JPEG (default: every id)."""
    for image_id, objects in objects_by_id.items():
        if images is None or image_id in images:
            write_file(str(root / f"JPEGImages/{image_id}.jpg"), jpeg(picture(80, 48, [])))
        write_file(str(root / f"Annotations/{image_id}.xml"), voc_xml(80, 48, [(n, box, 0) for n, box in objects]))
    write_file(str(root / "ImageSets/Main/train.txt"), "".join(f"{i}\n" for i in (listed or objects_by_id)))


def _planned(plan) -> dict:
    """relpath -> its Objects, or its refusal (reason, detail)."""
    found = {}
    for ref in plan.refs:
        if ref.source.startswith(archive_members.REFUSED):
            refused = archive_members.parse_locator(ref.source)
            found[ref.relpath] = (refused.reason, refused.detail)
        else:
            found[ref.relpath] = annotations.decode(ref.annotation)
    return found


BOX = (11, 6, 30, 20)


def test_near_misses_of_pascal_names_are_rejected_with_the_name_meant_and_other_names_are_classes_from_21(tmp_path):
    root = tmp_path / "VOC2012"
    _voc_tree(root, {"a": [("dog", BOX), ("person", BOX), ("persn", BOX)], "b": [("cat", BOX), ("horse", BOX)],
                     "c": [("Dog", BOX), ("zebra", BOX), ("fish", BOX), ("dogs", BOX)]})
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert plan.classes[1:] == ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
                                "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
                                "train", "tvmonitor", "fish", "zebra")
    planned = _planned(plan)
    assert [(b.name, b.label) for b in planned["JPEGImages/a.jpg"].boxes] == [
        ("Annotations/a.xml object 1", 12), ("Annotations/a.xml object 2", 15)]
    assert planned["JPEGImages/a.jpg"].rejected == (
        ("Annotations/a.xml object 3", "unknown-class", "'persn' is not a VOC class: did you mean 'person'?"),)
    assert [(b.name, b.label) for b in planned["JPEGImages/c.jpg"].boxes] == [
        ("Annotations/c.xml object 2", 22), ("Annotations/c.xml object 3", 21)]
    assert planned["JPEGImages/c.jpg"].rejected == (
        ("Annotations/c.xml object 1", "unknown-class", "'Dog' is not a VOC class: did you mean 'dog'?"),
        ("Annotations/c.xml object 4", "unknown-class", "'dogs' is not a VOC class: did you mean 'dog'?"))
    [warning] = [w for w in plan.warnings if "unknown-class" in w]
    assert "3 objects" in warning and "'Dog' (did you mean 'dog'?)" in warning and "fix the names" in warning
    assert "with its image" in warning and "if they are classes of their own" in warning and "--labels" in warning
    [own] = [w for w in plan.warnings if "of its own" in w and "unknown-class" not in w]
    assert "2 class names" in own and "'fish', 'zebra'" in own and "21-22" in own


def test_own_names_among_pascals_number_after_them_and_a_dataset_of_only_its_own_names_from_1(tmp_path):
    root = tmp_path / "VOC2012"
    _voc_tree(root, {"a": [("helmet", BOX), ("person", BOX)], "b": [("vest", BOX)]})
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert plan.classes[15] == "person" and plan.classes[21:] == ("helmet", "vest")
    assert [b.label for b in _planned(plan)["JPEGImages/a.jpg"].boxes] == [21, 15]
    own = tmp_path / "own" / "VOC2012"
    _voc_tree(own, {"a": [("helmet", BOX), ("Person", BOX)], "b": [("vest", BOX)]})  # 'Person': no VOC name here
    plan = plan_inputs(ConvertOptions(src=str(own)))
    assert plan.classes == ("", "Person", "helmet", "vest")
    assert [b.label for b in _planned(plan)["JPEGImages/a.jpg"].boxes] == [2, 1]
    [warning] = [w for w in plan.warnings if "sorted order" in w]
    assert "none of the 3 class names" in warning and "'helmet'" in warning and "pascal_label_map" in warning


@pytest.mark.parametrize("name, meant", [("Dog", "dog"), ("dogs", "dog"), ("buses", "bus"), ("persn", "person"),
                                         ("dining table", "diningtable"), ("Potted_Plant", "pottedplant"),
                                         ("airplane", "aeroplane"), ("TV", "tvmonitor"), ("rat", None),
                                         ("fish", None), ("crow", None), ("bat", None)])
def test_a_near_miss_is_another_case_a_plural_one_edit_or_cocos_name_and_a_short_other_word_is_a_class(name, meant):
    from beam_jobs.sources.objects import voc_classes as voc

    assert voc.near_voc(name) == meant


@pytest.mark.parametrize("name, meant", [("house", "horse"), ("boot", "boat"), ("chain", "chair"), ("sheet", "sheep"),
                                         ("table", "diningtable"), ("plant", "pottedplant"), ("soda", "sofa")])
def test_an_ordinary_word_near_a_voc_name_is_a_class_of_its_own_unless_that_name_is_in_the_dataset(name, meant):
    """One edit, or another dataset's word, is a typo only beside the VOC class it is near: a set of house, car and
    person objects has a class 'house' (21), not images rejected for 'did you mean horse'. Case and plurals stay
    near misses whatever the dataset holds."""
    from beam_jobs.sources.objects import voc_classes as voc

    assert voc.near_voc(name, {name, "car", "person"}) is None
    assert voc.near_voc(name, {name, meant, "person"}) == meant
    assert voc.near_voc(meant.capitalize() + "s", {"car"}) == meant
    names, _ = voc.classes_of({name: 3, "car": 2, "person": 1}, None)
    assert names.index(name) == 21


def test_labels_naming_the_datasets_own_classes_keep_every_name_and_reject_only_those_it_lacks(tmp_path):
    root = tmp_path / "VOC2012"
    _voc_tree(root, {"a": [("dog", BOX), ("Dog", BOX), ("cat", BOX)]})
    labels = tmp_path / "labels.txt"
    labels.write_text("dog\nDog\n")
    plan = plan_inputs(ConvertOptions(src=str(root), labels_file=str(labels)))
    assert plan.classes == ("", "dog", "Dog")
    objects = _planned(plan)["JPEGImages/a.jpg"]
    assert [b.label for b in objects.boxes] == [1, 2]
    assert objects.rejected == (("Annotations/a.xml object 3", "unknown-class", "'cat' is not in --labels"),)


def test_a_listed_image_without_its_jpeg_is_refused_naming_its_xml_and_an_unlisted_xml_without_one_is_warned(tmp_path):
    root = tmp_path / "VOC2012"
    _voc_tree(root, {"a": [("dog", BOX)], "b": [("dog", BOX)], "c": [("cat", BOX)]}, listed=["a", "b"], images=["a"])
    plan = plan_inputs(ConvertOptions(src=str(root)))
    planned = _planned(plan)
    reason, detail = planned["JPEGImages/b.jpg"]
    assert reason == "missing-file" and "Annotations/b.xml" in detail and "JPEGImages/b.jpg" in detail
    [warning] = [w for w in plan.warnings if "no image" in w]
    assert "1 annotation file" in warning and "Annotations/c.xml" in warning


def test_an_image_of_another_extension_is_found_by_its_id(tmp_path):
    root = tmp_path / "VOC2012"
    _voc_tree(root, {"a": [("dog", BOX)]}, images=[])
    write_file(str(root / "JPEGImages/a.png"), b"not read at planning")
    assert list(_planned(plan_inputs(ConvertOptions(src=str(root))))) == ["JPEGImages/a.png"]


@pytest.mark.parametrize("name", ["do\ng", "do\tg", "do\x85g", "per\u2028son"])  # XML 1.0 has no other controls
def test_a_class_name_with_a_control_character_is_refused_at_planning_naming_its_xml(tmp_path, name):
    root = tmp_path / "VOC2012"
    _voc_tree(root, {"a": [("dog", BOX)], "b": [("cat", BOX), ("horse", BOX)]})
    xml = (root / "Annotations/b.xml").read_text().replace("<name>horse</name>", f"<name>{name}</name>")
    (root / "Annotations/b.xml").write_text(xml)
    with pytest.raises(InputError, match=r"Annotations/b.xml object 2.*control character"):
        plan_inputs(ConvertOptions(src=str(root)))
