"""The reader on a dataset of objects: boxes stay on their objects through every augmentation, batches pad.

The dataset is a COCO tree converted in-process (``tests/object_data.py``): gray noise with a solid red
rectangle per object and a blue crowd region, so geometry is checked by content: inside every box the
output image is red, and every red pixel is inside a box.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import reader
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from tests.object_data import jpeg, picture, write_coco

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
BLUE = (0, 0, 255)
# (width, height, red boxes as (x0, y0, x1, y1) pixels): boxes at the edges, large and small, and no box.
PICTURES = [
    (160, 120, [(0, 0, 40, 30), (100, 60, 160, 120)]),
    (90, 150, [(10, 20, 80, 60), (30, 100, 60, 140)]),
    (200, 100, [(150, 10, 195, 90)]),
    (120, 120, []),
    (130, 70, [(5, 5, 125, 65)]),
    (100, 180, [(20, 150, 70, 180), (0, 0, 30, 30), (60, 40, 100, 80)]),
    (140, 110, [(40, 30, 100, 80)]),
    (110, 140, [(10, 10, 50, 50), (60, 90, 100, 130)]),
]
CROWD = {0: (60, 10, 90, 40)}  # image index -> a blue crowd region (is_crowd=1)


def _is_red(pixels: np.ndarray) -> np.ndarray:
    pixels = pixels.astype(int)
    return (pixels[..., 0] > 180) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)


def _is_blue(pixels: np.ndarray) -> np.ndarray:
    pixels = pixels.astype(int)
    return (pixels[..., 2] > 180) & (pixels[..., 0] < 90) & (pixels[..., 1] < 90)


@pytest.fixture(scope="module")
def objects_dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("objects-src")
    images, annotations, files = [], [], {}
    for index, (width, height, boxes) in enumerate(PICTURES):
        picture_ = np.asarray(picture(width, height, boxes, seed=index)).copy()
        name = f"{index:012d}.jpg"
        images.append({"id": index + 1, "file_name": name, "width": width, "height": height})
        for number, (x0, y0, x1, y1) in enumerate(boxes):
            annotations.append({"id": 100 * index + number, "image_id": index + 1, "category_id": 1 + number % 2,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
        if index in CROWD:
            x0, y0, x1, y1 = CROWD[index]
            picture_[y0:y1, x0:x1] = BLUE
            annotations.append({"id": 100 * index + 99, "image_id": index + 1, "category_id": 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 1})
        files[name] = jpeg(Image.fromarray(picture_))
    categories = [{"id": 1, "name": "even"}, {"id": 2, "name": "odd"}]
    write_coco(str(root), "train2017", images, annotations, categories, files)
    write_coco(str(root), "val2017", images, annotations, categories, files)
    out = str(tmp_path_factory.mktemp("objects-out") / "ds")
    run(ConvertOptions(src=str(root), out=out, shards=2, seed=0), FAST, show_progress=False)
    return out


def _objects(boxes: np.ndarray, labels: np.ndarray) -> list:
    """The rows of one image's targets that are objects (not -1 padding)."""
    return [tuple(box) for box, label in zip(boxes, labels) if label >= 0]


def _check_boxes_hold_their_objects(image: np.ndarray, boxes: list) -> None:
    """Inside each box (its edge pixels left out: resampling blurs them) the image is red, and no red is outside
    every box (dilated by 2 px)."""
    red = _is_red(image)
    covered = np.zeros(red.shape, bool)
    for ymin, xmin, ymax, xmax in boxes:
        assert 0 <= ymin < ymax <= image.shape[0] and 0 <= xmin < xmax <= image.shape[1], (ymin, xmin, ymax, xmax)
        y0, x0, y1, x1 = int(np.ceil(ymin)) + 1, int(np.ceil(xmin)) + 1, int(np.floor(ymax)) - 1, int(np.floor(xmax)) - 1
        if y1 - y0 >= 2 and x1 - x0 >= 2:
            assert red[y0:y1, x0:x1].mean() > 0.95, (ymin, xmin, ymax, xmax)
        covered[max(int(ymin) - 2, 0):int(np.ceil(ymax)) + 2, max(int(xmin) - 2, 0):int(np.ceil(xmax)) + 2] = True
    assert not (red & ~covered).any(), "red pixels outside every box"


