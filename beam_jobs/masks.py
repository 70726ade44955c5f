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
import math
import re
from typing import Optional

import numpy as np
from PIL import Image

from beam_jobs.options import DEFAULT_MAX_PIXELS

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


# A polygon's outline is walked pixel by pixel (pycocotools' rleFrPoly allocates ~40 bytes a pixel of it): at
# most this many times the frame's width plus height, 50 times round the whole image.
_OUTLINE_PER_SIDE = 100
# pycocotools' compressed RLE: 5 bits a character from '0' (48), 0x20 "more", 0x10 the sign of the last one.
_RLE_CHARS = re.compile(r"[0-o]*")
_RLE_MAX_GROUP = 6  # characters of one count: 30 bits, past any count of a capped frame (and C's int shifts)


def segmentation_problem(segmentation: object, frame: Optional[tuple[int, int]],
                         max_pixels: int = DEFAULT_MAX_PIXELS) -> Optional[str]:
    """Why a COCO segmentation cannot be rasterized by :func:`rasterize` at ``frame``, or None when it can.

    ``frame``: the ``(width, height)`` of the annotation's image (the JSON's, or the stored image's once
    read); None when not known yet (then only what the value alone shows is checked). Never raises, and
    allocates nothing the size of the mask: pycocotools checks nothing (an RLE whose counts overrun its
    size writes past the mask's memory), so everything it trusts is checked here:

    * polygons: a non-empty list of lists of at least 6 finite numbers (x, y pairs), inside the frame
      grown by its own size on each side, their outline at most 100 times the frame's width plus height;
    * an RLE (``{"size": [h, w], "counts": ...}``): ``size`` two positive integers, ``h * w`` at most
      ``max_pixels`` (``--max-pixels``: a 65535x65535 RLE would take 4 GB) and equal to the frame
      (a mask of another size would be stretched onto the image); ``counts`` a list of non-negative
      integers, or pycocotools' compressed string, summing to ``h * w``.
    """
    try:
        if isinstance(segmentation, dict):
            return _rle_problem(segmentation, frame, max_pixels)
        if isinstance(segmentation, list):
            return _polygons_problem(segmentation, frame, max_pixels)
    except (RecursionError, MemoryError, OverflowError) as err:  # values no JSON reader makes; never a crash
        return f"segmentation cannot be checked: {type(err).__name__}"
    return f"segmentation {_shown(segmentation)} is neither polygons (a list of lists) nor an RLE (size and counts)"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _polygons_problem(polygons: list, frame: Optional[tuple[int, int]], max_pixels: int) -> Optional[str]:
    if not polygons:
        return "segmentation is an empty list: no polygon"
    outline = 0.0
    for index, polygon in enumerate(polygons, start=1):
        if not isinstance(polygon, list) or len(polygon) < 6 or len(polygon) % 2:
            return (f"segmentation polygon {index} {_shown(polygon)} is not a list of x, y pairs (at least 3 points, "
                    "an even count of numbers)")
        if not all(_is_number(value) for value in polygon):
            return f"segmentation polygon {index} {_shown(polygon)} holds a value that is not a finite number"
        if frame is None:
            continue
        width, height = frame
        xs, ys = polygon[0::2], polygon[1::2]
        if min(xs) < -width or max(xs) > 2 * width or min(ys) < -height or max(ys) > 2 * height:
            return (f"segmentation polygon {index} reaches x {min(xs):g}..{max(xs):g}, y {min(ys):g}..{max(ys):g}: "
                    f"far outside its {width}x{height} image")
        outline += sum(max(abs(xs[i] - xs[i - 1]), abs(ys[i] - ys[i - 1])) for i in range(len(xs)))
    if frame is not None:
        width, height = frame
        if width * height > max_pixels:
            return f"segmentation frame {width}x{height} exceeds --max-pixels {max_pixels}"
        if outline > _OUTLINE_PER_SIDE * (width + height):
            return (f"segmentation polygons have an outline of {outline:.0f} pixels, more than {_OUTLINE_PER_SIDE} "
                    f"times round their {width}x{height} image")
    return None


def _rle_problem(rle: dict, frame: Optional[tuple[int, int]], max_pixels: int) -> Optional[str]:
    size, counts = rle.get("size"), rle.get("counts")
    if not (isinstance(size, list) and len(size) == 2 and all(_is_count(v) and v > 0 for v in size)):
        return f"segmentation RLE size {_shown(size)} is not [height, width] of two positive integers"
    height, width = size
    if height * width > max_pixels:
        return (f"segmentation RLE size [{height}, {width}] (height, width) is {height * width} pixels, more than "
                f"--max-pixels {max_pixels}")
    if frame is not None and (width, height) != tuple(frame):
        return (f"segmentation RLE size [{height}, {width}] (height, width) is not its image's: "
                f"{frame[0]}x{frame[1]} is [{frame[1]}, {frame[0]}]")
    if isinstance(counts, list):
        if len(counts) > height * width + 1 or not all(_is_count(v) and v >= 0 for v in counts):
            return f"segmentation RLE counts {_shown(counts)} are not non-negative integers"
        total = sum(counts)
    elif isinstance(counts, str):
        decoded = _compressed_counts(counts, height * width)
        if isinstance(decoded, str):
            return f"segmentation RLE counts {_shown(counts)} do not decode: {decoded}"
        total = decoded
    else:
        return f"segmentation RLE counts {_shown(counts)} are neither a list of integers nor a compressed string"
    if total != height * width:
        return f"segmentation RLE counts sum to {total}, not its size's {height}x{width} = {height * width} pixels"
    return None


