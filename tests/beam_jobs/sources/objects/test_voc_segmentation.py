"""Semantic segmentation as VOC lays it out without boxes (JPEGImages/, SegmentationClass/, ImageSets/Segmentation)
and as CVAT's Segmentation mask 1.1 exports it (RGB masks, labelmap.txt of colours): class ids by the colour table,
pixel for pixel; an unknown colour rejects its image by name (issue #57 §2)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import record_schema
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from tests.object_data import jpeg, object_records, palette_png, voc_colormap, voc_segmented, write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
LABELMAP = "# label:color_rgb:parts:actions\nbackground:0,0,0::\ncat:250,50,83::\ndog:61,245,61::\n"
COLOURS = {(0, 0, 0): 0, (250, 50, 83): 1, (61, 245, 61): 2}


def _rgb_png(ids: np.ndarray, colours: dict) -> bytes:
    by_id = {class_id: colour for colour, class_id in colours.items()}
    pixels = np.zeros((*ids.shape, 3), np.uint8)
    for class_id, colour in by_id.items():
        pixels[ids == class_id] = colour
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _brute_force_ids(png: bytes, colours: dict) -> np.ndarray:
    """Each pixel's class by its colour, one pixel at a time: the reference."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    ids = np.zeros(rgb.shape[:2], np.uint8)
    for y in range(rgb.shape[0]):
        for x in range(rgb.shape[1]):
            ids[y, x] = colours[tuple(int(v) for v in rgb[y, x])]
    return ids


def _written_ids(record: dict) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(record[record_schema.SEGMENTATION_ENCODED][0])))


def test_cvats_segmentation_masks_map_their_colours_by_labelmap_and_an_unknown_colour_rejects_its_image(tmp_path):
    src = tmp_path / "cvat-export"
    write_file(str(src / "labelmap.txt"), LABELMAP)
    masks = {}
    for seed, image_id in enumerate(("frame_000001", "frame_000002", "frame_000003")):
        pixels, instance, _, _ = voc_segmented(48, 40, [1, 2], seed=seed)
        ids = np.where(instance == 255, 0, np.where(instance == 2, 2, np.minimum(instance, 1))).astype(np.uint8)
        png = _rgb_png(ids, COLOURS)
        if image_id == "frame_000003":  # a colour the labelmap lacks
            rgb = np.asarray(Image.open(io.BytesIO(png))).copy()
            rgb[0:3, 0:4] = (9, 9, 9)
            out = io.BytesIO()
            Image.fromarray(rgb).save(out, format="PNG")
            png = out.getvalue()
        write_file(str(src / f"JPEGImages/{image_id}.jpg"), jpeg(pixels))
        write_file(str(src / f"SegmentationClass/{image_id}.png"), png)
        write_file(str(src / f"SegmentationObject/{image_id}.png"), palette_png(instance))
        masks[image_id] = png
    write_file(str(src / "ImageSets/Segmentation/default.txt"), "frame_000001\nframe_000002\nframe_000003\n")
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(src), out=str(out), shards=1, max_bad_fraction=0.5), FAST, show_progress=False)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    assert manifest["task"] == record_schema.TASK_SEGMENTATION and manifest["classes"] == ["background", "cat", "dog"]
    records = object_records(out)
    assert sorted(records) == ["JPEGImages/frame_000001.jpg", "JPEGImages/frame_000002.jpg"]
    for image_id in ("frame_000001", "frame_000002"):
        assert np.array_equal(_written_ids(records[f"JPEGImages/{image_id}.jpg"]),
                              _brute_force_ids(masks[image_id], COLOURS)), image_id
    [rejected] = [json.loads(line) for line in (out / record_schema.REJECTED_FILE).read_text().splitlines()]
    assert (rejected["path"], rejected["reason"]) == ("JPEGImages/frame_000003.jpg", "bad-mask")
    assert "SegmentationClass/frame_000003.png: colour (9, 9, 9) at 12 pixels is no class of the colour table" \
        in rejected["detail"]
    skipped = [json.loads(line) for line in (out / record_schema.SKIPPED_FILE).read_text().splitlines()]
    assert sorted((s["path"], s["reason"]) for s in skipped) == [
        (f"SegmentationObject/frame_00000{i}.png", "not-in-layout") for i in (1, 2, 3)]


def test_voc_class_masks_without_boxes_read_by_vocs_palette_colours_void_kept(tmp_path):
    root = tmp_path / "VOCdevkit" / "VOC2012"
    masks = {}
    for seed, (image_id, classes) in enumerate({"2007_000032": [1, 15], "2007_000033": [12]}.items()):
        pixels, _, class_ids, _ = voc_segmented(40, 32, classes, seed=seed)
        write_file(str(root / f"JPEGImages/{image_id}.jpg"), jpeg(pixels))
        write_file(str(root / f"SegmentationClass/{image_id}.png"), palette_png(class_ids))
        masks[image_id] = palette_png(class_ids)
    write_file(str(root / "ImageSets/Segmentation/train.txt"), "2007_000032\n")
    write_file(str(root / "ImageSets/Segmentation/val.txt"), "2007_000033\n2007_000099\n")  # 99: no such image
    out = tmp_path / "ds"
    run(ConvertOptions(src=str(tmp_path / "VOCdevkit"), out=str(out), shards=1, max_bad_fraction=0.5), FAST,
        show_progress=False)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    assert manifest["classes"][:2] == ["background", "aeroplane"] and len(manifest["classes"]) == 21
    palette = voc_colormap()
    colours = {tuple(palette[3 * i:3 * i + 3]): i for i in (*range(21), 255)}
    records = object_records(out)
    for image_id, png in masks.items():
        written = _written_ids(records[f"VOC2012/JPEGImages/{image_id}.jpg"])
        assert np.array_equal(written, _brute_force_ids(png, colours))
        assert np.array_equal(written, np.asarray(Image.open(io.BytesIO(png))))  # the palette's own indexes
    [rejected] = [json.loads(line) for line in (out / record_schema.REJECTED_FILE).read_text().splitlines()]
    assert rejected["reason"] == "missing-file" and "val.txt lists 2007_000099" in rejected["detail"]


@pytest.mark.slow
def test_planning_png_images_finds_each_listed_id_as_its_png(tmp_path):
    """4,000 listed ids whose images are PNGs (not VOC's .jpg): each found as its own image, through one id -> path
    index of the root (it sorted every path an image before: quadratic, 1.9 s of CPU for these 4,000; speed is
    the benchmarks' to check, not a timed test's). The plan reads no image or mask, so empty files do."""
    from beam_jobs.sources import plan_inputs

    root = tmp_path / "seg"
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (root / folder).mkdir(parents=True)
    ids = [f"{n:05d}" for n in range(4000)]
    for image_id in ids:
        (root / "JPEGImages" / f"{image_id}.png").write_bytes(b"")
        (root / "SegmentationClass" / f"{image_id}.png").write_bytes(b"")
    (root / "ImageSets/Segmentation/train.txt").write_text("\n".join(ids) + "\n")
    plan = plan_inputs(ConvertOptions(src=str(root)))
    assert sorted(ref.relpath for ref in plan.refs) == [f"JPEGImages/{image_id}.png" for image_id in ids]
