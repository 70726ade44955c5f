"""The contact sheet ``inspect --grid`` draws: sample records as what they hold, for every task.

Classification: one row per class, ``per_class`` thumbnails each, so a person sees at a glance that the
images under each label are what the label says. Objects, segmentation and multi-label: a grid of the
first records in shard order (``per_class`` columns, a row per class up to 8), each tile the image with
its labels drawn on it, its file name under it:

- objects: every box with its class name, a color per class; crowd boxes dashed; instance masks tinted;
  the caption counts the objects by class;
- segmentation: the class mask tinted over the image, a color per class id (void, 255, and a class
  named "background" or unnamed are left clear); the caption names the classes present;
- multi-label: the caption names the image's classes.

The report's contact sheets per class (``reader/tools/report.py``) are rows of the same tiles (:func:`record_tile`).
"""

from __future__ import annotations

import collections
import colorsys
import functools
import io
import itertools
import os
import shutil
import subprocess
from typing import Iterator, Optional

import numpy as np
import tensorflow as tf
from PIL import Image, ImageDraw, ImageFont, ImageOps

import record_schema
from reader.info import DatasetInfo, SplitInfo
from reader.frames import extent_records, iter_records
from record_files.tfrecord import FrameError

GAP = 4  # pixels between tiles
MAX_ROWS = 8  # of a grid of records
CAPTION_LINES = 3  # under a record's tile: its file name, then what it holds
TINT = 0.45  # opacity of a mask's color over its image
VOID = 255  # a class mask's "not labelled" id

Color = tuple[int, int, int]
Caption = list[tuple[str, Optional[Color]]]  # words, each with the color of its swatch (None: no swatch)


def draw_sheet(info: DatasetInfo, split: SplitInfo, per_class: int, thumb: int) -> tuple[Image.Image, set[str]]:
    """The contact sheet of ``split``, and the characters of its text that no installed font draws.

    Raises:
      ValueError: a shard is damaged (naming it and the record).
    """
    fonts = LabelFonts()
    if info.task == record_schema.TASK_CLASSIFICATION:
        return _class_rows(info, split, per_class, thumb, fonts), fonts.missing
    return _record_grid(info, split, per_class, 2 * thumb, fonts), fonts.missing


def class_color(class_id: int) -> Color:
    """A color per class id, far from its neighbours' (hues a golden angle apart, two brightnesses)."""
    red, green, blue = colorsys.hsv_to_rgb((class_id * 0.618034) % 1.0, 0.85, 1.0 if class_id % 2 else 0.8)
    return int(red * 255), int(green * 255), int(blue * 255)


def _names(info: DatasetInfo) -> list[str]:
    return list(info.manifest.get("class_text") or info.classes)


def _name(names: list[str], class_id: int) -> str:
    return names[class_id] if 0 <= class_id < len(names) and names[class_id] else str(class_id)


def split_features(info: DatasetInfo, split: SplitInfo, doing: str = "draw the contact sheet") -> Iterator:
    """Every record of ``split`` in shard order, parsed: the sheet's walk and the report's scan (a dataset without
    records tables). A damaged shard is a ValueError naming it and the record: ``cannot {doing}: ...``."""
    for shard in split.shards:
        try:
            # An extent of a masked version: its run only, the deleted records around it never read.
            records = iter_records(shard.path) if shard.whole else \
                extent_records(shard.path, shard.index_path, shard.first, shard.num_examples)
            for data in records:
                yield tf.train.Example.FromString(data).features.feature
        except FrameError as err:
            raise ValueError(f"cannot {doing}: {err}. python -m converter verify {info.data_dir} "
                             "checks every shard") from None


def _values(feature, key: str) -> list:
    if key not in feature:
        return []
    value = feature[key]
    return list(value.float_list.value) or list(value.int64_list.value) or list(value.bytes_list.value)


