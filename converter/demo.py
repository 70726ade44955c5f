"""Write a small, learnable demo dataset: ``python -m converter.demo DIR``.

Three classes of drawn shapes (circle, square, triangle) in random colours,
sizes and positions on varied backgrounds (flat, gradient, noise), saved as
JPEG under ``DIR/<class>/``. Seeded, so the same command writes the same files.
No downloads: the README's first command converts this, and the tests use it.

``--objects coco`` or ``--objects yolo``: one to four shapes an image, each with its box, written as
COCO (``annotations/instances_{train,val}2017.json`` beside ``train2017/``, ``val2017/``; category
ids 1, 2, 3) or as Ultralytics YOLO (``data.yaml``, ``images/{train,val}/``, ``labels/{train,val}/``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle")


def _background(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    kind = rng.integers(3)
    base = rng.integers(0, 256, size=3)
    if kind == 0:
        pixels = np.broadcast_to(base, (height, width, 3)).astype(np.float64)
    elif kind == 1:
        other = rng.integers(0, 256, size=3)
        ramp = np.linspace(0.0, 1.0, width)[None, :, None]
        pixels = base * (1 - ramp) + other * ramp + np.zeros((height, 1, 1))
    else:
        pixels = base + rng.normal(0, 40, size=(height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def draw_shape(rng: np.random.Generator, shape: str, height: int, width: int) -> Image.Image:
    """One image of ``shape`` on a random background."""
    img = _background(rng, height, width)
    draw = ImageDraw.Draw(img)
    size = int(rng.uniform(0.35, 0.7) * min(height, width))
    x0 = int(rng.integers(0, width - size))
    y0 = int(rng.integers(0, height - size))
    colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
    outline = tuple(255 - c for c in colour)
    box = (x0, y0, x0 + size, y0 + size)
    if shape == "circle":
        draw.ellipse(box, fill=colour, outline=outline, width=3)
    elif shape == "square":
        draw.rectangle(box, fill=colour, outline=outline, width=3)
    else:
        draw.polygon([(x0 + size / 2, y0), (x0, y0 + size), (x0 + size, y0 + size)], fill=colour, outline=outline)
    return img


def write_demo(folder: str, per_class: int = 200, seed: int = 0, size_range: tuple[int, int] = (96, 192)) -> int:
    """Write ``per_class`` JPEGs of each class under ``folder``; returns the number written."""
    rng = np.random.default_rng(seed)
    written = 0
    for shape in CLASSES:
        os.makedirs(os.path.join(folder, shape), exist_ok=True)
        for index in range(per_class):
            height, width = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, size=2))
            img = draw_shape(rng, shape, height, width)
            img.save(os.path.join(folder, shape, f"{shape}_{index:04d}.jpg"), quality=int(rng.integers(80, 96)))
            written += 1
    return written


def draw_objects(rng: np.random.Generator, height: int, width: int) -> tuple[Image.Image, list[tuple[int, tuple]]]:
    """One image of one to four shapes: ``(image, [(class index, (x0, y0, x1, y1) pixels), ...])``."""
    img = _background(rng, height, width)
    draw = ImageDraw.Draw(img)
    objects = []
    for _ in range(int(rng.integers(1, 5))):
        shape = int(rng.integers(len(CLASSES)))
        size = int(rng.uniform(0.15, 0.4) * min(height, width))
        x0, y0 = int(rng.integers(0, width - size)), int(rng.integers(0, height - size))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        box = (x0, y0, x0 + size, y0 + size)
        if CLASSES[shape] == "circle":
            draw.ellipse(box, fill=colour)
        elif CLASSES[shape] == "square":
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(x0 + size / 2, y0), (x0, y0 + size), (x0 + size, y0 + size)], fill=colour)
        objects.append((shape, box))
    return img, objects


def write_object_demo(folder: str, layout: str, images: int = 300, seed: int = 0) -> int:
    """Write ``images`` JPEGs of shapes with their boxes as ``layout`` ("coco" or "yolo") ships; 20% are val."""
    rng = np.random.default_rng(seed)
    splits: dict[str, list] = {"train": [], "val": []}
    for index in range(images):
        height, width = (int(v) for v in rng.integers(128, 257, size=2))
        img, objects = draw_objects(rng, height, width)
        split = "val" if index % 5 == 4 else "train"
        name = f"{index:06d}.jpg"
        if layout == "coco":
            path = os.path.join(folder, f"{split}2017", name)
        else:
            path = os.path.join(folder, "images", split, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        img.save(path, quality=90)
        splits[split].append((index + 1, name, width, height, objects))
        if layout == "yolo":
            _write_yolo_labels(os.path.join(folder, "labels", split, f"{index:06d}.txt"), objects, width, height)
    if layout == "coco":
        for split, items in splits.items():
            _write_coco(os.path.join(folder, "annotations", f"instances_{split}2017.json"), items)
    else:
        with open(os.path.join(folder, "data.yaml"), "w") as handle:
            handle.write("path: .\ntrain: images/train\nval: images/val\nnames:\n"
                         + "".join(f"  {i}: {name}\n" for i, name in enumerate(CLASSES)))
    return images


def _write_coco(path: str, items: list) -> None:
    import json

    os.makedirs(os.path.dirname(path), exist_ok=True)
    images, annotations = [], []
    for image_id, name, width, height, objects in items:
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
        for shape, (x0, y0, x1, y1) in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": shape + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    categories = [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CLASSES)]
    with open(path, "w") as handle:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, handle)


def _write_yolo_labels(path: str, objects: list, width: int, height: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        for shape, (x0, y0, x1, y1) in objects:
            handle.write(f"{shape} {(x0 + x1) / 2 / width:.6f} {(y0 + y1) / 2 / height:.6f} "
                         f"{(x1 - x0) / width:.6f} {(y1 - y0) / height:.6f}\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m converter.demo", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write DIR/<class>/<image>.jpg")
    parser.add_argument("--per-class", type=int, default=200, help="images per class (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--objects", choices=("coco", "yolo"),
                        help="several shapes an image with their boxes, as COCO or Ultralytics YOLO ship them")
    args = parser.parse_args(argv)
    if args.objects:
        count = write_object_demo(args.folder, args.objects, seed=args.seed)
        print(f"wrote {count} images of shapes with their boxes ({args.objects}) to {args.folder}")
        return 0
    count = write_demo(args.folder, args.per_class, args.seed)
    print(f"wrote {count} images in {len(CLASSES)} classes to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
