"""``inspect``: what a converted dataset holds, for a person to read, and a contact sheet to look at."""

from __future__ import annotations

import collections
import datetime
import functools
import io
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
from typing import Optional

import tensorflow as tf
from PIL import Image, ImageDraw, ImageFont

import record_schema
from reader import storage
from reader.info import DatasetInfo, dataset_info, kept_work
from reader.verify import iter_records
from record_files.tfrecord import FrameError

logger = logging.getLogger(__name__)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in rows]


def summarize(data_dir: str) -> str:
    """Classes by split with counts, shard sizes, bytes, rejections by reason, and content duplicates."""
    info = dataset_info(data_dir)
    splits = list(info.splits.values())
    lines = [f"{data_dir}: {info.num_classes} classes, "
             f"{sum(s.num_examples for s in splits)} images, {sum(s.num_bytes for s in splits):,} bytes", ""]
    text = info.manifest.get("class_text") or list(info.classes)
    with_text = list(text) != list(info.classes)  # --synsets: each class's text beside its id
    rows = [["label", "class"] + (["text"] if with_text else []) + [s.name for s in splits]]
    for label, name in enumerate(info.classes):
        rows.append([str(label), name] + ([text[label]] if with_text else [])
                    + [str(s.label_counts[label]) if s.label_counts else "?" for s in splits])
    rows.append(["", "total"] + ([""] if with_text else []) + [str(s.num_examples) for s in splits])
    lines += _table(rows) + [""]
    rows = [["split", "shards", "min bytes", "median bytes", "max bytes", "min records", "max records"]]
    for split in splits:
        sizes = [shard.num_bytes for shard in split.shards]
        counts = [shard.num_examples for shard in split.shards]
        rows.append([split.name, str(len(sizes)), f"{min(sizes):,}", f"{int(statistics.median(sizes)):,}",
                     f"{max(sizes):,}", str(min(counts)), str(max(counts))])
    lines += _table(rows) + [""]
    small = {name: raw.get("num_small", 0) for name, raw in info.manifest.get("splits", {}).items()}
    if any(small.values()):
        lines += [f"small images (a side under {record_schema.SMALL_SIDE} px; some training code fails on them, "
                  f"--min-side {record_schema.SMALL_SIDE} rejects them): "
                  + ", ".join(f"{name} {count}" for name, count in small.items() if count), ""]
    parquet = info.manifest.get("source_parquet")
    if parquet:
        files = parquet.get("files") or {}
        at = f" at revision {parquet['revision']}" if parquet.get("revision") else ""
        lines += [f"converted from a Hugging Face dataset{at}: {len(files)} Parquet file"
                  f"{'s' if len(files) != 1 else ''} (" + ", ".join(
                      f"{name} ({_dated(identity)})" for name, identity in list(files.items())[:5])
                  + (f" and {len(files) - 5} more" if len(files) > 5 else "") + ")", ""]
    archives = info.manifest.get("source_archives") or {}
    if archives:
        shown = [f"{name} ({_dated(identity)})" for name, identity in list(archives.items())[:5]]
        more = f" and {len(archives) - 5} more" if len(archives) > 5 else ""
        lines += [f"converted from {len(archives)} archive{'s' if len(archives) > 1 else ''} (records name images "
                  f"by their path in the extraction): " + ", ".join(shown) + more, ""]
    lines += _rejections(data_dir) + _skipped(info) + [""]
    lines += _duplicates(info)
    lines += [f"note: {work.describe()}" for work in kept_work(data_dir)]
    return "\n".join(lines)


def _dated(identity: str) -> str:
    """An archive's identity as the manifest records it ("N bytes, modified SECONDS") with the time as a date."""
    def date(match: re.Match) -> str:
        when = datetime.datetime.fromtimestamp(float(match.group(1)), datetime.timezone.utc)
        return "modified " + when.strftime("%Y-%m-%d %H:%M:%S UTC")
    return re.sub(r"modified (\d+(?:\.\d+)?)$", date, identity)


