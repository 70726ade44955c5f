"""Generated object datasets: noise images with one solid red rectangle per object, as COCO and YOLO ship them.

A box's content is known (red inside, noise outside), so a test checks geometry by what the written
image holds inside each written box, not only by numbers.
"""

from __future__ import annotations

import glob
import io
import json
import os
from typing import Optional, Sequence

import numpy as np
from PIL import Image

RED = (255, 0, 0)

# PIL's transpose that *undoes* each EXIF orientation (what exif_transpose applies), and its inverse,
# which turns an upright picture into the pixels a camera stores with that orientation tag.
_UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
            5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
            8: Image.Transpose.ROTATE_90}
_STORED = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
           5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
           8: Image.Transpose.ROTATE_270}


def picture(width: int, height: int, boxes: Sequence[tuple[int, int, int, int]], seed: int = 0) -> Image.Image:
    """Gray noise (no red) with each ``(x0, y0, x1, y1)`` pixel box filled red."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(60, 160, size=(height, width, 3), dtype=np.uint8)
    pixels[..., 0] = pixels[..., 1]  # gray: far from red everywhere
    for x0, y0, x1, y1 in boxes:
        pixels[y0:y1, x0:x1] = RED
    return Image.fromarray(pixels)


def jpeg(img: Image.Image, orientation: int = 1) -> bytes:
    """``img`` as a JPEG; with an orientation, the pixels stored turned so that the tag shows ``img`` upright."""
    out = io.BytesIO()
    if orientation == 1:
        img.save(out, format="JPEG", quality=95)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        img.transpose(_STORED[orientation]).save(out, format="JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def jpeg_as_stored(img: Image.Image, orientation: int) -> bytes:
    """``img``'s pixels stored as they are, tagged with ``orientation`` (a viewer shows them turned)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def red_fraction(pixels: np.ndarray, box: Sequence[float]) -> float:
    """The fraction of red pixels inside a normalized ``(xmin, ymin, xmax, ymax)`` box of an HxWx3 image.

    Its edge pixels are left out: resampling and JPEG blur them into the noise around.
    """
    height, width = pixels.shape[:2]
    x0, y0, x1, y1 = (int(round(v * s)) for v, s in zip(box, (width, height, width, height)))
    inner = pixels[y0 + 1:y1 - 1, x0 + 1:x1 - 1].astype(int)
    red = (inner[..., 0] > 180) & (inner[..., 1] < 90) & (inner[..., 2] < 90)
    return float(red.mean()) if red.size else 0.0


def write_coco(root: str, split_name: str, images: Sequence[dict], annotations: Sequence[dict],
               categories: Sequence[dict], files: Optional[dict[str, bytes]] = None) -> str:
    """``root/annotations/instances_<split_name>.json`` and ``root/<split_name>/<file>`` for each of ``files``."""
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    os.makedirs(os.path.join(root, split_name), exist_ok=True)
    path = os.path.join(root, "annotations", f"instances_{split_name}.json")
    with open(path, "w") as handle:
        json.dump({"info": {}, "images": list(images), "annotations": list(annotations),
                   "categories": list(categories)}, handle)
    for name, data in (files or {}).items():
        with open(os.path.join(root, split_name, name), "wb") as handle:
            handle.write(data)
    return path


