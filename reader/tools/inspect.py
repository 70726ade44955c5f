"""``inspect``: what a converted dataset holds, for a person to read, and a contact sheet to look at."""

from __future__ import annotations

import collections
import datetime
import io
import itertools
import json
import logging
import os
import re
import statistics
from typing import Optional

import tensorflow as tf
from PIL import Image

import record_schema
from reader import storage
from reader.frames import extent_records, iter_records
from reader.tools.contact_sheet import draw_sheet
from reader.info import DatasetInfo, SplitInfo, dataset_info, kept_work, latest_version
from record_files import versions

logger = logging.getLogger(__name__)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in rows]


def summarize(data_dir: str, version: Optional[int] = None) -> str:
    """Classes by split with counts, shard sizes, bytes, rejections by reason, and content duplicates (of the
    latest version, or of ``version``)."""
    info = dataset_info(data_dir, version=version)
    splits = list(info.splits.values())
    # Objects: ids the dataset leaves unnamed (0, the background; COCO's gaps) are no classes, and the counts
    # by class are of objects, so the totals are objects too, with the images on a line of their own.
    objects = info.task == record_schema.TASK_OBJECTS
    named = [label for label, name in enumerate(info.classes) if name or not objects]
    # Objects: a named class no split holds an object of (VOC's 20 on a set of a few) is one line, not a row of 0s.
    empty = [label for label in named if objects and all(s.label_counts and not s.label_counts[label] for s in splits)]
    lines = [f"{versions.named(data_dir, info.version, latest_version(data_dir))}: {len(named)} classes, "
             f"{sum(s.num_examples for s in splits)} images, {sum(s.num_bytes for s in splits):,} bytes", ""]
    text = info.manifest.get("class_text") or list(info.classes)
    with_text = list(text) != list(info.classes)  # --synsets: each class's text beside its id
    rows = [["label", "class"] + (["text"] if with_text else []) + [s.name for s in splits]]
    for label in (label for label in named if label not in empty):
        rows.append([str(label), info.classes[label]] + ([text[label]] if with_text else [])
                    + [str(s.label_counts[label]) if s.label_counts else "?" for s in splits])
    if objects:
        rows.append(["", "objects"] + ([""] if with_text else [])
                    + [str(sum(s.label_counts)) if s.label_counts else "?" for s in splits])
    rows.append(["", "images" if objects else "total"] + ([""] if with_text else [])
                + [str(s.num_examples) for s in splits])
    lines += _table(rows) + ([f"({len(empty)} class{'es' if len(empty) > 1 else ''} without objects: "
                              + ", ".join(info.classes[label] for label in empty[:10])
                              + (" ..." if len(empty) > 10 else "") + ")"] if empty else []) + [""]
    rows = [["split", "shards", "min bytes", "median bytes", "max bytes", "min records", "max records"]]
    for split in splits:
        # a masked shard is listed once per live run (an extent): the table is of files, records are live ones
        sizes, live = {}, collections.Counter()
        for shard in split.shards:
            sizes[shard.path] = shard.num_bytes
            live[shard.path] += shard.num_examples
        sizes, counts = list(sizes.values()), list(live.values())
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
    lines += _keypoints_and_captions(info)
    lines += _rejections(info) + _skipped(info) + [""]
    lines += _duplicates(info)
    lines += [f"note: {work.describe()}" for work in kept_work(data_dir)]
    return "\n".join(lines)


def _dated(identity: str) -> str:
    """An archive's identity as the manifest records it ("N bytes, modified SECONDS") with the time as a date."""
    def date(match: re.Match) -> str:
        when = datetime.datetime.fromtimestamp(float(match.group(1)), datetime.timezone.utc)
        return "modified " + when.strftime("%Y-%m-%d %H:%M:%S UTC")
    return re.sub(r"modified (\d+(?:\.\d+)?)$", date, identity)


SCANNED = 1000  # records a split's keypoints and captions are counted over (COCO's photos: ~160 MB read)


def _keypoints_and_captions(info: DatasetInfo) -> list[str]:
    """The points each object holds (K, names, flip: the manifest's ``keypoints``) and the captions, with what the
    records hold of them by split: objects with labelled points, images with captions and one caption. The
    manifest counts neither, so the first :data:`SCANNED` records of each split are read (a split of more says
    so): inspect stays a second's work on COCO's 118k photos."""
    features = info.manifest.get("features") or {}
    points = record_schema.KEYPOINT_NUM in features
    captions = record_schema.CAPTION in features
    if not points and not captions:
        return []
    lines = []
    if points:
        names, flip = info.keypoint_names, info.keypoint_flip
        lines.append(f"keypoints: {len(names)} points an object ({', '.join(names)}); "
                     + (f"a flip swaps them as {' '.join(map(str, flip))} (the manifest's, from their names)" if flip
                        else "no flip (no two names pair as left and right): a training flip keeps each point's "
                             "place unless ObjectTargets(keypoint_flip=...) gives one"))
    counted = {split.name: _count_extras(split, points, captions) for split in info.splits.values()}
    if points:
        lines.append("  objects with labelled keypoints: " + ", ".join(
            f"{name} {c.keypoint_objects:,} of {c.objects:,} ({c.points:,} points labelled){c.of}"
            for name, c in counted.items()))
    if captions:
        example = next((c.example for c in counted.values() if c.example), "")
        lines.append("captions: " + ", ".join(
            f"{name} {c.captions:,} on {c.captioned:,} of {c.images:,} images{c.of}" for name, c in counted.items())
            + (f"; e.g. {example!r}" if example else ""))
    return lines + [""]