def _rejections(data_dir: str) -> list[str]:
    """Rejections by reason with a few paths each, streamed from the report (it may list millions)."""
    path = os.path.join(data_dir, record_schema.REJECTED_FILE)
    if not storage.exists(path):
        return ["rejected: no report"]
    counts: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    for raw in storage.iter_lines(path):
        if not raw.strip():
            continue
        entry = json.loads(raw)
        counts[entry["reason"]] += 1
        if len(examples[entry["reason"]]) < 3:
            examples[entry["reason"]].append(entry["path"])
    if not counts:
        return ["rejected: none"]
    lines = [f"rejected: {sum(counts.values())}"]
    for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {reason}: {count} ({', '.join(examples[reason])}{', ...' if count > 3 else ''})")
    return lines


def _skipped(info: DatasetInfo) -> list[str]:
    """Files the listing passed over without reading them (hidden, system, stray...), by reason."""
    by_reason = info.manifest.get("skipped_by_reason") or {}
    if not by_reason:
        return ["skipped without reading: none"]
    return [f"skipped without reading: {sum(by_reason.values())} ("
            + ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items())) + ")"]


def _duplicates(info: DatasetInfo) -> list[str]:
    duplicates = info.manifest.get("duplicates", {})
    lines = [f"identical images: {duplicates.get('num_duplicate_images', 0)} extra copies in "
             f"{duplicates.get('num_groups', 0)} groups"]
    for key, title in (("cross_label", "under two labels (label noise)"),
                       ("cross_split", "in two splits (train/test leakage)")):
        groups = duplicates.get(key, [])
        lines.append(f"  {title}: {duplicates.get('num_' + key, len(groups))}")
        for group in groups[:10]:
            lines.append("    " + "  =  ".join(f"{m['split']}/{m['label']}: {m['path']}" for m in group))
    return lines


def check_sheet_path(path: str) -> str:
    """Pillow's format for ``path``'s extension, checked before any work is done."""
    folder = os.path.dirname(path) or "."
    if not tf.io.gfile.isdir(folder):
        raise ValueError(f"cannot write the contact sheet {path}: the folder {folder} does not exist")
    extension = os.path.splitext(path)[1].lower()
    image_format = Image.registered_extensions().get(extension)
    if image_format not in ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF"):
        raise ValueError(f"cannot write the contact sheet {path}: name it .png (or .jpg, .webp)")
    return image_format


