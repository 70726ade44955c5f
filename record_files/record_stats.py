"""A split's figures as mergeable counters: what the report draws, summed per shard by the converter.

In: each record's values (size, encoded bytes, format, channels, class ids and, for objects, boxes), added one
record at a time by whoever holds them: the shard writer (``beam_jobs.stages.write``, from what it is writing)
or the report's scan of a dataset written before records tables (``reader.tools.report_stats``, from parsed features).
Out: :class:`SplitStats`: counters and fixed-size histograms whose size does not follow the number of images
(a 1M-image split costs what a 1k-image one does); :meth:`SplitStats.merge` sums two (a split's shards into the
split); :meth:`SplitStats.to_json` is both the report's figures and the form a records table's footer keeps
(:mod:`record_files.records_table`), which :meth:`SplitStats.from_json` reads back exactly.

Imports numpy only, never TensorFlow or Beam: the converter's workers and the reader share it, so the figures
summed at conversion are the scan's, number for number (``tests/reader/tools/test_report.py`` compares both).
Per-object and per-image numbers are gathered into short lists and folded into the histograms with numpy
every :data:`FLUSH` values, so the per-record cost stays a few appends.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np

import record_schema

FLUSH = 65536  # values gathered before they are folded into the histograms
MAX_OBJECTS_BIN = 50  # objects an image: 0..49 counted each, 50 for "50 or more"
SIDE_BINS = np.round(2.0 ** np.arange(3, 14.01, 0.25)).astype(int)  # 8 px .. 16,384 px, four bins an octave
# Box width / height, about 1/16 .. 16, four bins an octave, each centred on its power of 2^(1/4) (1, a square,
# in the middle of a bin: float32 boxes put a square a hair either side of 1).
ASPECT_BINS = 2.0 ** (np.arange(-16.5, 16.6, 1.0) / 4)
CENTRE_GRID = 32  # the heat map of box centres: 32 x 32 cells of the normalized image
BYTES_BINS = np.round(2.0 ** np.arange(10, 26.01, 0.5)).astype(int)  # 1 KiB .. 64 MiB per encoded image
# COCO's object sizes: area in pixels (of the stored image) under 32^2 is small, under 96^2 medium, else large.
SMALL_AREA, MEDIUM_AREA = 32 ** 2, 96 ** 2
SIZE_NAMES = ("small", "medium", "large")


@dataclasses.dataclass(frozen=True)
class ObjectValues:
    """One image's objects as its record holds them: class ids, crowd and difficult flags, and the normalized
    box corners as float32 values (the record's floats: the writer rounds its boxes so, and the figures of the
    boxes then fall in the bins a scan of the record puts them in)."""

    labels: Sequence[int]
    crowd: Sequence[int]
    difficult: Sequence[int]
    xmin: Sequence[float]
    ymin: Sequence[float]
    xmax: Sequence[float]
    ymax: Sequence[float]


@dataclasses.dataclass
class SplitStats:
    """What one split's records hold, accumulated record by record (:meth:`add_image`), then :meth:`finish`-ed.

    ``images_by_class``: images holding a class (classification: its label; multi-label: each of its labels;
    objects: each class among its objects). Objects only: ``objects_by_class``, ``crowd_by_class``,
    ``difficult_by_class``, ``objects_per_image``, ``box_sizes`` (COCO's small/medium/large of box area in
    pixels of the stored image), ``aspect_counts`` (over :data:`ASPECT_BINS`), ``centres`` (a
    :data:`CENTRE_GRID` square of box centres, row 0 at the top). Every split: ``sides`` (a 2-D histogram of
    width by height over :data:`SIDE_BINS`), ``encoded_bytes`` (over :data:`BYTES_BINS`), ``formats``,
    ``channels``; multi-label: ``labels_per_image``.
    """

    name: str
    images: int = 0
    images_by_class: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    objects_by_class: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    crowd_by_class: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    difficult_by_class: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    objects_per_image: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    labels_per_image: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    box_sizes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    formats: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    channels: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    aspect_counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(ASPECT_BINS) + 1, np.int64))
    centres: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((CENTRE_GRID, CENTRE_GRID), np.int64))
    sides: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros((len(SIDE_BINS) + 1, len(SIDE_BINS) + 1), np.int64))
    encoded_bytes: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(BYTES_BINS) + 1, np.int64))
    min_side: Optional[int] = None
    max_side: Optional[int] = None
    _images: list = dataclasses.field(default_factory=list, repr=False)  # (width, height, bytes) not yet folded
    _boxes: list = dataclasses.field(default_factory=list, repr=False)  # (x0, y0, x1, y1, width, height)

    def add_image(self, width: int, height: int, encoded_bytes: int, image_format: bytes, channels: int,
                  task: str, classes: Sequence[int] = (), objects: Optional[ObjectValues] = None) -> None:
        """Count one record: its stored size, its image's bytes and format, and what it labels.

        ``classes``: a classification record's label, a multi-label record's labels (a segmentation record's
        are in its mask: none). ``objects``: an object record's (``task`` objects), whose class ids count.
        """
        self.images += 1
        self._images.append((width, height, encoded_bytes))
        self.formats[image_format] += 1
        self.channels[channels] += 1
        if task == record_schema.TASK_OBJECTS:
            classes = self._add_objects(objects, width, height) if objects is not None else []
            if objects is None:
                self.objects_per_image[0] += 1
        elif task == record_schema.TASK_MULTILABEL:
            self.labels_per_image[len(classes)] += 1
        self.images_by_class.update(set(classes))
        if len(self._images) >= FLUSH or len(self._boxes) >= FLUSH:
            self._fold()

    def _add_objects(self, objects: ObjectValues, width: int, height: int) -> Sequence[int]:
        labels = objects.labels
        self.objects_per_image[min(len(labels), MAX_OBJECTS_BIN)] += 1
        self.objects_by_class.update(labels)
        for flags, counter in ((objects.crowd, self.crowd_by_class), (objects.difficult, self.difficult_by_class)):
            if any(flags):
                counter.update(label for label, flag in zip(labels, flags) if flag)
        self._boxes.extend((x0, y0, x1, y1, width, height)
                           for x0, y0, x1, y1 in zip(objects.xmin, objects.ymin, objects.xmax, objects.ymax))
        return labels

    def _fold(self) -> None:
        """The gathered values into the histograms (numpy, a few calls for thousands of values)."""
        if self._images:
            values = np.asarray(self._images, np.int64)
            widths, heights, sizes = values[:, 0], values[:, 1], values[:, 2]
            np.add.at(self.sides, (np.searchsorted(SIDE_BINS, widths, "right"),
                                   np.searchsorted(SIDE_BINS, heights, "right")), 1)
            np.add.at(self.encoded_bytes, np.searchsorted(BYTES_BINS, sizes, "right"), 1)
            sides = np.minimum(widths, heights)
            low, high = int(sides.min()), int(np.maximum(widths, heights).max())
            self.min_side = low if self.min_side is None else min(self.min_side, low)
            self.max_side = high if self.max_side is None else max(self.max_side, high)
            self._images = []
        if self._boxes:
            boxes = np.asarray(self._boxes, np.float64)
            box_w = (boxes[:, 2] - boxes[:, 0]) * boxes[:, 4]
            box_h = (boxes[:, 3] - boxes[:, 1]) * boxes[:, 5]
            area = box_w * box_h
            sizes = np.searchsorted([SMALL_AREA, MEDIUM_AREA], area, "left")
            for index, count in enumerate(np.bincount(sizes, minlength=3)):
                self.box_sizes[SIZE_NAMES[index]] += int(count)
            aspect = np.divide(box_w, box_h, out=np.full_like(box_w, np.inf), where=box_h > 0)
            np.add.at(self.aspect_counts, np.searchsorted(ASPECT_BINS, aspect, "right"), 1)
            cx = np.clip(((boxes[:, 0] + boxes[:, 2]) / 2 * CENTRE_GRID).astype(int), 0, CENTRE_GRID - 1)
            cy = np.clip(((boxes[:, 1] + boxes[:, 3]) / 2 * CENTRE_GRID).astype(int), 0, CENTRE_GRID - 1)
            np.add.at(self.centres, (cy, cx), 1)
            self._boxes = []

    def finish(self) -> "SplitStats":
        """Fold what is left; the stats are complete."""
        self._fold()
        return self

    def merge(self, other: "SplitStats") -> "SplitStats":
        """Add ``other``'s counts (another shard of the split) into these; both are finished first."""
        self.finish()
        other.finish()
        self.images += other.images
        for name in ("images_by_class", "objects_by_class", "crowd_by_class", "difficult_by_class",
                     "objects_per_image", "labels_per_image", "box_sizes", "formats", "channels"):
            getattr(self, name).update(getattr(other, name))
        for name in ("aspect_counts", "centres", "sides", "encoded_bytes"):
            getattr(self, name).__iadd__(getattr(other, name))
        sides = [side for side in (self.min_side, other.min_side) if side is not None]
        self.min_side = min(sides) if sides else None
        sides = [side for side in (self.max_side, other.max_side) if side is not None]
        self.max_side = max(sides) if sides else None
        return self

    @property
    def num_objects(self) -> int:
        return sum(self.objects_by_class.values())

    def to_json(self) -> dict:
        """The split's figures as plain JSON values (bins with their edges, counters keyed by text)."""
        self.finish()
        return {
            "images": self.images,
            "images_by_class": _keyed(self.images_by_class),
            "formats": {name.decode("ascii", "replace"): count for name, count in sorted(self.formats.items())},
            "channels": _keyed(self.channels),
            "min_side": self.min_side,
            "max_side": self.max_side,
            "sides": {"edges_px": SIDE_BINS.tolist(), "width_by_height": _trimmed(self.sides)},
            "encoded_bytes": {"edges": BYTES_BINS.tolist(), "counts": self.encoded_bytes.tolist()},
            **({"labels_per_image": _keyed(self.labels_per_image)} if self.labels_per_image else {}),
            **({"objects": {
                "total": self.num_objects,
                "by_class": _keyed(self.objects_by_class),
                "crowd_by_class": _keyed(self.crowd_by_class),
                "difficult_by_class": _keyed(self.difficult_by_class),
                "per_image": _keyed(self.objects_per_image),
                "per_image_last_bin_means_at_least": MAX_OBJECTS_BIN,
                "box_sizes": {name: self.box_sizes[name] for name in SIZE_NAMES},
                "box_size_areas_px": {"small_below": SMALL_AREA, "medium_below": MEDIUM_AREA},
                "aspect_ratio": {"edges": [round(float(edge), 4) for edge in ASPECT_BINS],
                                 "counts": self.aspect_counts.tolist()},
                "centres": {"grid": CENTRE_GRID, "rows_top_down": self.centres.tolist()},
            }} if self.objects_per_image else {}),
        }

    @classmethod
    def from_json(cls, name: str, data: dict) -> "SplitStats":
        """The stats :meth:`to_json` gave, back (a records table keeps its split's so).

        Raises:
          ValueError: ``data`` was made with other bins than these (another release's), or is not such a dict.
        """
        try:
            if data["sides"]["edges_px"] != SIDE_BINS.tolist() or data["encoded_bytes"]["edges"] != BYTES_BINS.tolist():
                raise ValueError("its histograms have other bins than this reader's")
            stats = cls(name, images=int(data["images"]), min_side=data["min_side"], max_side=data["max_side"])
            stats.images_by_class.update(_counted(data["images_by_class"]))
            stats.formats.update({key.encode("ascii"): int(count) for key, count in data["formats"].items()})
            stats.channels.update(_counted(data["channels"]))
            stats.labels_per_image.update(_counted(data.get("labels_per_image", {})))
            grid = data["sides"]["width_by_height"]
            if grid["counts"]:
                (top, left), counts = grid["first"], np.asarray(grid["counts"], np.int64)
                stats.sides[top:top + counts.shape[0], left:left + counts.shape[1]] = counts
            stats.encoded_bytes[:] = data["encoded_bytes"]["counts"]
            objects = data.get("objects")
            if objects:
                stats.objects_by_class.update(_counted(objects["by_class"]))
                stats.crowd_by_class.update(_counted(objects["crowd_by_class"]))
                stats.difficult_by_class.update(_counted(objects["difficult_by_class"]))
                stats.objects_per_image.update(_counted(objects["per_image"]))
                stats.box_sizes.update({name: int(objects["box_sizes"][name]) for name in SIZE_NAMES})
                stats.aspect_counts[:] = objects["aspect_ratio"]["counts"]
                stats.centres[:] = objects["centres"]["rows_top_down"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not the figures of a split ({err})") from None
        return stats


def _counted(keyed: dict) -> dict[int, int]:
    return {int(key): int(count) for key, count in keyed.items()}


def _keyed(counter: collections.Counter) -> dict[str, int]:
    return {str(key): int(count) for key, count in sorted(counter.items())}


def _trimmed(grid: np.ndarray) -> dict:
    """A 2-D histogram without its empty outer rows and columns: ``{"first": [row, col], "counts": [[...]]}``."""
    rows, cols = np.nonzero(grid)
    if not len(rows):
        return {"first": [0, 0], "counts": []}
    top, left = int(rows.min()), int(cols.min())
    return {"first": [top, left], "counts": grid[top:rows.max() + 1, left:cols.max() + 1].tolist()}


def side_label(index: int) -> str:
    """The range of a :data:`SIDE_BINS` histogram index, in pixels, as text."""
    if index == 0:
        return f"< {SIDE_BINS[0]}"
    if index >= len(SIDE_BINS):
        return f">= {SIDE_BINS[-1]}"
    return f"{SIDE_BINS[index - 1]}-{SIDE_BINS[index] - 1}"
