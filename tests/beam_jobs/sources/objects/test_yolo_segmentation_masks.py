"""Ultralytics' segmentation labels (``class x1 y1 x2 y2 ...``, normalized polygons; ``task: segment`` in
data.yaml) written as instance masks with ``--masks``, as COCO's polygons are (issue #57 §2).

The dataset is generated in Ultralytics' layout, one image stored turned under an EXIF orientation (its labels are
in the upright frame, as Ultralytics reads images). Sizes are powers of two and the polygons' corners whole
pixels, so each label's text is exact and a polygon whose edges run along the pixel grid covers exactly the
pixels whose centres lie inside it: the brute-force reference below (an even-odd crossing test per pixel centre)
must then agree with every mask pixel for pixel. A slanted edge is drawn as pycocotools draws COCO's polygons
(what Model Garden's create_coco_tf_record.py runs): compared with pycocotools on the same pixel polygon.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.pipeline import run
from beam_jobs.planning.discover import InputError
from beam_jobs.sources import plan_inputs
from tests.object_data import jpeg, object_records, picture, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]

# image -> (upright width, height, EXIF orientation, [(class, polygon in pixels of the upright image)]).
IMAGES = {
    "images/train/a.jpg": (64, 32, 1, [(0, [(4, 4), (28, 4), (28, 12), (12, 12), (12, 28), (4, 28)]),  # an L
                                       (1, [(40, 8), (60, 8), (60, 24), (40, 24)]),
                                       (0, [(32, 2), (62, 30), (32, 30)])]),  # slanted: as pycocotools draws it
    "images/train/b.jpg": (32, 64, 6, [(1, [(2, 40), (30, 40), (30, 62), (2, 62)]),  # stored turned (EXIF 6)
                                       (0, [(8, 2), (24, 2), (24, 10), (16, 10), (16, 30), (8, 30)])]),
    "images/val/c.jpg": (64, 64, 1, [(1, [(0, 0), (64, 0), (64, 16), (0, 16)])]),  # to the image's edges
}


def _line(label: int, polygon, width: int, height: int) -> str:
    return " ".join([str(label)] + [f"{x / width:.6f} {y / height:.6f}" for x, y in polygon])


def _segmentation_export(root) -> None:
    write_file(str(root / "data.yaml"), "task: segment\ntrain: images/train\nval: images/val\n"
                                        "names:\n  0: pipe\n  1: valve\n")
    for path, (width, height, orientation, objects) in IMAGES.items():
        write_file(str(root / path), jpeg(picture(width, height, [], seed=width + height), orientation))
        label = path.replace("images/", "labels/", 1).rsplit(".", 1)[0] + ".txt"
        write_file(str(root / label), "".join(_line(c, p, width, height) + "\n" for c, p in objects))


def _brute_force(polygon, width: int, height: int) -> np.ndarray:
    """1 where a pixel's centre lies inside ``polygon`` (even-odd rule, one crossing test per pixel and edge)."""
    mask = np.zeros((height, width), np.uint8)
    edges = list(zip(polygon, polygon[1:] + polygon[:1]))
    for row in range(height):
        for column in range(width):
            x, y, inside = column + 0.5, row + 0.5, False
            for (x0, y0), (x1, y1) in edges:
                if (y0 > y) != (y1 > y) and x < x0 + (y - y0) * (x1 - x0) / (y1 - y0):
                    inside = not inside
            mask[row, column] = inside
    return mask


def _as_coco_draws_it(polygon, width: int, height: int) -> np.ndarray:
    from pycocotools import mask as coco_mask

    flat = [float(v) for point in polygon for v in point]
    return coco_mask.decode(coco_mask.frPyObjects([flat], height, width))[..., 0]


def _rectilinear(polygon) -> bool:
    return all(a[0] == b[0] or a[1] == b[1] for a, b in zip(polygon, polygon[1:] + polygon[:1]))


