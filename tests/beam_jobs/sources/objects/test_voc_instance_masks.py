"""VOC with --masks and SegmentationObject/: each object's mask is its instance's pixels, pixel for pixel; its class
is checked against SegmentationClass/; images without masks are refused (a Segmentation list names them) or
skipped and counted (no list does) (issue #57 §2)."""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from tests.object_data import jpeg, object_records, palette_png, voc_segmented, voc_xml, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
VOC_NAMES = {8: "cat", 12: "dog", 15: "person", 7: "car"}


def _segmented_image(root, image_id: str, classes, seed: int, width: int = 64, height: int = 48,
                     class_ids_changed=None, instance_changed=None, object_png: bool = True):
    """Writes one segmented VOC image (JPEG, XML, both PNGs); returns its instance ids."""
    picture, instance, class_ids, boxes = voc_segmented(width, height, classes, seed)
    write_file(str(root / f"JPEGImages/{image_id}.jpg"), jpeg(picture))
    write_file(str(root / f"Annotations/{image_id}.xml"),
               voc_xml(width, height, [(VOC_NAMES[c], box, 0) for c, box in zip(classes, boxes)]))
    write_file(str(root / f"SegmentationClass/{image_id}.png"),
               palette_png(class_ids_changed(class_ids, instance) if class_ids_changed else class_ids))
    if object_png:
        write_file(str(root / f"SegmentationObject/{image_id}.png"),
                   palette_png(instance_changed(instance) if instance_changed else instance))
    return instance


def _brute_force_mask(instance: np.ndarray, k: int) -> np.ndarray:
    """Instance k's pixels, one by one: the reference the written masks are compared with."""
    height, width = instance.shape
    mask = np.zeros((height, width), np.uint8)
    for y in range(height):
        for x in range(width):
            if int(instance[y, x]) == k:
                mask[y, x] = 1
    return mask


def _relabelled(class_ids, instance):
    changed = class_ids.copy()
    changed[instance == 2] = 8  # the class mask says cat where the XML's object 2 is a dog
    return changed


def _extra_instance(instance):
    changed = instance.copy()
    changed[0:2, 0:2] = 3  # an instance 3, where the XML has two objects
    return changed


def test_each_objects_mask_is_its_instances_pixels_and_masks_that_disagree_with_the_xml_reject_their_image(tmp_path):
    src = tmp_path / "VOCdevkit"
    voc12, voc07 = src / "VOC2012", src / "VOC2007"
    instances = {"a": _segmented_image(voc12, "a", [12, 15, 8], seed=1),
                 "e": _segmented_image(voc07, "e", [7, 12], seed=5, width=40, height=56)}
    _segmented_image(voc12, "b", [15, 12], seed=2, class_ids_changed=_relabelled)
    _segmented_image(voc12, "c", [12, 8], seed=3, instance_changed=_extra_instance)
    _segmented_image(voc12, "d", [12], seed=4, object_png=False)  # listed, its SegmentationObject PNG missing
    write_file(str(voc12 / "ImageSets/Segmentation/train.txt"), "a\nb\nc\nd\n")
    # VOC2007 here has no Segmentation lists: read by its Main list; f has no masks at all.
    picture, _, _, boxes = voc_segmented(40, 40, [12], seed=6)
    write_file(str(voc07 / "JPEGImages/f.jpg"), jpeg(picture))
    write_file(str(voc07 / "Annotations/f.xml"), voc_xml(40, 40, [("dog", boxes[0], 0)]))
    write_file(str(voc07 / "ImageSets/Main/val.txt"), "e\nf\n")
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(src), out=str(out), shards=1, masks=True, max_bad_fraction=0.7), FAST,
        show_progress=False)

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["features"]["image/object/mask"] == "bytes_list"
    assert manifest["skipped_by_reason"]["no-mask"] == 1
    records = object_records(out)
    assert sorted(records) == ["VOC2007/JPEGImages/e.jpg", "VOC2012/JPEGImages/a.jpg"]
    checked = 0
    for image_id, root in (("a", "VOC2012"), ("e", "VOC2007")):
        record, instance = records[f"{root}/JPEGImages/{image_id}.jpg"], instances[image_id]
        written = [np.asarray(Image.open(io.BytesIO(png))) for png in record["image/object/mask"]]
        assert len(written) == len(record["image/object/class/label"]) == int(instance[instance < 255].max())
        for k, mask in enumerate(written, start=1):
            reference = _brute_force_mask(instance, k)
            assert mask.shape == reference.shape and np.array_equal(mask, reference), (image_id, k)
            checked += int(reference.size)
        class_mask = np.asarray(Image.open(io.BytesIO(record["image/segmentation/class/encoded"][0])))
        assert set(np.unique(class_mask[instance == 255])) == {255}  # the void band kept
    assert checked == 3 * 64 * 48 + 2 * 40 * 56

    rejected = {r["path"]: r for r in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    assert {path: r["reason"] for path, r in rejected.items()} == {
        "VOC2012/JPEGImages/b.jpg": "bad-mask", "VOC2012/JPEGImages/c.jpg": "bad-mask",
        "VOC2012/JPEGImages/d.jpg": "missing-file"}
    assert rejected["VOC2012/JPEGImages/b.jpg"]["detail"].startswith("VOC2012/Annotations/b.xml object 2: ")
    assert "are class 8 in VOC2012/SegmentationClass/b.png, not its class 12" in rejected["VOC2012/JPEGImages/b.jpg"]["detail"]
    assert "instance id 3 has pixels, but its XML has 2 objects" in rejected["VOC2012/JPEGImages/c.jpg"]["detail"]
    assert "VOC2012/SegmentationObject/d.png is not there" in rejected["VOC2012/JPEGImages/d.jpg"]["detail"]
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(s["path"], s["reason"]) for s in skipped if s["reason"] == "no-mask"] == [
        ("VOC2007/JPEGImages/f.jpg", "no-mask")]


