"""What the conversion wrote beside the shards, read for the report: rejections, duplicate groups, source files.

In: ``rejected.jsonl`` (``{"path", "reason", "detail"[, "annotation"]}`` a line), ``duplicates.jsonl`` (a group
a line: ``{"kind": "exact" | "near", "images": [{"split", "label", "path"[, "distance"]}, ...]}``, or, as
written before near-duplicates, a JSON list of an exact group's images), and the source images of the first
few rejections (read from ``SRC/<path>`` when that is still readable).
Out: :class:`Rejections` and :class:`Duplicates`: counts over every line, streamed (a report may list
millions), and the first few lines kept to show; :func:`source_thumbnail`.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import logging
import os
from typing import Optional

from PIL import Image

from reader import storage

logger = logging.getLogger(__name__)

MAX_SOURCE_BYTES = 64 << 20  # a rejected source larger than this is not read for its thumbnail
MAX_SOURCE_PIXELS = 50_000_000  # nor decoded when it declares more pixels (a decompression bomb, often)


@dataclasses.dataclass(frozen=True)
class Rejections:
    """rejected.jsonl counted: images refused by reason, objects refused by reason (their image was written
    without them), and the first ``keep`` lines as written (``None``: the dataset has no such report)."""

    images_by_reason: dict[str, int]
    objects_by_reason: dict[str, int]
    first: tuple[dict, ...]
    present: bool = True

    def to_json(self) -> dict:
        return {"present": self.present, "images_by_reason": self.images_by_reason,
                "objects_by_reason": self.objects_by_reason, "first": list(self.first)}


def read_rejections(path: str, keep: int) -> Rejections:
    """Stream ``path`` (rejected.jsonl); a missing file is an empty :class:`Rejections` with ``present`` False.

    Raises:
      ValueError: a line that is not JSON, naming the file and the line.
    """
    if not storage.exists(path):
        return Rejections({}, {}, (), present=False)
    images: collections.Counter[str] = collections.Counter()
    objects: collections.Counter[str] = collections.Counter()
    first = []
    for number, entry in _json_lines(path):
        if not isinstance(entry, dict) or "reason" not in entry:
            raise ValueError(f"{path} line {number}: not a rejection ({{\"path\", \"reason\", \"detail\"}})")
        (objects if entry.get("annotation") else images)[entry["reason"]] += 1
        if len(first) < keep:
            first.append(entry)
    return Rejections(dict(images.most_common()), dict(objects.most_common()), tuple(first))


@dataclasses.dataclass(frozen=True)
class Duplicates:
    """duplicates.jsonl counted and sampled.

    ``groups``: ``{kind: {"within_split": n, "across_splits": n}}``; ``extra_images``: images beyond each
    group's first, per kind (what removing the copies would remove); ``across_labels``: groups whose images
    carry two labels; ``shown``: the first ``keep`` groups of each kind and scope, as normalized groups
    (``{"kind", "across_splits", "images": [{"split", "label", "path", "distance"}]}``).
    """

    groups: dict[str, dict[str, int]]
    extra_images: dict[str, int]
    across_labels: int
    shown: tuple[dict, ...]
    present: bool = True

    def to_json(self) -> dict:
        return {"present": self.present, "groups": self.groups, "extra_images": self.extra_images,
                "across_labels": self.across_labels, "shown": list(self.shown)}


def read_duplicates(path: str, keep: int) -> Duplicates:
    """Stream ``path`` (duplicates.jsonl, either layout); a missing file is an empty, not ``present``, result.

    Raises:
      ValueError: a line that is neither layout, naming the file and the line.
    """
    if not storage.exists(path):
        return Duplicates({}, {}, 0, (), present=False)
    groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    extra: collections.Counter[str] = collections.Counter()
    shown_by: collections.Counter[tuple[str, bool]] = collections.Counter()
    across_labels, shown = 0, []
    for number, entry in _json_lines(path):
        group = normalized_group(entry, f"{path} line {number}")
        kind, images = group["kind"], group["images"]
        across = group["across_splits"]
        groups[kind]["across_splits" if across else "within_split"] += 1
        extra[kind] += len(images) - 1
        across_labels += len({image["label"] for image in images}) > 1
        if shown_by[kind, across] < keep:
            shown_by[kind, across] += 1
            shown.append(group)
    return Duplicates({kind: {"within_split": counts["within_split"], "across_splits": counts["across_splits"]}
                       for kind, counts in sorted(groups.items())}, dict(sorted(extra.items())), across_labels,
                      tuple(shown))


def normalized_group(entry, where: str) -> dict:
    """A line of duplicates.jsonl as ``{"kind", "across_splits", "images"}``, each image with a ``distance``
    (0 for an exact group's, and for the first image of a near group).

    Raises:
      ValueError: ``entry`` is neither a list of images nor ``{"kind", "images"}`` (``where`` names the line).
    """
    if isinstance(entry, list):
        kind, images = "exact", entry
    elif isinstance(entry, dict) and isinstance(entry.get("images"), list):
        kind, images = str(entry.get("kind", "exact")), entry["images"]
    else:
        raise ValueError(f"{where}: not a duplicate group (a list of images, or {{\"kind\", \"images\"}})")
    if len(images) < 2 or not all(isinstance(image, dict) and "path" in image for image in images):
        raise ValueError(f"{where}: a duplicate group needs two or more images, each with a \"path\"")
    images = [{"split": str(image.get("split", "")), "label": image.get("label", ""), "path": str(image["path"]),
               "distance": image.get("distance", 0)} for image in images]
    return {"kind": kind, "across_splits": len({image["split"] for image in images}) > 1, "images": images}


def _json_lines(path: str):
    """``(line number, parsed JSON)`` of each non-blank line of ``path``."""
    for number, raw in enumerate(storage.iter_lines(path), start=1):
        if not raw.strip():
            continue
        try:
            yield number, json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number}: not JSON ({err.msg})") from None


def source_thumbnail(src: Optional[str], relpath: str, side: int) -> tuple[Optional[Image.Image], str]:
    """A rejected image as it is in the source, fitted into ``side`` pixels, or None and why not.

    The dataset keeps no copy of what it rejected: the file is read again from ``SRC/<relpath>`` (the
    manifest's ``options.src``), which may have moved since, sit inside an archive, or not decode at all
    (often the reason it was rejected).
    """
    if not src:
        return None, "the manifest does not name the source folder"
    where = relpath if os.path.isabs(relpath) or "://" in relpath else os.path.join(src, relpath)
    try:
        if not storage.exists(where):
            return None, f"not readable at {where} (moved since, or inside an archive)"
        if storage.size(where) > MAX_SOURCE_BYTES:
            return None, f"{where} is larger than {MAX_SOURCE_BYTES >> 20} MiB: not read for a thumbnail"
        data = storage.read_bytes(where)
    except Exception as err:  # noqa: BLE001 (any file system's error: the report says it and goes on)
        return None, f"not readable at {where} ({type(err).__name__})"
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_SOURCE_PIXELS:
                return None, f"{where} is {image.width} x {image.height} pixels: not decoded for a thumbnail"
            image.draft("RGB", (side, side))
            thumb = image.convert("RGB")
            thumb.thumbnail((side, side))
            return thumb, f"{where}"
    except Exception as err:  # noqa: BLE001 (rejected images are often undecodable: that is the point)
        return None, f"{where} does not decode as an image ({type(err).__name__})"