def _compressed_counts(text: str, limit: int):
    """The sum of pycocotools' compressed RLE counts (``rleFrString``, without building them), or what is wrong."""
    if not _RLE_CHARS.fullmatch(text):
        return "a character outside '0'..'o'"
    total = position = decoded = 0
    last = before_last = 0  # from the fourth count on, a count is the difference to the one two before it
    while position < len(text):
        value = shift = 0
        more = True
        while more:
            if position == len(text):
                return "the last count is cut short"
            if shift == 5 * _RLE_MAX_GROUP:
                return f"a count longer than {_RLE_MAX_GROUP} characters"
            char = ord(text[position]) - 48
            value |= (char & 0x1F) << shift
            more = bool(char & 0x20)
            position += 1
            shift += 5
            if not more and char & 0x10:
                value -= 1 << shift
        if decoded > 2:
            value += before_last
        if value < 0:
            return f"count {decoded + 1} is negative ({value})"
        before_last, last = last, value
        decoded += 1
        total += value
        if total > limit:
            return f"the counts pass the size's {limit} pixels"
    return total


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


def read_class_mask(data: bytes, size: Optional[tuple[int, int]], where: str,
                    colours: Optional[str] = None) -> Image.Image:
    """A semantic mask's class ids as a one-band image, checked to be ``size`` ``(width, height)`` when given:
    VOC's palette PNGs give their palette indexes (the class ids, 255 for the outline VOC leaves void).

    ``colours``: a colour table (:func:`colour_table` JSON: ``[[r, g, b, id], ...]``) for masks that draw classes
    as colours (RGB PNGs: CVAT's segmentation masks, VOC's masks saved without their palette): each pixel's colour
    is looked up (a palette PNG's too, by its palette's colour), and a colour the table lacks is named."""
    try:
        image = Image.open(io.BytesIO(data), formats=["PNG"])
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise MaskError(f"{where} is not a readable PNG: {err}") from err
    if size is not None and image.size != tuple(size):
        raise MaskError(f"{where} is {image.size[0]}x{image.size[1]}; its image is {size[0]}x{size[1]}")
    if colours:
        return Image.fromarray(_by_colour(image, colours, where), mode="L")
    if image.mode not in ("P", "L", "I", "I;16", "1"):
        raise MaskError(f"{where} is a {image.mode} image; a class mask holds one class id a pixel (a palette or "
                        "grayscale PNG), or a colour a class with a colour table (labelmap.txt)")
    ids = np.asarray(image)
    if ids.max(initial=0) > 255:
        raise MaskError(f"{where} holds class ids above 255")
    return Image.fromarray(ids.astype(np.uint8), mode="L")


def colour_table(pairs) -> str:
    """``[(colour (r, g, b), class id), ...]`` as the compact JSON :func:`read_class_mask` takes."""
    return json.dumps([[*map(int, colour), int(class_id)] for colour, class_id in pairs], separators=(",", ":"))


def _by_colour(image: Image.Image, colours: str, where: str) -> np.ndarray:
    """Each pixel's class id by its colour in the table; a colour the table lacks raises naming it and its count."""
    rgb = np.asarray(image.convert("RGB")).astype(np.uint32)
    keys = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    found, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    table = {(r << 16) | (g << 8) | b: class_id for r, g, b, class_id in json.loads(colours)}
    unknown = [(int(key), int(count)) for key, count in zip(found, counts) if int(key) not in table]
    if unknown:
        key, count = max(unknown, key=lambda pair: pair[1])
        raise MaskError(f"{where}: colour ({key >> 16}, {(key >> 8) & 255}, {key & 255}) at {count} pixels is no "
                        f"class of the colour table{f' (and {len(unknown) - 1} more colours)' if len(unknown) > 1 else ''}")
    return np.array([table[int(key)] for key in found], np.uint8)[inverse].reshape(keys.shape)


def class_mask_png(data: bytes, turn: int, size: tuple[int, int], where: str, colours: Optional[str] = None) -> bytes:
    """The PNG of an image's class ids (drawn on the image file's pixels, checked by validation) on the
    stored image: turned by the image's EXIF orientation ``turn``, resized with nearest-neighbour to ``size``;
    ``colours``: the colour table of a mask drawn in colours (:func:`read_class_mask`)."""
    return _on_stored_image(read_class_mask(data, None, where, colours), turn, size)