class _Extras:
    """What :func:`_count_extras` counts of a split's first records."""

    def __init__(self, split: SplitInfo) -> None:
        self.images = self.objects = self.keypoint_objects = self.points = self.captions = self.captioned = 0
        self.example = ""
        self.total = split.num_examples

    @property
    def of(self) -> str:
        return f" in its first {self.images:,} of {self.total:,} images" if self.images < self.total else ""


def _count_extras(split: SplitInfo, points: bool, captions: bool) -> _Extras:
    """Objects with labelled points (``keypoint/num`` > 0) and captions in the first :data:`SCANNED` records,
    parsed 100 at a time (a photo's record is its JPEG: 1,000 of COCO's held at once would be 160 MB)."""
    spec = {}
    if points:
        spec[record_schema.KEYPOINT_NUM] = tf.io.RaggedFeature(tf.int64)
    if captions:
        spec[record_schema.CAPTION] = tf.io.RaggedFeature(tf.string)
    counted, batch = _Extras(split), []
    records = (record for shard in split.shards for record in (  # a masked split: each extent's live records only
        iter_records(shard.path) if shard.whole else
        extent_records(shard.path, shard.index_path, shard.first, shard.num_examples)))
    for record in itertools.islice(records, SCANNED):
        batch.append(record)
        if len(batch) == 100:
            _count_batch(counted, batch, spec)
            batch = []
    if batch:
        _count_batch(counted, batch, spec)
    return counted


def _count_batch(counted: _Extras, batch: list[bytes], spec: dict) -> None:
    counted.images += len(batch)
    parsed = tf.io.parse_example(tf.constant(batch), spec)
    if record_schema.KEYPOINT_NUM in parsed:
        num = parsed[record_schema.KEYPOINT_NUM].flat_values.numpy()
        counted.objects += len(num)
        counted.keypoint_objects += int((num > 0).sum())
        counted.points += int(num.sum())
    if record_schema.CAPTION in parsed:
        texts = parsed[record_schema.CAPTION]
        lengths = texts.row_lengths().numpy()
        counted.captions += int(lengths.sum())
        counted.captioned += int((lengths > 0).sum())
        if not counted.example and len(texts.flat_values):
            counted.example = texts.flat_values[0].numpy().decode("utf-8", errors="replace")


def _rejections(info: DatasetInfo) -> list[str]:
    """Rejections by reason with a few paths each, streamed from the version's report (it may list millions)."""
    path = info.version_file(record_schema.REJECTED_FILE)
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
    if duplicates.get("near_threshold") is not None:  # None: converted with --no-near-duplicates, or before #48
        lines.append(f"near-duplicates (within {duplicates['near_threshold']} bits): "
                     f"{duplicates.get('num_near_within_split', 0)} groups within a split, "
                     f"{duplicates.get('num_near_cross_split', 0)} across splits (leakage)")
    if duplicates.get("num_dropped"):
        lines.append(f"  left out of the evaluation splits (--drop-leaks): {duplicates['num_dropped']}")
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
                  thumb: int = 96, version: Optional[int] = None) -> str:
    """Write a contact sheet of ``split`` (default: the first) to ``path``, drawn as its task labels it.

    Classification: one row per class, ``per_class`` sample images labelled
    with the class name, so a person can see at a glance that the images under
    each label are what the label says. Objects, segmentation and multi-label:
    ``per_class`` columns of records (``2 * thumb`` pixels a side) with their
    boxes and class names, class mask, or class names drawn
    (:mod:`reader.tools.contact_sheet`). The image format follows the extension of
    ``path`` (.png, .jpg, .webp...).

    Raises:
      ValueError: ``path``'s folder does not exist or its extension is not an image format; a shard is damaged.
    """
    image_format = check_sheet_path(path)
    info = dataset_info(data_dir, version=version)
    sheet, missing = draw_sheet(info, info.split(split or next(iter(info.splits))), per_class, thumb)
    with tf.io.gfile.GFile(path, "wb") as handle:
        buffer = io.BytesIO()
        sheet.save(buffer, format=image_format)
        handle.write(buffer.getvalue())
    if missing:
        logger.warning("the contact sheet draws %s as boxes: no installed font has them. Install one that does "
                       "(for Chinese, Japanese and Korean, Debian's fonts-noto-cjk) and run inspect again",
                       " ".join(sorted(missing)))
    return path