@pytest.mark.slow
def test_under_scale_jitter_crop_and_flip_every_box_holds_its_object_and_every_object_has_its_box(objects_dataset):
    augment = reader.BoxAugmentation(scale_range=(0.5, 2.0), min_visible=0.0)
    dataset = reader.build_dataset(objects_dataset, "train", batch_size=4, image_size=(96, 128), seed=3,
                                   augment=augment, num_epochs=6)
    seen = 0
    for images, targets in dataset:
        assert images.shape == (4, 96, 128, 3) and targets["boxes"].shape[0] == 4
        for image, boxes, labels in zip(images.numpy(), targets["boxes"].numpy(), targets["labels"].numpy()):
            _check_boxes_hold_their_objects(image, _objects(boxes, labels))
            assert not _is_blue(image).any() or all(label in (1, 2) for label in labels if label >= 0)
            seen += 1
    assert seen == 6 * len(PICTURES)


@pytest.mark.parametrize("options", [{"order": "buffer"}, {"cache": "memory"}])
def test_the_buffer_order_and_the_cache_give_boxes_on_their_objects_too(objects_dataset, options):
    dataset = reader.build_dataset(objects_dataset, "train", batch_size=4, image_size=(64, 80), seed=2,
                                   options=options)
    for images, targets in dataset.take(2):
        for image, boxes, labels in zip(images.numpy(), targets["boxes"].numpy(), targets["labels"].numpy()):
            _check_boxes_hold_their_objects(image, _objects(boxes, labels))


@pytest.mark.slow
def test_a_box_mostly_cropped_away_is_dropped_and_the_rest_are_clipped(objects_dataset):
    strict = reader.BoxAugmentation(scale_range=(1.5, 2.0), min_visible=0.6)
    loose = reader.BoxAugmentation(scale_range=(1.5, 2.0), min_visible=0.0)
    kept = {}
    for name, augment in (("strict", strict), ("loose", loose)):
        dataset = reader.build_dataset(objects_dataset, "train", batch_size=8, image_size=64, seed=5, augment=augment,
                                       num_epochs=2)
        kept[name] = sum(int((targets["labels"] >= 0).numpy().sum()) for _, targets in dataset)
        for _, targets in dataset.take(1):
            boxes = targets["boxes"].numpy()[targets["labels"].numpy() >= 0]
            assert (boxes >= 0).all() and (boxes <= 64).all()
    assert kept["strict"] < kept["loose"]


@pytest.mark.slow
def test_evaluation_resizes_with_padding_keeping_the_aspect_and_maps_boxes_back_to_the_source(objects_dataset):
    from official.vision.dataloaders.tf_example_decoder import TfExampleDecoder

    targets = reader.ObjectTargets(source_size=True)
    dataset = reader.build_dataset(objects_dataset, "validation", batch_size=3, image_size=(100, 100),
                                   training=False, targets=targets)
    info = reader.dataset_info(objects_dataset)
    records = tf.data.TFRecordDataset(info.split("validation").files)
    decoder = TfExampleDecoder(include_mask=False, regenerate_source_id=False)
    expected = [decoder.decode(raw) for raw in records]  # Model Garden's own reading of the same records
    got = [(image, boxes, labels, size) for images, t in dataset
           for image, boxes, labels, size in zip(images.numpy(), t["boxes"].numpy(), t["labels"].numpy(),
                                                 t["source_size"].numpy())]
    assert len(got) == len(expected) == len(PICTURES)
    for (image, boxes, labels, size), decoded in zip(got, expected):
        height, width = decoded["height"].numpy(), decoded["width"].numpy()
        assert list(size) == [height, width]
        scale = min(100 / height, 100 / width)
        content_h, content_w = round(height * scale), round(width * scale)
        assert not image[content_h:].any() and not image[:, content_w:].any(), "padding is at the bottom and right"
        _check_boxes_hold_their_objects(image, _objects(boxes, labels))
        crowd = decoded["groundtruth_is_crowd"].numpy()
        mg_boxes = decoded["groundtruth_boxes"].numpy()[~crowd] * [height, width, height, width]
        back = reader.boxes_to_source(boxes[labels >= 0][None], size[None], 100).numpy()[0]
        np.testing.assert_allclose(back, mg_boxes, atol=1e-3)
        assert list(labels[labels >= 0]) == list(decoded["groundtruth_classes"].numpy()[~crowd])


