"""Write a small, learnable demo dataset: ``python -m converter.demo DIR``.

Three classes of drawn shapes (circle, square, triangle) in random colours,
sizes and positions on varied backgrounds (flat, gradient, noise), saved as
JPEG under ``DIR/<class>/``. Seeded, so the same command writes the same files.
No downloads: the README's first command converts this, and the tests use it.
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m converter.demo", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write DIR/<class>/<image>.jpg")
    parser.add_argument("--per-class", type=int, default=200, help="images per class (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    args = parser.parse_args(argv)
    count = write_demo(args.folder, args.per_class, args.seed)
    print(f"wrote {count} images in {len(CLASSES)} classes to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