def contact_sheet(data_dir: str, path: str, split: Optional[str] = None, per_class: int = 8,
                  thumb: int = 96) -> str:
    """Write a PNG grid: one row per class, ``per_class`` sample images labelled with the class name.

    Rows are filled from the records in shard order, so a person can see at a
    glance that the images under each label are what the label says. The
    image format follows the extension of ``path`` (.png, .jpg, .webp...).

    Raises:
      ValueError: ``path``'s folder does not exist or its extension is not an image format.
    """
    image_format = check_sheet_path(path)
    info = dataset_info(data_dir)
    chosen = info.split(split or next(iter(info.splits)))
    samples = _samples(info, chosen.shards, per_class, thumb)
    fonts = LabelFonts()
    names = info.manifest.get("class_text") or list(info.classes)
    name_width = int(max(fonts.width(name) for name in names)) + 16
    sheet = Image.new("RGB", (name_width + per_class * (thumb + 4), info.num_classes * (thumb + 4)), "white")
    draw = ImageDraw.Draw(sheet)
    for label, name in enumerate(names):
        top = label * (thumb + 4)
        fonts.draw(draw, (4, top + thumb // 2 - 8), name)
        for column, image in enumerate(samples.get(label, [])):
            sheet.paste(image, (name_width + column * (thumb + 4), top))
    with tf.io.gfile.GFile(path, "wb") as handle:
        buffer = io.BytesIO()
        sheet.save(buffer, format=image_format)
        handle.write(buffer.getvalue())
    if fonts.missing:
        logger.warning("the contact sheet draws %s as boxes: no installed font has them. Install one that does "
                       "(for Chinese, Japanese and Korean, Debian's fonts-noto-cjk) and run inspect again",
                       " ".join(sorted(fonts.missing)))
    return path


def _samples(info: DatasetInfo, shards, per_class: int, thumb: int) -> dict[int, list[Image.Image]]:
    """Up to ``per_class`` thumbnails per label, from the records in shard order."""
    samples: dict[int, list[Image.Image]] = collections.defaultdict(list)
    for shard in shards:
        try:
            for data in iter_records(shard.path):
                example = tf.train.Example.FromString(data)
                label = example.features.feature[record_schema.LABEL].int64_list.value[0]
                if len(samples[label]) < per_class:
                    encoded = example.features.feature[record_schema.IMAGE_ENCODED].bytes_list.value[0]
                    image = Image.open(io.BytesIO(encoded)).convert("RGB")
                    image.thumbnail((thumb, thumb))
                    samples[label].append(image)
        except FrameError as err:
            raise ValueError(f"cannot draw the contact sheet: {err}. python -m converter verify {info.data_dir} "
                             "checks every shard") from None
        if all(len(samples[label]) >= per_class for label in range(info.num_classes)):
            break
    return samples


class LabelFonts:
    """Draws class names in any script the machine has a font for, character by character.

    Pillow's built-in font draws only Latin; DejaVu Sans (shipped with
    matplotlib, and with most Linux systems) adds accents, Greek and Cyrillic;
    any other installed font (``fc-list``) fills the rest, e.g. a CJK font for
    ``猫``. A character no installed font has is drawn as a box and listed in
    :attr:`missing`.
    """

    SIZE = 14

    def __init__(self) -> None:
        self._paths = _font_files()
        self._loaded: dict[str, ImageFont.FreeTypeFont] = {}
        self._by_char: dict[str, ImageFont.ImageFont] = {}
        self.missing: set[str] = set()

    def _font(self, path: str):
        if path not in self._loaded:
            self._loaded[path] = ImageFont.truetype(path, self.SIZE)
        return self._loaded[path]

    def for_char(self, char: str):
        """The first font that has a glyph for ``char`` (the first font at all if none has)."""
        if char not in self._by_char:
            chosen = None
            for path in self._paths:
                try:
                    font = self._font(path)
                except OSError:
                    continue
                if char.isspace() or _has_glyph(font, char):
                    chosen = font
                    break
            if chosen is None:
                self.missing.add(char)
                chosen = self._font(self._paths[0]) if self._paths else ImageFont.load_default(self.SIZE)
            self._by_char[char] = chosen
        return self._by_char[char]

    def width(self, text: str) -> float:
        return sum(self.for_char(char).getlength(char) for char in text)

    def draw(self, draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str) -> None:
        x, y = xy
        for char in text:
            font = self.for_char(char)
            draw.text((x, y), char, fill="black", font=font)
            x += font.getlength(char)


def _has_glyph(font, char: str) -> bool:
    """``font`` draws ``char`` as itself, not as its "missing glyph" box."""
    missing = font.getmask("\U0010fffd")  # a private-use code point: no font maps it
    mask = font.getmask(char)
    return not (mask.size == missing.size and bytes(mask) == bytes(missing))


@functools.lru_cache(maxsize=1)
def _font_files() -> tuple[str, ...]:
    """DejaVu Sans first (matplotlib's copy, else the system's), then every other font fontconfig knows."""
    paths = []
    try:
        import matplotlib

        paths.append(os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf", "DejaVuSans.ttf"))
    except ImportError:
        pass
    if shutil.which("fc-list"):
        listed = subprocess.run(["fc-list", "--format", "%{file}\n"], capture_output=True, text=True, timeout=30)
        files = sorted({line for line in listed.stdout.splitlines() if line.lower().endswith((".ttf", ".otf", ".ttc"))})
        paths += sorted(files, key=lambda f: (os.path.basename(f) != "DejaVuSans.ttf", f))
    return tuple(path for path in dict.fromkeys(paths) if os.path.exists(path))