def test_a_second_root_without_segmentation_object_keeps_its_images_with_class_masks(tmp_path):
    """VOC2012 has SegmentationObject/, VOC2007 only SegmentationClass/: whether object masks are read is decided
    a root, so VOC2007's listed images are planned with their class masks (not refused as missing-file for a
    folder their root does not have), and a warning names VOC2007 (review #57 §7)."""
    from beam_jobs import annotations
    from beam_jobs.sources import plan_inputs

    src = tmp_path / "VOCdevkit"
    voc12, voc07 = src / "VOC2012", src / "VOC2007"
    _segmented_image(voc12, "a", [12, 15], seed=1)
    _segmented_image(voc07, "e", [7], seed=5, object_png=False)
    write_file(str(voc12 / "ImageSets/Segmentation/train.txt"), "a\n")
    write_file(str(voc07 / "ImageSets/Segmentation/train.txt"), "e\n")
    plan = plan_inputs(ConvertOptions(src=str(src), masks=True))
    found = {ref.relpath: ref for ref in plan.refs}
    assert set(found) == {"VOC2012/JPEGImages/a.jpg", "VOC2007/JPEGImages/e.jpg"}, found
    e = annotations.decode(found["VOC2007/JPEGImages/e.jpg"].annotation)
    a = annotations.decode(found["VOC2012/JPEGImages/a.jpg"].annotation)
    assert e.class_mask[0] == "VOC2007/SegmentationClass/e.png" and not e.masks and not e.rejected
    assert a.masks and all(box.mask for box in a.boxes)
    assert any(w.startswith("VOC2007/: no SegmentationObject/") for w in plan.warnings), plan.warnings


def test_masks_with_labels_that_renumber_vocs_classes_are_refused_naming_both_flags(tmp_path):
    """VOC's PNGs hold VOC's class ids (cat 8); --labels 'cat, dog, person' numbers cat 1: every instance mask
    would be refused as disagreeing with its XML and the class masks written in VOC's ids under other names, so
    the run is refused naming both flags; --labels keeping VOC's 20 in order (then one's own) plans (review #57)."""
    import pytest

    from beam_jobs.planning.discover import InputError
    from beam_jobs.sources import plan_inputs
    from beam_jobs.sources.objects.voc_classes import VOC_CLASSES

    src = tmp_path / "VOCdevkit"
    voc = src / "VOC2012"
    _segmented_image(voc, "a", [12, 8], seed=1)
    write_file(str(voc / "ImageSets/Segmentation/train.txt"), "a\n")
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\nperson\n")
    with pytest.raises(InputError, match=r"--masks with --labels: .*'cat' 1 \(VOC's 8\).*Leave --labels out"):
        plan_inputs(ConvertOptions(src=str(src), masks=True, labels_file=str(labels)))
    labels.write_text("\n".join(VOC_CLASSES) + "\nwidget\n")
    plan = plan_inputs(ConvertOptions(src=str(src), masks=True, labels_file=str(labels)))
    [ref] = plan.refs
    from beam_jobs import annotations

    objects = annotations.decode(ref.annotation)
    assert [box.label for box in objects.boxes] == [12, 8] and all(box.mask for box in objects.boxes)


def test_main_lists_unread_with_masks_are_named_for_the_segmentation_lists_and_inspect_shows_classes_with_objects(
        tmp_path):
    """--masks takes VOC2012's splits from ImageSets/Segmentation: the run's summary names Main's lists as skipped
    because of it (splits-from-segmentation), not as outside the layout; without --masks the Segmentation lists are
    named for Main's. inspect lists the classes that have objects and puts VOC's others on one line."""
    from beam_jobs.sources import plan_inputs
    from reader.tools.inspect import summarize

    src = tmp_path / "VOCdevkit"
    voc = src / "VOC2012"
    _segmented_image(voc, "a", [12, 15], seed=1)
    _segmented_image(voc, "b", [8], seed=2)
    for kind in ("Segmentation", "Main"):
        write_file(str(voc / f"ImageSets/{kind}/train.txt"), "a\n")
        write_file(str(voc / f"ImageSets/{kind}/val.txt"), "b\n")
    write_file(str(voc / "ImageSets/Main/cat_train.txt"), "a -1\n")
    summary = run(ConvertOptions(src=str(src), out=str(tmp_path / "ds"), shards=1, masks=True), FAST,
                  show_progress=False).format()
    assert "splits-from-segmentation 3: VOC2012/ImageSets/Main/cat_train.txt, VOC2012/ImageSets/Main/train.txt, " \
        "VOC2012/ImageSets/Main/val.txt" in summary, summary
    assert "not-in-layout" not in summary, summary
    plan = plan_inputs(ConvertOptions(src=str(src)))  # boxes alone: Main's lists, Segmentation's unread
    assert plan.skipped["splits-from-main"] == 2 and plan.skipped["not-in-layout"] == 5, plan.skipped  # 4 PNGs,
    # and Main/cat_train.txt: a class's list of the lists read
    table = summarize(str(tmp_path / "ds")).splitlines()
    assert table[0].endswith(": 20 classes, 2 images, " + table[0].split(", ")[-1])
    assert [line.split() for line in table[2:8]] == [
        ["label", "class", "train", "validation"], ["8", "cat", "0", "1"], ["12", "dog", "1", "0"],
        ["15", "person", "1", "0"], ["objects", "2", "1"], ["images", "1", "1"]]
    assert table[8] == "(17 classes without objects: aeroplane, bicycle, bird, boat, bottle, bus, car, chair, cow, " \
        "diningtable ...)"