@pytest.mark.parametrize("box_format", ["yxyx", "xyxy", "xywh", "center_xywh", "center_yxhw", "rel_yxyx",
                                        "rel_xyxy", "rel_xywh", "rel_center_xywh"])
def test_boxes_to_source_returns_boxes_in_the_format_they_came_in_or_the_one_asked(box_format):
    """#57 §4: boxes given as xyxy come back as xyxy (they came back yxyx), relative ones relative to the
    stored image; output_format= asks for another."""
    from reader.boxes import to_format

    source = np.array([[300.0, 400.0], [90.0, 60.0]], np.float32)  # two stored images, height and width
    on_source = np.array([[[30.0, 40.0, 150.0, 200.0]], [[9.0, 6.0, 45.0, 30.0]]], np.float32)  # yxyx pixels
    scale = np.array([min(128 / 300, 128 / 400), min(128 / 90, 128 / 60)], np.float32)
    scaled = np.maximum(np.round(source * scale[:, None]), 1.0)
    on_output = on_source / np.tile(source / scaled, 2)[:, None, :]  # where the pipeline put them
    given = to_format(tf.constant(on_output), box_format, (128, 128))
    back = reader.boxes_to_source(given, source, 128, box_format).numpy()
    relative = box_format.startswith("rel_")
    expected = [to_format(tf.constant(on_source[i] / (np.tile(source[i], 2) if relative else 1)),
                          box_format[4:] if relative else box_format, (1, 1)).numpy() for i in range(2)]
    np.testing.assert_allclose(back, np.stack(expected), rtol=1e-5, atol=1e-4)
    as_yxyx = reader.boxes_to_source(given, source, 128, box_format, output_format="yxyx").numpy()
    np.testing.assert_allclose(as_yxyx, on_source, rtol=1e-5, atol=1e-3)


@pytest.mark.slow
def test_rows_past_an_images_objects_are_minus_one_and_max_objects_fixes_the_shape(objects_dataset):
    dataset = reader.build_dataset(objects_dataset, "validation", batch_size=4, image_size=64, training=False)
    batches = [targets for _, targets in dataset]
    counts = [(targets["labels"].numpy() >= 0).sum(axis=1) for targets in batches]
    for targets, count in zip(batches, counts):
        assert targets["boxes"].shape == (4, max(count), 4), "N is the batch's largest count"
        for boxes, labels, n in zip(targets["boxes"].numpy(), targets["labels"].numpy(), count):
            assert (labels[n:] == -1).all() and (boxes[n:] == -1).all() and (labels[:n] >= 0).all()
    assert sorted(np.concatenate(counts)) == sorted(len(boxes) for _, _, boxes in PICTURES)  # the background: 0
    fixed = reader.build_dataset(objects_dataset, "validation", batch_size=4, image_size=64, training=False,
                                 targets=reader.ObjectTargets(max_objects=2))
    for _, targets in fixed:
        assert targets["boxes"].shape == (4, 2, 4) and targets["labels"].shape == (4, 2)
    train = reader.build_dataset(objects_dataset, "train", batch_size=4, image_size=64, seed=0,
                                 targets={"max_objects": 5})
    assert train.element_spec[1]["boxes"].shape.as_list() == [4, 5, 4]


def test_contiguous_ids_number_the_named_classes_from_0_for_kerashub(objects_dataset):
    """The records keep id 0 for the background (COCO's 1 and 2 here); KerasHub wants classes in [0, num_classes)."""
    info = reader.dataset_info(objects_dataset)
    assert info.classes == ("", "even", "odd") and info.object_classes == ("even", "odd")

    def labels(**targets):
        dataset = reader.build_dataset(objects_dataset, "validation", batch_size=8, image_size=64, training=False,
                                       targets=reader.ObjectTargets(**targets))
        return next(iter(dataset))[1]["labels"].numpy()

    ids, contiguous = labels(), labels(contiguous_ids=True)
    assert set(ids[ids >= 0]) == {1, 2}
    np.testing.assert_array_equal(contiguous, np.where(ids >= 0, ids - 1, -1))


