"""The report's figures counted in one pass over a dataset's records, in bounded memory.

In: each record's serialized ``tf.train.Example`` (features parsed, the image never decoded), split by split.
Out: :class:`SplitStats` per split: counters and fixed-size histograms whose size does not follow the number
of images (a 1M-image dataset costs what a 1k-image one does), and :meth:`SplitStats.to_json` for report.json.

Per-object and per-image numbers are gathered into short lists and folded into the histograms with numpy
every :data:`FLUSH` values, so the per-record cost stays a few dictionary reads (a Python loop per object
and a numpy call per record were each several times slower on detection datasets).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

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


def _floats(feature, key: str) -> list:
    value = feature.get(key)
    return list(value.float_list.value) if value is not None else []


def _ints(feature, key: str) -> list:
    value = feature.get(key)
    return list(value.int64_list.value) if value is not None else []


@dataclasses.dataclass
class SplitStats:
    """What one split's records hold, accumulated record by record (:meth:`add`), then :meth:`finish`-ed.

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

    def add(self, feature, task: str) -> list[int]:
        """Count one record (its parsed features); the class ids it holds (for the contact sheets)."""
        self.images += 1
        width = _first(_ints(feature, record_schema.WIDTH))
        height = _first(_ints(feature, record_schema.HEIGHT))
        encoded = feature.get(record_schema.IMAGE_ENCODED)
        self._images.append((width, height, len(encoded.bytes_list.value[0]) if encoded is not None else 0))
        image_format = feature.get(record_schema.IMAGE_FORMAT)
        self.formats[image_format.bytes_list.value[0] if image_format is not None else b"?"] += 1
        self.channels[_first(_ints(feature, record_schema.CHANNELS))] += 1
        if task == record_schema.TASK_OBJECTS:
            classes = self._add_objects(feature, width, height)
        elif task == record_schema.TASK_SEGMENTATION:
            classes = []  # per pixel, in the mask: not decoded here
        else:
            classes = _ints(feature, record_schema.LABEL)
            if task == record_schema.TASK_MULTILABEL:
                self.labels_per_image[len(classes)] += 1
        self.images_by_class.update(set(classes))
        if len(self._images) >= FLUSH or len(self._boxes) >= FLUSH:
            self._fold()
        return classes

    def _add_objects(self, feature, width: int, height: int) -> list[int]:
        labels = _ints(feature, record_schema.OBJECT_LABEL)
        self.objects_per_image[min(len(labels), MAX_OBJECTS_BIN)] += 1
        self.objects_by_class.update(labels)
        for key, counter in ((record_schema.OBJECT_IS_CROWD, self.crowd_by_class),
                             (record_schema.OBJECT_DIFFICULT, self.difficult_by_class)):
            flags = _ints(feature, key)
            if any(flags):
                counter.update(label for label, flag in zip(labels, flags) if flag)
        corners = [_floats(feature, key) for key in (record_schema.BBOX_XMIN, record_schema.BBOX_YMIN,
                                                             record_schema.BBOX_XMAX, record_schema.BBOX_YMAX)]
        self._boxes.extend((x0, y0, x1, y1, width, height) for x0, y0, x1, y1 in zip(*corners))
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

    def finish(self) -> SplitStats:
        """Fold what is left; the stats are complete."""
        self._fold()
        return self

    @property
    def num_objects(self) -> int:
        return sum(self.objects_by_class.values())

    def to_json(self) -> dict:
        """The split's figures as plain JSON values (bins with their edges, counters keyed by text)."""
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


def _first(values: list):
    return values[0] if values else 0


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
