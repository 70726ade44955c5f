"""``--update`` of object exports (issue #59): COCO, YOLO, Pascal VOC and CVAT, their annotations compared by digest.

The rule of tests/converter/test_update.py, for images that carry objects: the latest version holds exactly SRC's
images with exactly SRC's objects now (the classes by name, the boxes where the export puts them); every image
unchanged since keeps its split, its objects' class ids and its shard file (unless that shard was compacted); an
image whose boxes changed is a changed image though its bytes did not; a new category gets the next id though the
export numbers its categories anew. Small generated exports, converted and updated in this process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest
import tensorflow as tf

import record_schema
from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions, EncodeOptions
from reader.frames import extent_records
from reader.info import dataset_info
from tests.converter.test_update import FAST
from tests.object_data import jpeg, picture, voc_xml, write_file

W, H = 48, 40


def _write_coco(src: str, images: dict, names: list[str]) -> str:
    """A COCO export of ``images`` (name -> [(x0, y0, x1, y1, class)]), categories numbered 1.. in ``names``'
    order; an image's id is its number (``img7.jpg``: 7), as an export keeps it."""
    ids = {name: i + 1 for i, name in enumerate(names)}
    rows, objects = [], []
    for name, boxes in sorted(images.items()):
        number = int(name[3:-4])
        rows.append({"id": number, "file_name": name, "width": W, "height": H})
        for x0, y0, x1, y1, cls in boxes:
            objects.append({"id": len(objects) + 1, "image_id": number, "category_id": ids[cls], "iscrowd": 0,
                            "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
    write_file(os.path.join(src, "annotations", "instances_train.json"), json.dumps(
        {"images": rows, "annotations": objects, "categories": [{"id": ids[n], "name": n} for n in names]}))
    return "train/"


def _write_yolo(src: str, images: dict, names: list[str]) -> str:
    """A YOLO export of ``images``: ``data.yaml`` naming ``names`` 0.., a label file per image."""
    write_file(os.path.join(src, "data.yaml"), "train: images/train\nnames:\n"
               + "".join(f"  {i}: {name}\n" for i, name in enumerate(names)))
    labels = os.path.join(src, "labels", "train")
    for name in os.listdir(labels) if os.path.isdir(labels) else ():
        os.remove(os.path.join(labels, name))
    for name, boxes in images.items():
        write_file(os.path.join(labels, name[:-4] + ".txt"), "".join(
            f"{names.index(c)} {(x0 + x1) / 2 / W} {(y0 + y1) / 2 / H} {(x1 - x0) / W} {(y1 - y0) / H}\n"
            for x0, y0, x1, y1, c in boxes))
    return "images/train/"


def _write_voc(src: str, images: dict, names: list[str]) -> str:
    """A Pascal VOC export as Roboflow writes it: ``train/<image>.xml`` beside each image (``names`` unused: VOC
    numbers its own classes, and the others after them)."""
    folder = os.path.join(src, "train")
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if name.endswith(".xml"):
            os.remove(os.path.join(folder, name))
    for name, boxes in images.items():
        write_file(os.path.join(folder, name[:-4] + ".xml"),
                   voc_xml(W, H, [(c, (x0 + 1, y0 + 1, x1, y1), 0) for x0, y0, x1, y1, c in boxes]))  # 1-based
    return "train/"


def _write_cvat(src: str, images: dict, names: list[str]) -> str:
    """CVAT for images 1.1 as a task's export writes it: ``annotations.xml`` (its labels in ``names``' order, an
    image's id its number), the images in ``images/``."""
    labels = "".join(f"<label><name>{name}</name><type>any</type><attributes/></label>" for name in names)
    parts = [f"<annotations><version>1.1</version><meta><task><labels>{labels}</labels></task></meta>"]
    for name, boxes in sorted(images.items()):
        shapes = "".join(f'<box label="{c}" occluded="0" xtl="{x0}" ytl="{y0}" xbr="{x1}" ybr="{y1}" z_order="0"/>'
                         for x0, y0, x1, y1, c in boxes)
        parts.append(f'<image id="{int(name[3:-4])}" name="{name}" width="{W}" height="{H}">{shapes}</image>')
    write_file(os.path.join(src, "annotations.xml"), "".join(parts) + "</annotations>")
    return "images/"


_FOLDER = {_write_coco: "train", _write_yolo: "images/train", _write_voc: "train", _write_cvat: "images"}


def _export(src: str, write, images: dict, names: list[str], new=()) -> str:
    """Write the export, and the image files of ``new`` (others are left as they are: their stamps kept)."""
    for name in new:
        boxes = [box[:4] for box in images[name]]
        write_file(os.path.join(src, _FOLDER[write], name), jpeg(picture(W, H, boxes, seed=int(name[3:-4]))))
    return write(src, images, names)


def _records(out: str) -> dict[str, tuple]:
    """path -> (split, object class ids, object class names, boxes rounded, shard) of the latest version."""
    info, found = dataset_info(out), {}
    for split in info.splits.values():
        for shard in split.shards:  # extents: a masked shard's runs only
            for raw in extent_records(shard.path, shard.index_path, shard.first, shard.num_examples):
                f = tf.train.Example.FromString(raw).features.feature
                ids = tuple(f[record_schema.OBJECT_LABEL].int64_list.value)
                boxes = tuple(zip(*(tuple(round(v, 3) for v in f[f"image/object/bbox/{k}"].float_list.value)
                                    for k in ("xmin", "ymin", "xmax", "ymax"))))
                path = f[record_schema.FILENAME].bytes_list.value[0].decode()
                assert path not in found, path
                found[path] = (split.name, ids, tuple(info.classes[i] for i in ids), boxes,
                               os.path.relpath(shard.path, out))
    return found


def _expected(prefix: str, images: dict) -> dict[str, tuple]:
    """path -> (class names, boxes rounded) as the export gives them."""
    return {prefix + name: (tuple(c for *_, c in boxes), tuple(
        (round(x0 / W, 3), round(y0 / H, 3), round(x1 / W, 3), round(y1 / H, 3)) for x0, y0, x1, y1, _ in boxes))
        for name, boxes in images.items()}


def _check(out: str, prefix: str, images: dict, before: dict, changed: set[str]) -> dict:
    """The latest version holds exactly the export's images and objects; the unchanged keep split, ids, shard."""
    now = _records(out)
    assert {path: (names, boxes) for path, (_, _, names, boxes, _) in now.items()} == _expected(prefix, images)
    compacted = {before[p][4] for p in before if p in changed or p not in now}
    # A small shard (an earlier update's new one) may be merged with others though it lost nothing: its records
    # move into the version's compacted/ shards (docs/update.md, "Merging small shards").
    listed = {record[4] for record in now.values()}
    for path, (split, ids, _, _, shard) in before.items():
        if path in now and path not in changed:
            assert now[path][:2] == (split, ids), path
            assert shard in compacted or now[path][4] == shard or (
                shard not in listed and "/compacted/" in now[path][4]), path
    return now


def _options(src: str, out: str, **more) -> ConvertOptions:
    return ConvertOptions(src=src, out=out, val_fraction=0.25, near_distance=3, shards=2, **more)


def _images(names: list[str]) -> dict:
    return {f"img{i}.jpg": [(4 + i, 4, 20 + i, 18, names[i % 2])] + ([(24, 20, 44, 36, "dog")] if i % 3 else [])
            for i in range(1, 9)}


def _converted(tmp_path, write) -> tuple:
    """``(src, out, names, images, prefix, records)``: an export of :func:`_images` written by ``write`` and converted."""
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    names = ["cat", "dog"]
    images = _images(names)
    prefix = _export(src, write, images, names, new=images)
    conversion.run(_options(src, out), FAST, show_progress=False)
    return src, out, names, images, prefix, _check(out, prefix, images, {}, set())


@pytest.mark.slow
@pytest.mark.parametrize("write", [_write_coco, _write_yolo], ids=["coco", "yolo"])
def test_an_object_export_updates_its_changed_boxes_new_category_and_deleted_image(tmp_path, write, caplog):
    src, out, names, images, prefix, first = _converted(tmp_path, write)

    # Added images, one of a new category; one deleted; one image's box moved (its class and bytes as they were):
    # the conversion recorded version 1's annotation digests, so the first update sees it, and warns of nothing.
    del images["img3.jpg"]
    os.remove(os.path.join(src, _FOLDER[write], "img3.jpg"))
    added = {"img10.jpg": [(2, 2, 30, 30, "kite")], "img11.jpg": [(5, 5, 25, 25, "cat")],
             "img12.jpg": [(6, 6, 40, 30, "dog"), (1, 1, 9, 9, "kite")]}
    images.update(added)
    images["img2.jpg"] = [(8, 6, 26, 20, "cat")] + images["img2.jpg"][1:]
    _export(src, write, images, names + ["kite"], new=added)
    with caplog.at_level(logging.WARNING):
        done = update.run(_options(src, out), FAST)
    assert (done.version, done.changes["added"], done.changes["deleted"], done.changes["changed"]) == (2, 3, 1, 1)
    assert dataset_info(out).classes[-1] == "kite" and "kite" not in dataset_info(out, version=1).classes
    assert not [r for r in caplog.records if "annotation digest" in r.getMessage()]
    second = _check(out, prefix, images, first, {prefix + "img2.jpg"})

    # One image's boxes moved, and the categories numbered anew (kite first, a new fish): only that image is
    # changed, --rehash or not (every row has its digest; the stored bytes are the source's).
    images["img5.jpg"] = [(10, 10, 30, 30, "cat")]
    _export(src, write, images, ["kite", "fish", "dog", "cat"])
    done = update.run(_options(src, out), FAST, rehash=True)
    assert (done.version, done.changes["changed"], done.changes["added"]) == (3, 1, 0)
    third = _check(out, prefix, images, second, {prefix + "img5.jpg"})

    # Then one image's boxes change (an object of the new category added) and a new image: only those.
    images["img6.jpg"] = [(10, 10, 30, 30, "dog"), (1, 2, 20, 22, "fish")]
    images["img13.jpg"] = [(3, 3, 33, 33, "fish")]
    _export(src, write, images, ["kite", "fish", "dog", "cat"], new=["img13.jpg"])
    done = update.run(_options(src, out), FAST)
    assert (done.changes["added"], done.changes["changed"], done.changes["deleted"]) == (1, 1, 0)
    _check(out, prefix, images, third, {prefix + "img6.jpg"})
    classes = dataset_info(out).classes
    assert classes[:len(dataset_info(out, version=1).classes)] == dataset_info(out, version=1).classes
    assert classes[-2:] == ("kite", "fish")
    assert update.run(_options(src, out), FAST).version is None  # nothing changed: no version


@pytest.mark.slow
@pytest.mark.parametrize("write", [_write_voc, _write_cvat], ids=["voc", "cvat"])
def test_a_voc_or_cvat_export_updates_a_box_moved_since_the_conversion_and_a_new_image(tmp_path, write):
    """VOC's and CVAT's own parsing under --update (the sequence is COCO's and YOLO's, above): a box moved without
    a class change right after the conversion is a changed image; a new image of a new category gets the next id."""
    src, out, names, images, prefix, first = _converted(tmp_path, write)
    images["img4.jpg"] = [(9, 5, 27, 21, "cat")] + images["img4.jpg"][1:]
    added = {"img10.jpg": [(2, 2, 30, 30, "kite")]}
    images.update(added)
    _export(src, write, images, names + ["kite"], new=added)
    done = update.run(_options(src, out), FAST)
    assert (done.version, done.changes["added"], done.changes["changed"], done.changes["deleted"]) == (2, 1, 1, 0)
    _check(out, prefix, images, first, {prefix + "img4.jpg"})
    assert dataset_info(out).classes[-1] == "kite"


def test_an_update_refuses_a_source_it_does_not_update_naming_it_and_what_works(tmp_path, monkeypatch):
    """Every source updates now (class masks too: tests/converter/test_update_masks.py); one left out of
    ``checks.UPDATABLE`` is refused before its annotations are read, naming it and what works."""
    from beam_jobs.update import checks

    monkeypatch.setattr(checks, "UPDATABLE", tuple(name for name in checks.UPDATABLE if name != "voc-segmentation"))
    out = tmp_path / "out"
    write_file(str(out / record_schema.MANIFEST_FILE), json.dumps(
        {"format_version": 1, "classes": ["", "a"], "splits": {}, "options": {"seed": 0}}))
    voc = tmp_path / "voc"  # VOC's class masks: a PNG a class id a pixel
    write_file(str(voc / "SegmentationClass" / "a.png"), b"")
    write_file(str(voc / "JPEGImages" / "a.jpg"), b"")
    with pytest.raises(update.UpdateRefusedError, match=r"supports class folders, .* Pascal VOC, CVAT, .* only "
                                                        r"for now; .*voc is read as .*\(voc-segmentation\).*--overwrite"):
        update.run(ConvertOptions(src=str(voc), out=str(out)), FAST)


def test_an_object_images_stable_ids_and_digest_on_its_json_are_those_of_its_boxes_remapped():
    from beam_jobs import annotations
    from beam_jobs.planning import stable_ids
    from beam_jobs.stage_records import ImageRef
    from record_files.versions import NO_ANNOTATION, label_key

    boxes = (annotations.Box("annotation 7", 1, 1.5, 2.25, 30.1, 20.0, 580.0, crowd=True),
             annotations.Box("annotation 8", 2, 5.0, 6.0, 5.0, 33.0),  # no extent: not in the record
             annotations.Box("annotation 9", 2, 0.1, 0.2, 0.3, 0.4, keypoints=(1.0, 2.0, 2)))
    objects = annotations.Objects("17", boxes, (48, 40), captions=("a cat",), keypoints=1)
    ids = [0, 3, 1]
    ref, held, key, digest = stable_ids.stable_ref(ImageRef("train", "a.jpg", 0, "", annotations.encode(objects)), ids)
    remapped = annotations.Objects("17", tuple(box._replace(label=ids[box.label]) for box in boxes), (48, 40),
                                   captions=("a cat",), keypoints=1)
    assert ref.annotation == annotations.encode(remapped) and (held, key) == ((3, 1), label_key((3, 1)))
    assert digest == stable_ids.annotation_digest(remapped)
    renamed = annotations.Objects("17", tuple(box._replace(name="line 1") for box in boxes), (48, 40),
                                  captions=("a cat",), keypoints=1)
    assert stable_ids.stable_ref(ImageRef("train", "a.jpg", 0, "", annotations.encode(renamed)), ids)[3] == digest
    moved = annotations.Objects("17", (boxes[0]._replace(xmax=31.0),) + boxes[1:], (48, 40), captions=("a cat",),
                                keypoints=1)
    assert stable_ids.stable_ref(ImageRef("train", "a.jpg", 0, "", annotations.encode(moved)), ids)[3] != digest
    # Version 1's sources table takes the digest and the semantic mask from one decode: the same digest.
    assert stable_ids.objects_digest(annotations.encode(renamed), ids) == (digest, None)
    masked = dataclasses.replace(objects, class_mask=("masks/a.png", ""))
    assert stable_ids.objects_digest(annotations.encode(masked), ids) == (
        stable_ids.stable_ref(ImageRef("train", "a.jpg", 0, "", annotations.encode(masked)), ids)[3], ["masks/a.png", ""])
    assert stable_ids.objects_digest(annotations.encode(annotations.Labels((1, 2))), ids) == (NO_ANNOTATION, None)


@pytest.mark.slow
def test_an_image_whose_record_left_a_box_out_is_unchanged_and_a_class_named_twice_is_refused(tmp_path):
    """A box past the image's edge is left out of its record (--keep-partial-images keeps the image): the image's
    row says the record's classes, SRC's boxes say one more, and the digest is what compares objects, so an update
    with nothing changed writes no version (it converted the image again at every update: the review's finding).
    A category named twice would merge into one id under ids by name: the update is refused, naming it."""
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    names = ["cat", "dog"]
    images = _images(names)
    images["img2.jpg"] = images["img2.jpg"] + [(30, 10, W + 20, 30, "dog")]  # past the right edge
    _export(src, _write_coco, images, names, new=images)
    partial = EncodeOptions(keep_partial_images=True)
    conversion.run(_options(src, out, encode=partial, max_bad_fraction=0.2), FAST, show_progress=False)
    assert update.run(_options(src, out, encode=partial, max_bad_fraction=0.2), FAST).version is None
    coco = os.path.join(src, "annotations", "instances_train.json")
    export = json.loads(open(coco).read())
    export["categories"].append({"id": 3, "name": "dog"})  # a second id of one name (no box of it yet)
    write_file(coco, json.dumps(export))
    with pytest.raises(update.UpdateRefusedError, match="names the class 'dog' more than once"):
        update.run(_options(src, out, encode=partial, max_bad_fraction=0.2), FAST)
