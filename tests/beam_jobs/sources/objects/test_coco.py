"""COCO as it ships converts to Model Garden's record layout: category ids kept, bad annotations named.

Each test writes a small COCO tree (``tests/object_data.py``: red rectangles on noise, so boxes are
checked by the pixels inside them), converts it in-process and reads the records with TensorFlow.
"""

from __future__ import annotations

import glob
import json

import numpy as np
import pytest

from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import TooManyRejectedError, run
from tests.object_data import jpeg, jpeg_as_stored, object_records, picture, red_fraction, write_coco

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
CATEGORIES = [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}, {"id": 90, "name": "toothbrush"}]


def _convert(src, out, **options) -> dict:
    run(ConvertOptions(src=str(src), out=str(out), shards=1, overwrite=True, **options), FAST, show_progress=False)
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def coco_tree(tmp_path_factory):
    """val2017 with odd category ids, a crowd box, an image without objects, EXIF-turned images in both frames,
    bad annotations of each kind, an orphan annotation and a file no annotation names."""
    root = tmp_path_factory.mktemp("coco")
    files = {
        "000000000001.jpg": jpeg(picture(80, 48, [(10, 5, 30, 20), (50, 30, 70, 44)], seed=1)),
        "000000000002.jpg": jpeg(picture(64, 64, [], seed=2)),
        # Stored turned (EXIF 6): annotated on the stored pixels (COCO's frame, 80x48) ...
        "000000000003.jpg": jpeg_as_stored(picture(80, 48, [(8, 8, 40, 24)], seed=3), 6),
        # ... and annotated upright (CVAT's frame: the JSON's size is the upright 48x80).
        "000000000004.jpg": jpeg(picture(48, 80, [(4, 50, 30, 70)], seed=4), 6),
        "not-listed.jpg": jpeg(picture(32, 32, [], seed=5)),
    }
    images = [{"id": 1, "file_name": "000000000001.jpg", "width": 80, "height": 48},
              {"id": 2, "file_name": "000000000002.jpg", "width": 64, "height": 64},
              {"id": 3, "file_name": "000000000003.jpg", "width": 80, "height": 48},
              {"id": 4, "file_name": "000000000004.jpg", "width": 48, "height": 80},
              {"id": 5, "file_name": "000000000005.jpg", "width": 10, "height": 10}]  # listed, no file
    annotations = [
        {"id": 101, "image_id": 1, "category_id": 18, "bbox": [10, 5, 20, 15], "area": 250.5, "iscrowd": 0},
        {"id": 102, "image_id": 1, "category_id": 90, "bbox": [50, 30, 20, 14], "area": 280.0, "iscrowd": 1},
        {"id": 103, "image_id": 1, "category_id": 18, "bbox": [5, 5, 0, 10], "area": 0, "iscrowd": 0},  # empty
        {"id": 104, "image_id": 1, "category_id": 18, "bbox": [70, 40, 30, 30], "area": 9, "iscrowd": 0},  # outside
        {"id": 105, "image_id": 1, "category_id": 7, "bbox": [1, 1, 5, 5], "area": 25, "iscrowd": 0},  # unknown
        {"id": 106, "image_id": 3, "category_id": 1, "bbox": [8, 8, 32, 16], "area": 512, "iscrowd": 0},
        {"id": 107, "image_id": 4, "category_id": 1, "bbox": [4, 50, 26, 20], "area": 520, "iscrowd": 0},
        {"id": 108, "image_id": 99, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25, "iscrowd": 0},  # orphan
    ]
    write_coco(str(root), "val2017", images, annotations, CATEGORIES, files)
    return root


