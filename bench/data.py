"""A realistic photo dataset made on the fly, with no downloads.

Crops of the real photographs that scikit-image and scikit-learn ship inside
their packages, scaled so the longer side is 300-500 px (like the Kaggle
cats-vs-dogs set), lightly colour-jittered and saved as JPEG at quality 75-95.
Every file is distinct. Two classes, alternating, under ``DIR/<class>/``.

:func:`make_varied_dataset` makes photos of many scenes instead: each a 2x2 mosaic of crops of four photos
drawn apart, each tile at its own scale and colour balance, so an image's light spreads as varied photos' do
(crops of ten photos share a scene with N / 10 others: a near search's worst case, not a common one).
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image, ImageEnhance

# The source photographs are the tests' too: they live in tests/ (bench runs from a clone, beside them).
from tests.photo_data import source_photos


def make_photo_dataset(folder: str, count: int, seed: int = 0, sides: tuple[int, int] = (300, 500),
                       image_format: str = "JPEG") -> int:
    """Write ``count`` distinct photos (JPEG, or PNG) whose longer side is in ``sides``; returns their total bytes.

    Sides past the source photos' own (about 512-640 px) are upscaled, with
    mild sensor-like noise so the JPEGs stay as dense as real photos'.
    """
    rng = np.random.default_rng(seed)
    photos = source_photos()
    total = 0
    for index in range(count):
        photo = photos[int(rng.integers(len(photos)))]
        width, height = photo.size
        area = rng.uniform(0.3, 1.0) * width * height
        aspect = rng.uniform(0.75, 1.33)
        crop_w = int(min(width, np.sqrt(area * aspect)))
        crop_h = int(min(height, np.sqrt(area / aspect)))
        left = int(rng.integers(0, width - crop_w + 1))
        top = int(rng.integers(0, height - crop_h + 1))
        image = photo.crop((left, top, left + crop_w, top + crop_h))
        side = int(rng.integers(sides[0], sides[1] + 1))
        scale = side / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.BILINEAR)
        if scale > 1:
            noisy = np.asarray(image, np.int16) + rng.normal(0, 4, (image.height, image.width, 1)).astype(np.int16)
            image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        image = ImageEnhance.Color(image).enhance(rng.uniform(0.8, 1.2))
        label = "cat" if index % 2 == 0 else "dog"
        os.makedirs(os.path.join(folder, label), exist_ok=True)
        quality = int(rng.integers(75, 96))  # drawn for PNG too, so both formats hold the same pictures
        path = os.path.join(folder, label, f"{label}.{index:06d}.{'jpg' if image_format == 'JPEG' else 'png'}")
        image.save(path, format=image_format, **({"quality": quality} if image_format == "JPEG" else {}))
        total += os.path.getsize(path)
    return total


def make_varied_dataset(folder: str, count: int, seed: int = 0, sides: tuple[int, int] = (96, 160),
                        first: int = 0) -> int:
    """Write ``count`` JPEGs of varied scenes (2x2 mosaics of crops of four photos, each tile scaled and colour
    balanced alone) whose longer side is in ``sides``; returns their total bytes. Two classes, alternating.
    Images before ``first`` are drawn but not written: a set of 200,000 grows from the 50,000 of its seed (the
    same files, hard-linked or copied there first)."""
    rng = np.random.default_rng(seed)
    # The photos at most 2x the largest side first: a tile is then never scaled down from ten times its size.
    photos = []
    for photo in source_photos():
        photo = photo.convert("RGB")
        photo.thumbnail((2 * sides[1], 2 * sides[1]), Image.Resampling.BILINEAR)
        photos.append(np.asarray(photo))
    total = 0
    for index in range(count):
        side = int(rng.integers(sides[0], sides[1] + 1))
        width, height = side, max(8, int(side * rng.uniform(0.6, 1.0)))
        split_x, split_y = int(width * rng.uniform(0.25, 0.75)), int(height * rng.uniform(0.25, 0.75))
        tiles = []
        for box in ((0, split_y, 0, split_x), (0, split_y, split_x, width),
                    (split_y, height, 0, split_x), (split_y, height, split_x, width)):
            photo = photos[int(rng.integers(len(photos)))]
            zoom = rng.uniform(0.1, 1.0)  # the share of the photo's side a tile shows
            crop_h = max(2, int(photo.shape[0] * zoom))
            crop_w = max(2, int(photo.shape[1] * zoom))
            y0 = int(rng.integers(0, photo.shape[0] - crop_h + 1))
            x0 = int(rng.integers(0, photo.shape[1] - crop_w + 1))
            tiles.append((box, photo[y0:y0 + crop_h, x0:x0 + crop_w], rng.uniform(0.6, 1.4, 3)))  # channel gains
        quality = int(rng.integers(75, 96))
        if index < first:
            continue
        canvas = np.empty((height, width, 3), np.uint8)
        for (top, bottom, left, right), crop, gains in tiles:
            tile = Image.fromarray(crop).resize((right - left, bottom - top), Image.Resampling.BILINEAR)
            canvas[top:bottom, left:right] = np.clip(np.asarray(tile, np.float32) * gains, 0, 255).astype(np.uint8)
        label = "cat" if index % 2 == 0 else "dog"
        os.makedirs(os.path.join(folder, label), exist_ok=True)
        path = os.path.join(folder, label, f"{label}.{index:06d}.jpg")
        Image.fromarray(canvas).save(path, format="JPEG", quality=quality)
        total += os.path.getsize(path)
    return total
