"""Pascal VOC as it ships: split lists, 1-based inclusive boxes, the OD API's class ids, difficult kept."""

from __future__ import annotations

import json

import numpy as np

from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from tests.object_data import jpeg, object_records, picture, red_fraction, voc_palette_png, voc_xml, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_voc_converts_with_its_split_lists_and_the_od_apis_ids(tmp_path, caplog):
    root = tmp_path / "VOCdevkit" / "VOC2012"
    # Pixels 10..29 and 50..69 (0-based) are red: VOC writes them 1-based, inclusive: 11..30 and 51..70.
    write_file(str(root / "JPEGImages/2008_000001.jpg"), jpeg(picture(80, 48, [(10, 5, 30, 20), (50, 30, 70, 44)])))
    write_file(str(root / "Annotations/2008_000001.xml"),
               voc_xml(80, 48, [("dog", (11, 6, 30, 20), 0), ("person", (51, 31, 70, 44), 1), ("cat", (9, 1, 5, 5), 0)]))
    write_file(str(root / "JPEGImages/2008_000002.jpg"), jpeg(picture(40, 40, [(0, 0, 40, 40)], seed=2)))
    write_file(str(root / "Annotations/2008_000002.xml"), voc_xml(40, 40, [("cat", (1, 1, 40, 40), 0)]))
    write_file(str(root / "JPEGImages/2008_000003.jpg"), jpeg(picture(40, 40, [], seed=3)))
    write_file(str(root / "Annotations/2008_000003.xml"), "<annotation><object>")  # cut short
    write_file(str(root / "JPEGImages/2008_000009.jpg"), jpeg(picture(40, 40, [], seed=9)))  # in no list
    write_file(str(root / "ImageSets/Main/train.txt"), "2008_000001\n2008_000003\n")
    write_file(str(root / "ImageSets/Main/val.txt"), "2008_000002\n")
    write_file(str(root / "ImageSets/Main/trainval.txt"), "2008_000001\n2008_000002\n2008_000003\n")
    out = tmp_path / "ds"
    with caplog.at_level("WARNING"):
        run(ConvertOptions(src=str(tmp_path / "VOCdevkit"), out=str(out), shards=1, max_bad_fraction=0.5), FAST,
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
    assert {(r["path"], r["reason"], r.get("annotation")) for r in rejected} == {
        ("VOC2012/JPEGImages/2008_000001.jpg", "box-empty", "VOC2012/JPEGImages/2008_000001.jpg object 3"),
        ("VOC2012/JPEGImages/2008_000003.jpg", "bad-annotation", None)}
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