@pytest.fixture(scope="module")
def converted(coco_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("coco-out") / "ds"
    # The images keep their good objects beside the bad ones (--keep-partial-images): each bad one is named here;
    # by default such an image is rejected whole (tests/beam_jobs/test_unwritable_objects.py).
    manifest = _convert(coco_tree, out, max_bad_fraction=0.5, encode=EncodeOptions(keep_partial_images=True))
    return out, manifest


def test_boxes_classes_and_flags_are_written_as_model_garden_reads_them(converted):
    out, _ = converted
    record = object_records(out)["val2017/000000000001.jpg"]
    assert record["image/source_id"] == [b"1"]
    assert record["image/object/class/label"] == [18, 90]  # COCO's ids, never renumbered
    assert record["image/object/class/text"] == [b"dog", b"toothbrush"]
    assert record["image/object/is_crowd"] == [0, 1]
    assert record["image/object/area"] == pytest.approx([250.5, 280.0])
    assert np.allclose(record["boxes"], [(10 / 80, 5 / 48, 30 / 80, 20 / 48), (50 / 80, 30 / 48, 70 / 80, 44 / 48)])
    for box in record["boxes"]:
        assert red_fraction(record["pixels"], box) > 0.9
    assert "image/class/label" not in record


def test_an_image_without_objects_is_written_with_empty_lists(converted):
    record = object_records(converted[0])["val2017/000000000002.jpg"]
    assert record["boxes"] == [] and record.get("image/object/class/label", []) == []


def test_exif_turned_images_keep_their_boxes_on_their_objects_in_both_frames(converted):
    records = object_records(converted[0])
    for name in ("val2017/000000000003.jpg", "val2017/000000000004.jpg"):
        record = records[name]
        assert record["pixels"].shape[:2] == (80, 48)  # written upright
        assert len(record["boxes"]) == 1 and red_fraction(record["pixels"], record["boxes"][0]) > 0.9, name


def test_every_bad_annotation_is_named_and_its_image_keeps_its_good_objects(converted):
    out, manifest = converted
    lines = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    by_annotation = {line.get("annotation"): line["reason"] for line in lines}
    assert by_annotation == {"instances_val2017.json annotation 103": "box-empty",
                             "instances_val2017.json annotation 104": "box-outside-image",
                             "instances_val2017.json annotation 105": "unknown-class",
                             None: "missing-file"}  # image 5: listed in the JSON, no file
    assert manifest["rejected_objects_by_reason"] == {"box-empty": 1, "box-outside-image": 1, "unknown-class": 1}
    assert manifest["splits"]["validation"]["num_objects"] == 4
    assert manifest["skipped_by_reason"]["not-in-annotations"] == 1  # not-listed.jpg


def test_the_label_map_and_the_manifest_keep_cocos_ids(converted):
    out, manifest = converted
    assert manifest["task"] == "objects"
    assert manifest["classes"][1] == "person" and manifest["classes"][18] == "dog" and manifest["classes"][90] == \
        "toothbrush" and manifest["classes"][2] == ""
    assert manifest["splits"]["validation"]["label_counts"][18] == 1
    text = (out / "label_map.pbtxt").read_text()
    assert text.startswith("item {\n  id: 1\n  name: 'person'\n}\n") and "id: 90\n  name: 'toothbrush'" in text
    assert text.count("item {") == 3


def test_an_annotation_file_given_with_annotations_reads_images_beside_src(coco_tree, tmp_path):
    out = tmp_path / "ds"
    manifest = _convert(coco_tree / "val2017", out, annotations=str(coco_tree / "annotations" / "instances_val2017.json"),
                        max_bad_fraction=0.5, encode=EncodeOptions(keep_partial_images=True))
    assert manifest["task"] == "objects"
    assert "000000000001.jpg" in object_records(out)


def test_too_many_bad_annotations_fail_the_run_and_publish_nothing(coco_tree, tmp_path):
    with pytest.raises(TooManyRejectedError, match="objects"):
        _convert(coco_tree, tmp_path / "ds", max_bad_fraction=0.3, encode=EncodeOptions(keep_partial_images=True))
    assert not (tmp_path / "ds").exists() and (tmp_path / "ds.rejected.jsonl").exists()


@pytest.mark.slow
def test_model_gardens_own_decoder_reads_our_boxes_classes_and_ids(converted):
    """Model Garden's TfExampleDecoder (tf-models-official), the parser its detection input pipelines use."""
    import tensorflow as tf
    from official.vision.dataloaders.tf_example_decoder import TfExampleDecoder

    out, _ = converted
    decoder = TfExampleDecoder(include_mask=False, regenerate_source_id=False)
    ours = object_records(out)
    decoded = 0
    for path in sorted(glob.glob(str(out / "*.tfrecord"))):
        for raw in tf.data.TFRecordDataset(path):
            got = {key: value.numpy() for key, value in decoder.decode(raw).items()}
            record = next(r for r in ours.values() if r["image/source_id"] == [got["source_id"]])
            assert got["image"].shape == record["pixels"].shape
            assert list(got["groundtruth_classes"]) == record.get("image/object/class/label", [])
            # Model Garden's boxes are [ymin, xmin, ymax, xmax]: ours, reordered.
            expected = [(y0, x0, y1, x1) for x0, y0, x1, y1 in record["boxes"]]
            assert np.allclose(got["groundtruth_boxes"].reshape(-1, 4), np.reshape(expected, (-1, 4)))
            assert list(got["groundtruth_is_crowd"]) == [bool(v) for v in record.get("image/object/is_crowd", [])]
            assert np.allclose(got["groundtruth_area"], record.get("image/object/area", []))
            decoded += 1
    assert decoded == 4


def test_masks_are_each_objects_pixels_under_exif_and_max_side_and_model_garden_decodes_them(tmp_path):
    """--masks: polygons and a crowd's RLE as PNG masks; checked by content (the mask covers the red pixels)."""
    import tensorflow as tf
    from official.vision.dataloaders.tf_example_decoder import TfExampleDecoder

    root = tmp_path / "coco"
    rle = {"size": [48, 80], "counts": [48 * 50 + 30, 14, 34, 14, 34, 14] + [48 * 80 - (48 * 50 + 30) - 14 * 3 - 34 * 2]}
    files = {"1.jpg": jpeg(picture(80, 48, [(10, 5, 30, 20), (50, 30, 70, 44)], seed=1)),
             "2.jpg": jpeg_as_stored(picture(80, 48, [(8, 8, 40, 24)], seed=2), 6)}
    images = [{"id": 1, "file_name": "1.jpg", "width": 80, "height": 48},
              {"id": 2, "file_name": "2.jpg", "width": 80, "height": 48}]
    annotations = [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 5, 20, 15], "area": 300, "iscrowd": 0,
         "segmentation": [[10, 5, 30, 5, 30, 20, 10, 20]]},
        {"id": 2, "image_id": 1, "category_id": 18, "bbox": [50, 30, 20, 14], "area": 280, "iscrowd": 1,
         "segmentation": rle},  # column-major runs: x 50..52 (3 columns) of rows 30..43
        {"id": 3, "image_id": 2, "category_id": 1, "bbox": [8, 8, 32, 16], "area": 512, "iscrowd": 0,
         "segmentation": [[8, 8, 40, 8, 40, 24, 8, 24]]},
    ]
    write_coco(str(root), "val2017", images, annotations, CATEGORIES, files)
    out = tmp_path / "ds"
    manifest = _convert(root, out, masks=True, encode=EncodeOptions(max_side=40))
    assert manifest["features"]["image/object/mask"] == "bytes_list"
    decoder = TfExampleDecoder(include_mask=True, regenerate_source_id=False)
    checked = 0
    for path in sorted(glob.glob(str(out / "*.tfrecord"))):
        for raw in tf.data.TFRecordDataset(path):
            got = {key: value.numpy() for key, value in decoder.decode(raw).items()}
            pixels = got["image"]
            # Reddish: edge pixels, blurred into the gray noise by the downsizing, count too.
            red = pixels[..., 0].astype(int) - pixels[..., 1].astype(int) > 40
            for mask, crowd in zip(got["groundtruth_instance_masks"], got["groundtruth_is_crowd"]):
                assert mask.shape == red.shape  # the written image's size (--max-side 40)
                inside = mask > 0
                assert inside.any() and red[inside].mean() > 0.9  # a mask lies on its object's red pixels
                if not crowd:
                    assert red[inside].sum() / max(red.sum(), 1) > 0.3
                checked += 1
    assert checked == 3


