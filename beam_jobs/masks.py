"""Instance masks: an object's COCO segmentation as the PNG its record holds, on the stored image's pixels.

In:  a placed object's segmentation (COCO's polygons, or an RLE for a crowd: JSON text in
     ``Box.mask``), the pixel frame it was drawn in, the EXIF turn its image got, and the stored size.
Out: a PNG of 0s and 1s, the size of the stored image (``image/object/mask``: one an object, what Model
     Garden's ``TfExampleDecoder`` decodes with ``include_mask=True``).

Rasterized as Model Garden's ``create_coco_tf_record.py`` does (pycocotools' ``frPyObjects`` and
``decode``; a non-crowd object's polygons merged), then turned as the pixels were and resized with
nearest-neighbour, so a mask stays on its object under EXIF orientation and ``--max-side``. The writer
makes them, deterministically, from the annotation the work files carry: no mask travels between stages.
pycocotools is an extra (``pip install ".[masks]"``), checked before a run that asks for masks starts.
"""

from __future__ import annotations

import io
import json
from typing import Optional

import numpy as np
from PIL import Image

# PIL's transpose that turns each EXIF orientation upright (what ImageOps.exif_transpose applies).
_UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
            5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
            8: Image.Transpose.ROTATE_90}


class MasksUnavailableError(RuntimeError):
    """--masks was given without pycocotools installed."""


def check_available() -> None:
    """Raise :class:`MasksUnavailableError` naming the extra when pycocotools cannot be imported."""
    try:
        import pycocotools.mask  # noqa: F401
    except ImportError as err:
        raise MasksUnavailableError(f"--masks rasterizes COCO segmentations with pycocotools, which is not "
                                    f"installed ({err}): pip install \"imgshards[masks]\" (or '.[masks]' in a "
                                    "checkout)") from err


def rasterize(segmentation: object, frame: tuple[int, int], crowd: bool) -> np.ndarray:
    """A ``height x width`` 0/1 mask of a COCO segmentation drawn in a ``frame`` of ``(width, height)`` pixels."""
    from pycocotools import mask as coco_mask

    width, height = frame
    if isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), str):
        rle = {"size": segmentation["size"], "counts": segmentation["counts"].encode("ascii")}  # compressed RLE
    else:
        rle = coco_mask.frPyObjects(segmentation, height, width)
    binary = coco_mask.decode(rle)
    if binary.ndim == 3:  # several polygons (or RLEs): one object
        binary = np.amax(binary, axis=2)
    return binary.astype(np.uint8)


def mask_png(segmentation_json: str, frame: tuple[int, int], turn: int, size: tuple[int, int], crowd: bool) -> bytes:
    """The PNG of one object's mask on the stored image: rasterized in ``frame``, turned by the EXIF
    orientation ``turn`` (1: none), resized with nearest-neighbour to ``size`` ``(width, height)``."""
    return _on_stored_image(Image.fromarray(rasterize(json.loads(segmentation_json), frame, crowd)), turn, size)


def _on_stored_image(image: Image.Image, turn: int, size: tuple[int, int]) -> bytes:
    """A mask drawn on the image file's pixels as a PNG on the stored image: turned by the EXIF orientation
    ``turn`` as the pixels were, resized with nearest-neighbour (class ids never blend) to ``size``."""
    if turn in _UPRIGHT:
        image = image.transpose(_UPRIGHT[turn])
    if image.size != tuple(size):
        image = image.resize(tuple(size), Image.Resampling.NEAREST)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


class MaskError(ValueError):
    """A semantic mask that cannot be used: not a PNG, or not the size of its image."""


def read_class_mask(data: bytes, size: Optional[tuple[int, int]], where: str) -> Image.Image:
    """A semantic mask's class ids as a one-band image, checked to be ``size`` ``(width, height)`` when given:
    VOC's palette PNGs give their palette indexes (the class ids, 255 for the outline VOC leaves void)."""
    try:
        image = Image.open(io.BytesIO(data), formats=["PNG"])
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise MaskError(f"{where} is not a readable PNG: {err}") from err
    if image.mode not in ("P", "L", "I", "I;16", "1"):
        raise MaskError(f"{where} is a {image.mode} image; a class mask holds one class id a pixel (a palette or "
                        "grayscale PNG)")
    if size is not None and image.size != tuple(size):
        raise MaskError(f"{where} is {image.size[0]}x{image.size[1]}; its image is {size[0]}x{size[1]}")
    ids = np.asarray(image)
    if ids.max(initial=0) > 255:
        raise MaskError(f"{where} holds class ids above 255")
    return Image.fromarray(ids.astype(np.uint8), mode="L")


def class_mask_png(data: bytes, turn: int, size: tuple[int, int], where: str) -> bytes:
    """The PNG of an image's class ids (drawn on the image file's pixels, checked by validation) on the
    stored image: turned by the image's EXIF orientation ``turn``, resized with nearest-neighbour to ``size``."""
    return _on_stored_image(read_class_mask(data, None, where), turn, size)
