"""The colour photographs that scikit-image and scikit-learn ship inside their packages: real photos, no download.

The tests crop and scale them (near duplicates, perceptual hashes); ``bench.data`` makes its photo datasets from
them (the benchmark runs from a clone, where this module is; it is not installed with the package).
"""

from __future__ import annotations

import os

from PIL import Image

_SKIMAGE = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg", "retina.jpg",
            "motorcycle_left.png", "motorcycle_right.png", "color.png")
_SKLEARN = ("china.jpg", "flower.jpg")


def source_photos() -> list[Image.Image]:
    """The colour photographs shipped inside scikit-image and scikit-learn."""
    import skimage
    import sklearn.datasets

    folders = [(os.path.join(os.path.dirname(skimage.__file__), "data"), _SKIMAGE),
               (os.path.join(os.path.dirname(sklearn.datasets.__file__), "images"), _SKLEARN)]
    photos = []
    for folder, names in folders:
        for name in names:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                photos.append(Image.open(path).convert("RGB"))
    if len(photos) < 4:
        raise RuntimeError("scikit-image and scikit-learn sample photographs not found; pip install '.[bench]'")
    return photos