def write_file(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as handle:
        handle.write(data)


def object_records(out) -> dict[str, dict]:
    """Every record of the dataset by file name: its image as pixels and its per-object lists."""
    import tensorflow as tf

    rows = {}
    for path in sorted(glob.glob(str(out / "*.tfrecord"))):
        for raw in tf.data.TFRecordDataset(path):
            feature = tf.train.Example.FromString(raw.numpy()).features.feature
            values = {key: (list(f.float_list.value) or list(f.int64_list.value) or list(f.bytes_list.value))
                      for key, f in feature.items()}
            values["pixels"] = np.asarray(Image.open(io.BytesIO(values["image/encoded"][0])).convert("RGB"))
            values["boxes"] = list(zip(*(values.get(f"image/object/bbox/{k}", []) for k in ("xmin", "ymin", "xmax",
                                                                                            "ymax"))))
            rows[values["image/filename"][0].decode()] = values
    return rows


def voc_xml(width, height, objects) -> str:
    """A VOC annotation XML of ``(name, (xmin, ymin, xmax, ymax) as VOC writes them, difficult)`` objects."""
    parts = [f"<annotation><filename>x.jpg</filename><size><width>{width}</width><height>{height}</height>"
             "<depth>3</depth></size>"]
    for name, (x0, y0, x1, y1), difficult in objects:
        parts.append(f"<object><name>{name}</name><pose>Left</pose><truncated>0</truncated>"
                     f"<difficult>{difficult}</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
                     f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>")
    return "".join(parts) + "</annotation>"


def voc_palette_png(width, height, regions) -> bytes:
    """VOC's SegmentationClass PNG: a palette image whose index is the class (255 for the void outline)."""
    ids = np.zeros((height, width), np.uint8)
    for (x0, y0, x1, y1), class_id in regions:
        ids[y0:y1, x0:x1] = 255
        ids[y0 + 1:y1 - 1, x0 + 1:x1 - 1] = class_id
    image = Image.fromarray(ids, mode="P")
    image.putpalette([v for i in range(256) for v in (i, 255 - i, (i * 7) % 256)])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def class_mask_png(width: int, height: int, box: Sequence[int], class_id: int) -> bytes:
    """A grayscale PNG of class ids: ``class_id`` inside the ``(x0, y0, x1, y1)`` pixel box, 0 elsewhere."""
    ids = np.zeros((height, width), np.uint8)
    x0, y0, x1, y1 = box
    ids[y0:y1, x0:x1] = class_id
    out = io.BytesIO()
    Image.fromarray(ids, mode="L").save(out, format="PNG")
    return out.getvalue()



def voc_colormap() -> list[int]:
    """VOC's palette (the devkit's ``labelcolormap``: index i's bits spread over R, G, B from the high bit down),
    flat, 256 colours: 1 is (128, 0, 0), 255 the void outline (224, 224, 192)."""
    palette = []
    for index in range(256):
        red = green = blue = 0
        value = index
        for shift in range(7, -1, -1):
            red |= (value & 1) << shift
            green |= ((value >> 1) & 1) << shift
            blue |= ((value >> 2) & 1) << shift
            value >>= 3
        palette += [red, green, blue]
    return palette


def palette_png(ids: np.ndarray) -> bytes:
    """A palette PNG of ``ids`` (uint8 indexes) in VOC's colours, as SegmentationClass/ and SegmentationObject/ ship."""
    image = Image.fromarray(ids.astype(np.uint8), mode="P")
    image.putpalette(voc_colormap())
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def voc_segmented(width: int, height: int, classes: Sequence[int], seed: int):
    """A segmented VOC image of one object per entry of ``classes`` (each a VOC class id), drawn as seeded ellipses
    and polygons, later ones in front, each outlined by a 1-pixel void band (255) as VOC's are.

    Returns ``(picture, instance ids, class ids, boxes)``: uint8 arrays of the two PNGs' indexes (instance k is the
    k-th object), and each object's box as VOC's XML writes it (1-based, inclusive) around its visible pixels."""
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for k in range(1, len(classes) + 1):
        x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        x1, y1 = int(rng.integers(x0 + 8, width)), int(rng.integers(y0 + 8, height))
        if k % 2:
            draw.ellipse((x0, y0, x1, y1), fill=k)
        else:
            draw.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1), (x0 + 2, (y0 + y1) // 2)], fill=k)
    instance = np.asarray(canvas).copy()
    # The void band: an object pixel beside a pixel of another value (another object, the background).
    padded = np.pad(instance, 1, mode="edge")
    edge = np.zeros_like(instance, dtype=bool)
    for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
        edge |= padded[dy:dy + height, dx:dx + width] != instance
    instance[edge & (instance > 0)] = 255
    lookup = np.array([0, *classes] + [0] * (254 - len(classes)) + [255], np.uint8)
    class_ids = lookup[instance]
    colours = rng.integers(0, 256, size=(len(classes) + 1, 3), dtype=np.uint8)
    pixels = rng.integers(60, 160, size=(height, width, 3), dtype=np.uint8)
    for k in range(1, len(classes) + 1):
        pixels[instance == k] = colours[k]
    boxes = []
    for k in range(1, len(classes) + 1):
        ys, xs = np.nonzero(instance == k)
        boxes.append((int(xs.min()) + 1, int(ys.min()) + 1, int(xs.max()) + 1, int(ys.max()) + 1) if len(xs) else
                     (1, 1, 2, 2))
    return Image.fromarray(pixels), instance, class_ids, boxes


PERSON = {"id": 1, "name": "person", "supercategory": "person", "keypoints": ["nose", "left_eye", "right_eye"]}
CAR = {"id": 3, "name": "car", "supercategory": "vehicle"}


def coco_with_keypoints(root) -> None:
    """COCO val2017 with person_keypoints_ and captions_ files: a.jpg (40x30): a person with two of three points
    labelled, a car; b.jpg: stored 40x30, EXIF 6 (upright 30x40), a person, its JSON in the stored pixels as
    COCO's are."""
    images = [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30},
              {"id": 2, "file_name": "b.jpg", "width": 40, "height": 30}]
    anns = [{"id": 10, "image_id": 1, "category_id": 1, "bbox": [2, 2, 10, 8], "area": 80, "iscrowd": 0},
            {"id": 11, "image_id": 1, "category_id": 3, "bbox": [20, 10, 10, 8], "area": 80, "iscrowd": 0},
            {"id": 12, "image_id": 2, "category_id": 1, "bbox": [2, 2, 10, 8], "area": 80, "iscrowd": 0}]
    write_coco(str(root), "val2017", images, anns, [PERSON, CAR],
               {"a.jpg": jpeg(picture(40, 30, [(2, 2, 12, 10), (20, 10, 30, 18)], seed=1)),
                "b.jpg": jpeg(picture(30, 40, [], seed=2), orientation=6)})
    points = [{"id": 10, "image_id": 1, "category_id": 1, "num_keypoints": 2, "keypoints": [4, 3, 2, 6, 5, 1, 0, 0, 0]},
              {"id": 12, "image_id": 2, "category_id": 1, "num_keypoints": 1, "keypoints": [4, 3, 2, 0, 0, 0, 0, 0, 0]}]
    write_file(str(root / "annotations/person_keypoints_val2017.json"),
               json.dumps({"images": images, "annotations": points, "categories": [PERSON]}))
    write_file(str(root / "annotations/captions_val2017.json"), json.dumps(
        {"images": images, "annotations": [{"id": 1, "image_id": 1, "caption": "A person beside a car. "},
                                           {"id": 2, "image_id": 1, "caption": "Someone and a red car"}]}))


def converted_coco_with_keypoints(root) -> str:
    """:func:`coco_with_keypoints` at ``root/coco`` converted (one shard a split, in this process) to ``root/ds``,
    whose path is returned: the dataset the reader's keypoint tests and ``inspect``'s read."""
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run

    coco_with_keypoints(root / "coco")
    run(ConvertOptions(src=str(root / "coco"), out=str(root / "ds"), shards=1),
        ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show_progress=False)
    return str(root / "ds")