def _decode(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def _class_rows(info: DatasetInfo, split: SplitInfo, per_class: int, thumb: int, fonts: LabelFonts) -> Image.Image:
    """One row per class: its name, then its first ``per_class`` images in shard order."""
    samples: dict[int, list[Image.Image]] = collections.defaultdict(list)
    full = 0
    for feature in split_features(info, split):
        label = feature[record_schema.LABEL].int64_list.value[0]
        if len(samples[label]) < per_class:
            image = _decode(feature[record_schema.IMAGE_ENCODED].bytes_list.value[0]).convert("RGB")
            image.thumbnail((thumb, thumb))
            samples[label].append(image)
            full += len(samples[label]) == per_class
        if full >= info.num_classes:
            break
    names = _names(info)
    name_width = int(max(fonts.width(name) for name in names)) + 16
    sheet = Image.new("RGB", (name_width + per_class * (thumb + GAP), info.num_classes * (thumb + GAP)), "white")
    draw = ImageDraw.Draw(sheet)
    for label, name in enumerate(names):
        top = label * (thumb + GAP)
        fonts.draw(draw, (4, top + thumb // 2 - 8), name)
        for column, image in enumerate(samples.get(label, [])):
            sheet.paste(image, (name_width + column * (thumb + GAP), top))
    return sheet


def _record_grid(info: DatasetInfo, split: SplitInfo, columns: int, side: int, fonts: LabelFonts) -> Image.Image:
    """The first records of ``split`` as tiles of ``side`` pixels, ``columns`` to a row."""
    rows = min(max(sum(1 for name in info.classes if name), 1), MAX_ROWS)
    tag_fonts = LabelFonts(size=11)
    tiles = [record_tile(info, feature, side, fonts, tag_fonts)
             for feature in itertools.islice(split_features(info, split), columns * rows)]
    height = side + CAPTION_LINES * fonts.line_height + GAP
    sheet = Image.new("RGB", (GAP + columns * (side + GAP), GAP + max(1, -(-len(tiles) // columns)) * (height + GAP)),
                      "white")
    for index, tile in enumerate(tiles):
        sheet.paste(tile, (GAP + index % columns * (side + GAP), GAP + index // columns * (height + GAP)))
    return sheet


def record_tile(info: DatasetInfo, feature, side: int, fonts: LabelFonts, tag_fonts: LabelFonts) -> Image.Image:
    """One record (its parsed features) as a tile: the image fitted into ``side`` pixels with what its task labels
    drawn on (boxes and class names, the class mask, or the class names in the caption), its file name under
    it. The grid and the report's contact sheets per class are made of these; ``tag_fonts`` draw the names on
    the boxes (smaller than ``fonts``, the caption's)."""
    image = ImageOps.contain(_decode(_values(feature, record_schema.IMAGE_ENCODED)[0]).convert("RGB"), (side, side))
    names = _names(info)
    if info.task == record_schema.TASK_OBJECTS:
        caption = _draw_objects(image, feature, names, tag_fonts)
    elif info.task == record_schema.TASK_SEGMENTATION:
        caption = _draw_class_mask(image, feature, names)
    else:
        labels = _values(feature, record_schema.LABEL)
        caption = [(_name(names, label), None) for label in labels] or [("no class", None)]
    tile = Image.new("RGB", (side, side + CAPTION_LINES * fonts.line_height + GAP), "white")
    tile.paste(image, ((side - image.width) // 2, 0))
    draw = ImageDraw.Draw(tile)
    filename = _values(feature, record_schema.FILENAME)
    top = image.height + 2  # the caption right under its image
    fonts.draw(draw, (2, top), fonts.fit(filename[0].decode("utf-8", "replace") if filename else "?", side - 4,
                                         keep_end=True))
    _draw_caption(draw, (2, top + fonts.line_height), caption, side - 4, fonts)
    return tile


def _draw_objects(image: Image.Image, feature, names: list[str], fonts: LabelFonts) -> Caption:
    """Every object's box (dashed for a crowd) and class name on ``image``, its mask tinted; the caption."""
    width, height = image.size
    corners = zip(*(_values(feature, key) for key in (record_schema.BBOX_XMIN, record_schema.BBOX_YMIN,
                                                       record_schema.BBOX_XMAX, record_schema.BBOX_YMAX)))
    boxes = [(round(x0 * width), round(y0 * height), round(x1 * width), round(y1 * height))
             for x0, y0, x1, y1 in corners]
    labels = _values(feature, record_schema.OBJECT_LABEL) or [0] * len(boxes)
    texts = [text.decode("utf-8", "replace") for text in _values(feature, record_schema.OBJECT_TEXT)]
    objects = [(box, label, texts[i] if i < len(texts) and texts[i] else _name(names, label))
               for i, (box, label) in enumerate(zip(boxes, labels))]
    crowd = _values(feature, record_schema.OBJECT_IS_CROWD) or [0] * len(boxes)
    for mask, label in zip(_values(feature, record_schema.OBJECT_MASK), labels):
        _tint(image, np.asarray(_decode(mask).convert("L").resize(image.size, Image.Resampling.NEAREST)) > 0,
              class_color(label))
    draw = ImageDraw.Draw(image)
    for (box, label, _), is_crowd in zip(objects, crowd):
        (_dashed_rectangle if is_crowd else _rectangle)(draw, box, class_color(label))
    for box, label, name in objects:  # after every box: no box crosses a name
        _tag(draw, image.size, box, name, class_color(label), fonts)
    count = f"{len(boxes)} object{'' if len(boxes) == 1 else 's'}" + (f", {sum(crowd)} crowd" if any(crowd) else "")
    by_class = collections.Counter((label, name) for _, label, name in objects)
    return [(count, None)] + [(f"{n} {name}", class_color(label)) for (label, name), n in sorted(by_class.items())]


def _rectangle(draw: ImageDraw.ImageDraw, box: tuple, color: Color) -> None:
    """A box: 2 pixels of ``color`` on its edge inside, 1 dark pixel outside (seen on a background of its color)."""
    x0, y0, x1, y1 = box
    x1, y1 = max(x0, x1 - 1), max(y0, y1 - 1)
    draw.rectangle((x0 - 1, y0 - 1, x1 + 1, y1 + 1), outline=(0, 0, 0), width=1)
    draw.rectangle((x0, y0, x1, y1), outline=color, width=2)


def _dashed_rectangle(draw: ImageDraw.ImageDraw, box: tuple, color: Color, dash: int = 5) -> None:
    """A crowd's box: 2-pixel dashes of ``dash`` pixels, gaps as long."""
    x0, y0, x1, y1 = box
    x1, y1 = max(x0, x1 - 1), max(y0, y1 - 1)
    for (ax, ay), (bx, by) in (((x0, y0), (x1, y0)), ((x1, y0), (x1, y1)), ((x1, y1), (x0, y1)), ((x0, y1), (x0, y0))):
        length = max(abs(bx - ax), abs(by - ay))
        for start in np.arange(0, length, 2 * dash):
            end = min(start + dash, length)
            point = (ax + (bx - ax) * start / (length or 1), ay + (by - ay) * start / (length or 1))
            stop = (ax + (bx - ax) * end / (length or 1), ay + (by - ay) * end / (length or 1))
            draw.line((point, stop), fill=color, width=2)


def _tag(draw: ImageDraw.ImageDraw, size: tuple[int, int], box: tuple, text: str, color: Color,
         fonts: LabelFonts) -> None:
    """``text`` on a patch of ``color`` above the box's top left corner (inside it when the box is at the top)."""
    width = size[0]
    text = fonts.fit(text, width)
    tag_width, tag_height = fonts.width(text) + 4, fonts.line_height
    x = max(0, min(box[0], width - tag_width))
    y = box[1] - tag_height if box[1] >= tag_height else box[1]
    draw.rectangle((x, y, x + tag_width - 1, y + tag_height - 1), fill=color)
    ink = (0, 0, 0) if 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2] > 140 else (255, 255, 255)
    fonts.draw(draw, (x + 2, y), text, fill=ink)


def _tint(image: Image.Image, where: np.ndarray, colors) -> None:
    """Blend ``colors`` (one color, or one per pixel) over ``image`` where ``where`` holds."""
    pixels = np.asarray(image).astype(np.float32)
    color = np.broadcast_to(np.asarray(colors, np.float32), pixels.shape)
    pixels[where] = pixels[where] * (1 - TINT) + color[where] * TINT
    image.paste(Image.fromarray(np.round(pixels).astype(np.uint8)))


def mask_classes(info: DatasetInfo, feature) -> list[int]:
    """The class ids a segmentation record's mask holds (its PNG decoded), without void (255) and the classes
    left clear on a tile (named "background", or unnamed): what the report files the record under."""
    encoded = _values(feature, record_schema.SEGMENTATION_ENCODED)
    if not encoded:
        return []
    mask = _decode(encoded[0])
    ids = np.unique(np.asarray(mask if mask.mode in ("L", "P") else mask.convert("L")))
    names = _names(info)
    return [int(i) for i in ids
            if i != VOID and not (i < len(names) and names[i].strip().lower() in ("", "background", "_background_"))]


def _draw_class_mask(image: Image.Image, feature, names: list[str]) -> Caption:
    """The class mask tinted over ``image``, a color per class id; the caption names the classes present."""
    encoded = _values(feature, record_schema.SEGMENTATION_ENCODED)
    if not encoded:
        return [("no mask", None)]
    mask = _decode(encoded[0])
    ids = np.asarray(mask.resize(image.size, Image.Resampling.NEAREST) if mask.mode in ("L", "P")
                     else mask.convert("L").resize(image.size, Image.Resampling.NEAREST)).astype(np.int64)
    present = [int(i) for i in np.unique(ids) if i != VOID]
    clear = [i for i in present if i < len(names) and names[i].strip().lower() in ("", "background", "_background_")]
    palette = np.array([class_color(i) for i in range(int(ids.max()) + 1)], np.float32)
    _tint(image, (ids != VOID) & ~np.isin(ids, clear), palette[ids])
    tinted = [(_name(names, i), class_color(i)) for i in present if i not in clear]
    return tinted or [("background only" if present else "all void", None)]


def _draw_caption(draw: ImageDraw.ImageDraw, xy: tuple[int, int], caption: Caption, width: int,
                  fonts: LabelFonts) -> None:
    """Words left to right on up to ``CAPTION_LINES - 1`` lines, each after its color's swatch; "+N" if cut."""
    x, y = xy
    left, right, lines = x, x + width, 1
    for index, (text, color) in enumerate(caption):
        needed = fonts.width(text) + (fonts.size if color else 0)
        more = fonts.width(f"  +{len(caption) - index - 1}") if index + 1 < len(caption) else 0
        if x > left and x + needed + (more if lines == CAPTION_LINES - 1 else 0) > right:
            if lines == CAPTION_LINES - 1:
                fonts.draw(draw, (x, y), f"+{len(caption) - index}")
                return
            x, y, lines = left, y + fonts.line_height, lines + 1
        if color:
            draw.rectangle((x, y + 3, x + fonts.size - 4, y + fonts.size - 1), fill=color, outline=(0, 0, 0))
            x += fonts.size
        text = fonts.fit(text, right - x)
        fonts.draw(draw, (x, y), text)
        x += fonts.width(text) + 8


class LabelFonts:
    """Draws text in any script the machine has a font for, character by character.

    Pillow's built-in font draws only Latin; DejaVu Sans (shipped with
    matplotlib, and with most Linux systems) adds accents, Greek and Cyrillic;
    any other installed font (``fc-list``, asked only for a character DejaVu
    lacks) fills the rest, e.g. a CJK font for ``猫``. A character no installed
    font has is drawn as a box and listed in :attr:`missing`.
    """

    SIZE = 14

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self.line_height = size + 3
        self._loaded: dict[str, ImageFont.FreeTypeFont] = {}
        self._by_char: dict[str, ImageFont.ImageFont] = {}
        self._widths: dict[str, float] = {}  # each character's advance, measured once (Pillow: ~40 us a call)
        self.missing: set[str] = set()

    def _font(self, path: str):
        if path not in self._loaded:
            self._loaded[path] = ImageFont.truetype(path, self.size)
        return self._loaded[path]

    def _first_having(self, char: str, paths: tuple[str, ...]):
        for path in paths:
            try:
                font = self._font(path)
            except OSError:
                continue
            if char.isspace() or _has_glyph(font, char):
                return font
        return None

    def for_char(self, char: str):
        """The first font that has a glyph for ``char`` (the first font at all if none has)."""
        if char not in self._by_char:
            chosen = self._first_having(char, _bundled_font_files()) or self._first_having(char, _system_font_files())
            if chosen is None:
                self.missing.add(char)
                paths = _bundled_font_files() or _system_font_files()
                chosen = self._font(paths[0]) if paths else ImageFont.load_default(self.size)
            self._by_char[char] = chosen
        return self._by_char[char]

    def char_width(self, char: str) -> float:
        if char not in self._widths:
            self._widths[char] = self.for_char(char).getlength(char)
        return self._widths[char]

    def width(self, text: str) -> float:
        return sum(self.char_width(char) for char in text)

    def fit(self, text: str, width: float, keep_end: bool = False) -> str:
        """``text``, cut to ``width`` pixels with an ellipsis if it is wider; ``keep_end``: cut from the left (a
        path's file name is what tells two tiles apart)."""
        if self.width(text) <= width:
            return text
        if keep_end:
            while text and self.width("…" + text) > width:
                text = text[1:]
            return "…" + text
        while text and self.width(text + "…") > width:
            text = text[:-1]
        return text + "…"

    def draw(self, draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, fill: Color = (0, 0, 0)) -> None:
        x, y = xy
        for char in text:
            font = self.for_char(char)
            draw.text((x, y), char, fill=fill, font=font)
            x += self.char_width(char)


def _has_glyph(font, char: str) -> bool:
    """``font`` draws ``char`` as itself, not as its "missing glyph" box."""
    missing = font.getmask("\U0010fffd")  # a private-use code point: no font maps it
    mask = font.getmask(char)
    return not (mask.size == missing.size and bytes(mask) == bytes(missing))


@functools.lru_cache(maxsize=1)
def _bundled_font_files() -> tuple[str, ...]:
    """DejaVu Sans, found without starting a process: matplotlib's copy, else Debian's."""
    paths = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"]
    try:
        import matplotlib

        paths.insert(0, os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf",
                                     "DejaVuSans.ttf"))
    except ImportError:
        pass
    return tuple(path for path in paths if os.path.exists(path))


@functools.lru_cache(maxsize=1)
def _system_font_files() -> tuple[str, ...]:
    """Every other font fontconfig knows (``fc-list``, a process), DejaVu Sans first."""
    if not shutil.which("fc-list"):
        return ()
    listed = subprocess.run(["fc-list", "--format", "%{file}\n"], capture_output=True, text=True, timeout=30)
    files = sorted({line for line in listed.stdout.splitlines() if line.lower().endswith((".ttf", ".otf", ".ttc"))})
    files = sorted(files, key=lambda f: (os.path.basename(f) != "DejaVuSans.ttf", f))
    return tuple(path for path in files if path not in _bundled_font_files() and os.path.exists(path))
