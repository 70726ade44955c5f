"""Real-shaped samples of the layouts #57 §2 added, through the converter's command line and the reader.

The trees are laid out as their distributions ship them, generated small: VOC2012's (``VOCdevkit/VOC2012/``,
its XML fields and ids, ``ImageSets/Main`` and ``ImageSets/Segmentation``, palette PNGs in VOC's colours in
``SegmentationClass/`` and ``SegmentationObject/``), COCO 2017's ``annotations/`` (``instances_``,
``person_keypoints_`` with COCO's 17 named points and its skeleton, ``captions_``) beside ``val2017/``, and CVAT's
Segmentation mask 1.1 export (``labelmap.txt``, RGB masks, ``ImageSets/Segmentation/default.txt``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import reader
import record_schema
from tests.conftest import run_converter
from tests.object_data import jpeg, palette_png, picture, voc_segmented, write_coco, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1", "--no-progress"]
COCO_KEYPOINTS = ["nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
                  "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
                  "right_knee", "left_ankle", "right_ankle"]
VOC_NAMES = {1: "aeroplane", 15: "person", 12: "dog"}


def _voc_xml(image_id: str, width: int, height: int, objects) -> str:
    """An annotation as VOC2012 writes it (folder, filename, source, size, segmented, each object's pose)."""
    parts = [f"<annotation><folder>VOC2012</folder><filename>{image_id}.jpg</filename><source><database>The VOC2007 "
             "Database</database><annotation>PASCAL VOC2007</annotation><image>flickr</image></source><size>"
             f"<width>{width}</width><height>{height}</height><depth>3</depth></size><segmented>1</segmented>"]
    for name, (x0, y0, x1, y1) in objects:
        parts.append(f"<object><name>{name}</name><pose>Frontal</pose><truncated>0</truncated><difficult>0</difficult>"
                     f"<bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>")
    return "\n".join(parts) + "\n</annotation>\n"


@pytest.mark.e2e
def test_a_voc2012_segmentation_sample_converts_with_masks_and_reads_with_them(tmp_path):
    root = tmp_path / "VOCdevkit" / "VOC2012"
    instances = {}
    for seed, (image_id, classes) in enumerate({"2007_000032": [1, 1, 15], "2007_000033": [1, 15],
                                                "2007_000039": [12]}.items()):
        pixels, instance, class_ids, boxes = voc_segmented(72, 54, classes, seed=seed)
        write_file(str(root / f"JPEGImages/{image_id}.jpg"), jpeg(pixels))
        write_file(str(root / f"Annotations/{image_id}.xml"),
                   _voc_xml(image_id, 72, 54, [(VOC_NAMES[c], box) for c, box in zip(classes, boxes)]))
        write_file(str(root / f"SegmentationClass/{image_id}.png"), palette_png(class_ids))
        write_file(str(root / f"SegmentationObject/{image_id}.png"), palette_png(instance))
        instances[image_id] = instance
    for kind in ("Main", "Segmentation"):
        write_file(str(root / f"ImageSets/{kind}/train.txt"), "2007_000032\n2007_000039\n")
        write_file(str(root / f"ImageSets/{kind}/val.txt"), "2007_000033\n")
    out = tmp_path / "voc-ds"
    run_converter("--src", str(tmp_path / "VOCdevkit"), "--out", str(out), "--masks", "--shards", "1", *FAST,
                  check=True)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    assert manifest["num_rejected"] == 0
    skipped = [json.loads(line) for line in (out / record_schema.SKIPPED_FILE).read_text().splitlines()]
    assert sorted(s["path"] for s in skipped) == ["VOC2012/ImageSets/Main/train.txt", "VOC2012/ImageSets/Main/val.txt"]
    assert all(s["reason"] == "splits-from-segmentation" and s["detail"] == "an ImageSets/Main list: the splits of "
               "VOC2012/ come from ImageSets/Segmentation/ (--masks reads the images VOC segmented)" for s in skipped)
    assert {s: v["num_examples"] for s, v in manifest["splits"].items()} == {"train": 2, "validation": 1}
    dataset = reader.build_dataset(str(out), "train", batch_size=2, image_size=(54, 72), training=False,
                                   targets=reader.ObjectTargets(mask_size=28, class_mask=True))
    [(_, targets)] = list(dataset)
    counts = (targets["labels"].numpy() >= 0).sum(axis=1)
    assert sorted(counts.tolist()) == [1, 3]
    masks = targets["masks"].numpy()
    for count, image_masks in zip(counts, masks):
        assert all(image_masks[k].mean() > 0.2 for k in range(count))  # each object's mask fills much of its box
        assert not image_masks[count:].any()
    assert set(np.unique(targets["class_mask"].numpy())) <= {0, 1, 12, 15, 255}


@pytest.mark.e2e
def test_a_coco_2017_sample_with_keypoints_and_captions_converts_and_reads_them(tmp_path):
    root = tmp_path / "coco2017"
    images = [{"id": 139, "file_name": "000000000139.jpg", "width": 64, "height": 48},
              {"id": 785, "file_name": "000000000785.jpg", "width": 64, "height": 48}]
    person = {"supercategory": "person", "id": 1, "name": "person"}
    anns = [{"id": 200887, "image_id": 139, "category_id": 1, "bbox": [10, 8, 20, 30], "area": 600, "iscrowd": 0,
             "segmentation": [[10, 8, 30, 8, 30, 38, 10, 38]]},
            {"id": 1218137, "image_id": 785, "category_id": 1, "bbox": [30, 4, 24, 40], "area": 960, "iscrowd": 0,
             "segmentation": [[30, 4, 54, 4, 54, 44, 30, 44]]}]
    write_coco(str(root), "val2017", images, anns, [person],
               {"000000000139.jpg": jpeg(picture(64, 48, [(10, 8, 30, 38)], seed=1)),
                "000000000785.jpg": jpeg(picture(64, 48, [(30, 4, 54, 44)], seed=2))})
    rng = np.random.default_rng(0)
    points = []
    for ann in anns:
        x, y, w, h = ann["bbox"]
        values = []
        for _ in COCO_KEYPOINTS:
            visible = int(rng.integers(0, 3))
            values += [int(rng.integers(x, x + w)), int(rng.integers(y, y + h)), visible] if visible else [0, 0, 0]
        points.append({**ann, "keypoints": values, "num_keypoints": sum(1 for v in values[2::3] if v)})
    skeleton = [[16, 14], [14, 12], [17, 15], [15, 13], [12, 13], [6, 12], [7, 13], [6, 7]]
    write_file(str(root / "annotations/person_keypoints_val2017.json"), json.dumps(
        {"info": {}, "images": images, "annotations": points,
         "categories": [{**person, "keypoints": COCO_KEYPOINTS, "skeleton": skeleton}]}))
    write_file(str(root / "annotations/captions_val2017.json"), json.dumps(
        {"info": {}, "images": images, "annotations": [
            {"image_id": 139, "id": 372891, "caption": "A woman stands in the dining area at the table."},
            {"image_id": 785, "id": 3431, "caption": "A woman posing for the camera, standing on skis."}]}))
    out = tmp_path / "coco-ds"
    run_converter("--src", str(root), "--out", str(out), "--shards", "1", *FAST, check=True)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    assert manifest["num_skipped"] == 0 and record_schema.CAPTION in manifest["features"]
    dataset = reader.build_dataset(str(out), "validation", batch_size=2, image_size=(48, 64), training=False,
                                   targets=reader.ObjectTargets(bounding_box_format="xyxy", keypoints=17,
                                                                keypoint_flip=reader.COCO_KEYPOINT_FLIP))
    [(_, targets)] = list(dataset)
    read = {int(round(box[0])): pts for box, pts in zip(targets["boxes"].numpy()[:, 0],
                                                          targets["keypoints"].numpy()[:, 0])}
    for point in points:  # the output is the stored size: the points are COCO's pixels again
        expected = np.array(point["keypoints"], np.float32).reshape(17, 3)
        assert np.allclose(read[point["bbox"][0]], expected, atol=1e-3)
    records = tf.data.TFRecordDataset(reader.dataset_info(str(out)).split("validation").files)
    captions = sorted(tf.train.Example.FromString(raw.numpy()).features.feature[record_schema.CAPTION]
                      .bytes_list.value[0].decode() for raw in records)
    assert captions == ["A woman posing for the camera, standing on skis.",
                        "A woman stands in the dining area at the table."]


@pytest.mark.e2e
def test_a_cvat_segmentation_mask_export_converts_by_its_labelmap_and_reads_as_class_masks(tmp_path):
    import io

    from PIL import Image

    src = tmp_path / "task_42-segmentation mask 1.1"
    write_file(str(src / "labelmap.txt"), "# label:color_rgb:parts:actions\nbackground:0,0,0::\n"
                                          "road:128,64,128::\ncar:0,0,142::\n")
    colours = np.array([(0, 0, 0), (128, 64, 128), (0, 0, 142)], np.uint8)
    expected = {}
    for seed, name in enumerate(("frame_000000", "frame_000001")):
        _, instance, _, _ = voc_segmented(64, 40, [1, 2], seed=seed)
        ids = np.where(instance == 255, 0, instance).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(colours[ids]).save(out, format="PNG")
        write_file(str(src / f"SegmentationClass/{name}.png"), out.getvalue())
        write_file(str(src / f"JPEGImages/{name}.jpg"), jpeg(picture(64, 40, [], seed=seed)))
        expected[name] = ids
    write_file(str(src / "ImageSets/Segmentation/default.txt"), "frame_000000\nframe_000001\n")
    out_dir = tmp_path / "seg-ds"
    run_converter("--src", str(src), "--out", str(out_dir), "--shards", "1", *FAST, check=True)
    info = reader.dataset_info(str(out_dir))
    assert info.task == record_schema.TASK_SEGMENTATION and list(info.classes) == ["background", "road", "car"]
    dataset = reader.build_dataset(str(out_dir), "train", batch_size=2, image_size=(40, 64), training=False)
    [(_, class_masks)] = list(dataset)
    found = sorted(class_masks.numpy()[..., 0].tolist())
    assert found == sorted(ids.tolist() for ids in expected.values())  # the output is the stored size: pixel for pixel
