"""``inspect``: what a converted dataset holds, for a person to read, and a contact sheet to look at."""

from __future__ import annotations

import collections
import io
import json
import os
import statistics
from typing import Optional

import tensorflow as tf
from PIL import Image, ImageDraw

import record_schema
from reader import storage
from reader.info import DatasetInfo, dataset_info
from reader.verify import iter_records


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
    rows = [["class"] + [s.name for s in splits]]
    for label, name in enumerate(info.classes):
        rows.append([name] + [str(s.label_counts[label]) if s.label_counts else "?" for s in splits])
    rows.append(["total"] + [str(s.num_examples) for s in splits])
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
    lines += _rejections(data_dir) + [""]
    lines += _duplicates(info)
    return "\n".join(lines)


def _rejections(data_dir: str) -> list[str]:
    path = os.path.join(data_dir, record_schema.REJECTED_FILE)
    if not storage.exists(path):
        return ["rejected: no report"]
    entries = [json.loads(line) for line in storage.read_bytes(path).decode("utf-8").splitlines() if line.strip()]
    if not entries:
        return ["rejected: none"]
    by_reason = collections.defaultdict(list)
    for entry in entries:
        by_reason[entry["reason"]].append(entry["path"])
    lines = [f"rejected: {len(entries)}"]
    for reason, paths in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        examples = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
        lines.append(f"  {reason}: {len(paths)} ({examples})")
    return lines


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
    samples: dict[int, list[Image.Image]] = collections.defaultdict(list)
    for shard in chosen.shards:
        for data in iter_records(shard.path):
            example = tf.train.Example.FromString(data)
            label = example.features.feature[record_schema.LABEL].int64_list.value[0]
            if len(samples[label]) < per_class:
                image = Image.open(io.BytesIO(example.features.feature[record_schema.IMAGE_ENCODED].bytes_list.value[0]))
                image = image.convert("RGB")
                image.thumbnail((thumb, thumb))
                samples[label].append(image)
        if all(len(samples[label]) >= per_class for label in range(info.num_classes)):
            break
    name_width = 8 * max(len(name) for name in info.classes) + 16
    sheet = Image.new("RGB", (name_width + per_class * (thumb + 4), info.num_classes * (thumb + 4)), "white")
    draw = ImageDraw.Draw(sheet)
    for label, name in enumerate(info.classes):
        top = label * (thumb + 4)
        draw.text((4, top + thumb // 2 - 6), name, fill="black")
        for column, image in enumerate(samples.get(label, [])):
            sheet.paste(image, (name_width + column * (thumb + 4), top))
    with tf.io.gfile.GFile(path, "wb") as handle:
        buffer = io.BytesIO()
        sheet.save(buffer, format=image_format)
        handle.write(buffer.getvalue())
    return path