@pytest.mark.slow
def test_converting_again_over_the_dataset_gives_the_same_bytes(coco_tree, tmp_path):
    """--overwrite replaces an object dataset (its label_map.pbtxt is its own), byte for byte."""
    out = tmp_path / "ds"
    _convert(coco_tree, out, max_bad_fraction=0.5)
    first = {path.name: path.read_bytes() for path in out.iterdir() if path.name != "manifest.json"}
    _convert(coco_tree, out, max_bad_fraction=0.5)
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.name != "manifest.json"} == first
    assert "label_map.pbtxt" in first


@pytest.mark.slow
def test_an_image_path_that_leaves_src_is_refused_without_being_read(tmp_path):
    """Annotation files come from strangers: a file_name of ../x or /x never reads outside --src."""
    root = tmp_path / "coco"
    (tmp_path / "secret.jpg").write_bytes(jpeg(picture(16, 16, [], seed=9)))  # a real image outside SRC
    images = [{"id": 1, "file_name": "1.jpg", "width": 16, "height": 16},
              {"id": 2, "file_name": "../../secret.jpg", "width": 16, "height": 16},
              {"id": 3, "file_name": str(tmp_path / "secret.jpg"), "width": 16, "height": 16}]
    write_coco(str(root), "val2017", images, [], CATEGORIES, {"1.jpg": jpeg(picture(16, 16, [], seed=1))})
    out = tmp_path / "ds"
    manifest = _convert(root, out, max_bad_fraction=0.9)
    assert manifest["splits"]["validation"]["num_examples"] == 1
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rejected) == ["unsafe-path", "unsafe-path"]