def test_yolo_polygons_are_written_as_instance_masks_pixel_for_pixel_and_upright(tmp_path):
    pytest.importorskip("pycocotools")
    root, out = tmp_path / "pipes", tmp_path / "ds"
    _segmentation_export(root)
    run(ConvertOptions(src=str(root), out=str(out), shards=1, masks=True), FAST, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["features"]["image/object/mask"] == "bytes_list" and manifest["num_rejected"] == 0
    records = object_records(out)
    assert sorted(records) == sorted(IMAGES)
    for path, (width, height, _, objects) in IMAGES.items():
        record = records[path]
        assert record["pixels"].shape[:2] == (height, width)  # stored upright
        assert record["image/object/class/label"] == [label + 1 for label, _ in objects]  # ids one higher
        assert len(record["image/object/mask"]) == len(objects)
        for data, (_, polygon) in zip(record["image/object/mask"], objects):
            mask = np.asarray(Image.open(io.BytesIO(data)))
            assert mask.shape == (height, width) and set(np.unique(mask)) <= {0, 1}
            reference = _brute_force(polygon, width, height)
            if _rectilinear(polygon):
                np.testing.assert_array_equal(mask, reference, err_msg=f"{path} {polygon}")
            else:  # a slanted edge: COCO's rasterization exactly; inside it, the reference everywhere
                np.testing.assert_array_equal(mask, _as_coco_draws_it(polygon, width, height))
                assert (mask != reference).sum() <= sum(abs(b[1] - a[1]) + 1
                                                        for a, b in zip(polygon, polygon[1:] + polygon[:1]))


def test_a_box_line_under_masks_rejects_its_image_naming_it_and_a_dataset_of_boxes_is_refused(tmp_path):
    pytest.importorskip("pycocotools")
    root = tmp_path / "pipes"
    _segmentation_export(root)
    write_file(str(root / "images/train/d.jpg"), jpeg(picture(32, 32, [], seed=3)))
    write_file(str(root / "labels/train/d.txt"), "1 0.5 0.5 0.25 0.25\n")  # a box: no polygon, no mask
    plan = plan_inputs(ConvertOptions(src=str(root), out=str(tmp_path / "ds"), masks=True))
    from beam_jobs import annotations

    objects = {ref.relpath: annotations.decode(ref.annotation) for ref in plan.refs}
    assert objects["images/train/d.jpg"].rejected == (
        ("labels/train/d.txt line 1", annotations.BAD_MASK, "--masks: a box line ('class cx cy w h') has no polygon "
         "to draw its mask from ('class x1 y1 x2 y2 ...')"),)
    assert objects["images/train/a.jpg"].boxes[0].mask == json.dumps([[4 / 64, 4 / 32, 28 / 64, 4 / 32, 28 / 64,
                                                                       12 / 32, 12 / 64, 12 / 32, 12 / 64, 28 / 32,
                                                                       4 / 64, 28 / 32]])

    boxes_only = tmp_path / "boxes"
    write_file(str(boxes_only / "data.yaml"), "train: images/train\nnames: [pipe]\n")
    write_file(str(boxes_only / "images/train/a.jpg"), jpeg(picture(32, 32, [])))
    write_file(str(boxes_only / "labels/train/a.txt"), "0 0.5 0.5 0.25 0.25\n")
    with pytest.raises(InputError, match=r"--masks writes the instance masks of polygon lines .* no label file of "
                                         r".*data.yaml's splits holds one: leave --masks out"):
        plan_inputs(ConvertOptions(src=str(boxes_only), out=str(tmp_path / "ds"), masks=True))
    assert len(list(plan_inputs(ConvertOptions(src=str(boxes_only), out=str(tmp_path / "ds"))).refs)) == 1


def test_masks_follow_max_side_as_the_image_is_resized(tmp_path):
    """--max-side halves the L-shaped image: its mask is the full-size mask resized with nearest-neighbour."""
    pytest.importorskip("pycocotools")
    root, out = tmp_path / "pipes", tmp_path / "ds"
    _segmentation_export(root)
    run(ConvertOptions(src=str(root), out=str(out), shards=1, masks=True, encode=EncodeOptions(max_side=32)), FAST,
        show_progress=False)
    record = object_records(out)["images/train/a.jpg"]
    mask = np.asarray(Image.open(io.BytesIO(record["image/object/mask"][0])))
    full = Image.fromarray(_brute_force(IMAGES["images/train/a.jpg"][3][0][1], 64, 32))
    np.testing.assert_array_equal(mask, np.asarray(full.resize((32, 16), Image.Resampling.NEAREST)))