def test_crowd_regions_are_out_of_the_targets_unless_kept(objects_dataset):
    def all_boxes(**targets):
        dataset = reader.build_dataset(objects_dataset, "validation", batch_size=8, image_size=(120, 160),
                                       training=False, targets=reader.ObjectTargets(**targets))
        _, found = next(iter(dataset))
        return found["boxes"].numpy()[found["labels"].numpy() >= 0]

    crowd = np.array([10, 60, 40, 90])  # picture 0 (160x120, drawn at scale 1), yxyx
    default, kept = all_boxes(), all_boxes(keep_crowd=True)
    assert len(kept) == len(default) + 1
    assert not np.isclose(default, crowd, atol=1e-3).all(axis=1).any()
    assert np.isclose(kept, crowd, atol=1e-3).all(axis=1).any()


def test_box_formats_are_kerashubs(objects_dataset):
    """Each format's boxes, converted back to yxyx by Keras' own converter, are the yxyx boxes."""
    from keras.utils import bounding_boxes

    yxyx = tf.constant([[10.0, 20.0, 50.0, 100.0], [0.0, 0.0, 80.0, 120.0], [30.5, 7.25, 31.5, 9.0]])
    for fmt in reader.options.BOX_FORMATS:
        ours = reader.boxes.to_format(yxyx, fmt, (80, 120))
        back = bounding_boxes.convert_format(ours.numpy(), source=fmt, target="yxyx", height=80, width=120)
        np.testing.assert_allclose(np.asarray(back), yxyx.numpy(), atol=1e-4, err_msg=fmt)
        np.testing.assert_allclose(reader.boxes.from_format(ours, fmt, (80, 120)), yxyx.numpy(), atol=1e-4)
    # and through the pipeline: a relative format is relative to the output image
    targets = reader.ObjectTargets("rel_xyxy")
    dataset = reader.build_dataset(objects_dataset, "validation", batch_size=8, image_size=(80, 120), training=False,
                                   targets=targets)
    found = next(iter(dataset))[1]
    boxes = found["boxes"].numpy()[found["labels"].numpy() >= 0]
    assert (boxes >= 0).all() and (boxes <= 1).all() and (boxes[:, 2] > boxes[:, 0]).all()


@pytest.mark.slow
def test_training_resumes_exactly_from_a_step_and_gives_the_same_global_batches_on_2_and_4_pipelines(objects_dataset):
    def examples(start, count, pipelines=1):
        """Per global batch, each image with its objects (padding stripped: N is each pipeline's own)."""
        parts = []
        for index in range(pipelines):
            context = None if pipelines == 1 else tf.distribute.InputContext(pipelines, index, pipelines)
            dataset = reader.build_dataset(objects_dataset, "train", batch_size=4, image_size=48, seed=11,
                                           start=start, input_context=context)
            parts.append([[(image, _objects(boxes, labels), [label for label in labels if label >= 0])
                           for image, boxes, labels in zip(images.numpy(), t["boxes"].numpy(), t["labels"].numpy())]
                          for images, t in dataset.take(count)])
        return [sum((part[step] for part in parts), []) for step in range(count)]

    def same(a, b):
        if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
            return False
        return all(np.array_equal(x[0], y[0]) and x[1:] == y[1:] for batch_a, batch_b in zip(a, b)
                   for x, y in zip(batch_a, batch_b))

    whole = examples(0, 6)
    assert same(examples(3, 3), whole[3:]), "resumed at step 3"
    assert same(examples(0, 6, pipelines=2), whole), "two input pipelines"
    assert same(examples(2, 4, pipelines=4), whole[2:]), "four input pipelines, resumed at step 2"


def test_targets_and_augment_name_the_task_they_do_not_fit(objects_dataset, demo_dataset):
    with pytest.raises(ValueError, match="targets=.*task 'classification'"):
        reader.build_dataset(demo_dataset, "train", targets=reader.ObjectTargets(max_objects=3))
    with pytest.raises(ValueError, match="reader.BoxAugmentation"):
        reader.build_dataset(objects_dataset, "train", augment=reader.Augmentation())
    with pytest.raises(ValueError, match="bounding_box_format must be one of"):
        reader.ObjectTargets(bounding_box_format="ltrb")


