"""A realistic photo dataset made on the fly, with no downloads.

Crops of the real photographs that scikit-image and scikit-learn ship inside
their packages, scaled so the longer side is 300-500 px (like the Kaggle
cats-vs-dogs set), lightly colour-jittered and saved as JPEG at quality 75-95.
Every file is distinct. Two classes, alternating, under ``DIR/<class>/``.
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