@pytest.mark.slow
def test_the_example_fits_kerashubs_retinanet_on_the_pipeline_and_scores_it_with_cocoeval(objects_dataset, tmp_path):
    """examples/train_detector.py, in this process: KerasHub's RetinaNet (random init) fits on the training
    batches, then its detections, mapped back to the stored images, are scored by pycocotools' COCOeval."""
    import importlib.util
    import os

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("train_detector", os.path.join(REPO, "examples", "train_detector.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    metrics = tmp_path / "metrics.json"
    assert example.main(["--data", objects_dataset, "--epochs", "2", "--batch-size", "4", "--image-size", "64",
                         "--metrics-json", str(metrics)]) == 0
    found = json.loads(metrics.read_text())
    assert np.isfinite(found["loss"]) and found["images"] == len(PICTURES)
    assert found["objects"] == sum(len(boxes) for _, _, boxes in PICTURES)  # crowd regions left out
    assert 0 <= found["AP"] <= 1 and 0 <= found["AR100"] <= 1


@pytest.fixture(scope="module")
def triangles_dataset(tmp_path_factory) -> str:
    """COCO with --masks: red right triangles (one corner each way) whose polygons are their segmentations."""
    from PIL import ImageDraw

    root = tmp_path_factory.mktemp("triangles-src")
    images, annotations, files = [], [], {}
    corners = [(120, 90, [(10, 10, 70, 70)]), (100, 140, [(20, 30, 90, 120), (5, 5, 40, 40)]),
               (150, 100, [(60, 20, 140, 90)]), (90, 90, [(0, 0, 60, 60)])]
    for index, (width, height, boxes) in enumerate(corners):
        image = picture(width, height, [], seed=index)
        draw = ImageDraw.Draw(image)
        for number, (x0, y0, x1, y1) in enumerate(boxes):
            # lower-left half of the box, or upper-right for odd objects: a flip or a shift shows in the mask
            polygon = [(x0, y0), (x0, y1), (x1, y1)] if number % 2 == 0 else [(x0, y0), (x1, y0), (x1, y1)]
            draw.polygon(polygon, fill=(255, 0, 0))
            annotations.append({"id": 100 * index + number, "image_id": index + 1, "category_id": 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0) / 2, "iscrowd": 0,
                                "segmentation": [[float(v) for point in polygon for v in point]]})
        images.append({"id": index + 1, "file_name": f"{index}.jpg", "width": width, "height": height})
        files[f"{index}.jpg"] = jpeg(image)
    write_coco(str(root), "train2017", images, annotations, [{"id": 1, "name": "triangle"}], files)
    out = str(tmp_path_factory.mktemp("triangles-out") / "ds")
    run(ConvertOptions(src=str(root), out=out, shards=1, masks=True), FAST, show_progress=False)
    return out


@pytest.mark.slow
def test_instance_masks_are_cropped_to_their_boxes_and_flipped_with_the_pixels(triangles_dataset):
    """Each object's M x M mask is the red of the output image inside its box, resampled to M x M."""
    augment = reader.BoxAugmentation(scale_range=(0.7, 1.5), min_visible=0.5)
    dataset = reader.build_dataset(triangles_dataset, "train", batch_size=2, image_size=(96, 112), seed=2,
                                   augment=augment, num_epochs=4, targets=reader.ObjectTargets(mask_size=16))
    agreement = []
    for images, targets in dataset:
        assert targets["masks"].shape[2:] == (16, 16) and targets["masks"].shape[1] == targets["boxes"].shape[1]
        red = _is_red(images.numpy()).astype(np.float32)[..., None]
        for row in range(2):
            for box, label, mask in zip(targets["boxes"].numpy()[row], targets["labels"].numpy()[row],
                                        targets["masks"].numpy()[row]):
                if label < 0:
                    assert not mask.any()
                    continue
                if min(box[2] - box[0], box[3] - box[1]) < 12:
                    continue
                normalized = box / [96, 112, 96, 112]
                seen = tf.image.crop_and_resize(red[row:row + 1], [normalized], [0], [16, 16])[0, ..., 0].numpy()
                # a mirrored or shifted triangle agrees on about half the cells; edges blur on small boxes
                agreement.append(((seen > 0.5) == (mask > 0.5)).mean())
                assert agreement[-1] > 0.75, (box, mask.round(1), seen.round(1))
    assert len(agreement) >= 10 and np.mean(agreement) > 0.9
    fixed = reader.build_dataset(triangles_dataset, "train", batch_size=2, image_size=64, training=False,
                                 targets=reader.ObjectTargets(mask_size=8, max_objects=3))
    assert fixed.element_spec[1]["masks"].shape.as_list() == [None, 3, 8, 8]


@pytest.mark.slow
def test_a_class_mask_beside_boxes_moves_with_them_and_difficult_objects_are_out_unless_kept(tmp_path, objects_dataset):
    from tests.object_data import voc_palette_png, voc_xml, write_file

    root = tmp_path / "VOC2012"
    for name, (width, height, box) in {"a": (120, 80, (20, 10, 80, 60)), "b": (90, 130, (10, 40, 70, 120))}.items():
        write_file(str(root / f"JPEGImages/{name}.jpg"), jpeg(picture(width, height, [box], seed=len(name))))
        x0, y0, x1, y1 = box
        write_file(str(root / f"Annotations/{name}.xml"),
                   voc_xml(width, height, [("dog", (x0 + 1, y0 + 1, x1, y1), 0), ("cat", (1, 1, 10, 10), 1)]))
        write_file(str(root / f"SegmentationClass/{name}.png"), voc_palette_png(width, height, [(box, 12)]))
    write_file(str(root / "ImageSets/Segmentation/train.txt"), "a\nb\n")
    out = str(tmp_path / "ds")
    run(ConvertOptions(src=str(root), out=out, shards=1, masks=True), FAST, show_progress=False)
    augment = reader.BoxAugmentation(scale_range=(0.6, 1.6))
    dataset = reader.build_dataset(out, "train", batch_size=2, image_size=64, seed=1, augment=augment, num_epochs=4,
                                   targets=reader.ObjectTargets(class_mask=True))
    for images, targets in dataset:
        assert targets["class_mask"].shape == (2, 64, 64, 1)
        for image, mask, labels in zip(images.numpy(), targets["class_mask"].numpy(), targets["labels"].numpy()):
            red, dog = _is_red(image), mask[..., 0] == 12
            if dog.sum() > 30:
                assert red[dog].mean() > 0.85
            assert set(labels[labels >= 0]) <= {12}  # the OD API's VOC ids: dog 12; the difficult cat (8) is out
    difficult = reader.build_dataset(out, "train", batch_size=2, image_size=64, training=False)
    kept = reader.build_dataset(out, "train", batch_size=2, image_size=64, training=False,
                                targets={"keep_difficult": True})
    count = {name: int((next(iter(d))[1]["labels"] >= 0).numpy().sum()) for name, d in (("out", difficult),
                                                                                         ("kept", kept))}
    assert count == {"out": 2, "kept": 4}
    with pytest.raises(ValueError, match="convert COCO with --masks"):
        reader.build_dataset(objects_dataset, "train", targets=reader.ObjectTargets(mask_size=28))


@pytest.mark.slow
def test_the_detection_profile_takes_away_one_stage_at_a_time_and_leaves_the_reader_as_it_was(objects_dataset):
    """``bench.read_objects --stages``: the variants that patch the reader's internals yield batches of the
    pipeline's shapes, and what they patch is back afterwards (a later pipeline decodes and carries boxes)."""
    from bench.read_objects import STAGES, stage_variants

    variants = stage_variants(objects_dataset, 4, 64)
    assert tuple(variants) == STAGES
    for name in ("resized_to_output", "zero_image_no_objects", "padded_batch"):  # the ways the reader is patched
        images, _ = next(iter(variants[name]()))
        assert images.shape == (4, 64, 64, 3), name
    images, targets = next(iter(reader.build_dataset(objects_dataset, "train", batch_size=4, image_size=64, seed=0)))
    assert images.numpy().any() and (targets["labels"].numpy() >= 0).any()
