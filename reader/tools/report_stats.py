"""The report's figures of a dataset written before records tables, counted in one pass over its records.

In: each record's serialized ``tf.train.Example`` (features parsed, the image never decoded), split by split.
Out: :class:`SplitStats` per split, the counters and fixed-size histograms of
:mod:`record_files.record_stats` (the converter sums the same ones per shard into each split's records table,
so a dataset that has one is never scanned): :meth:`SplitStats.add` takes a record's parsed features.
"""

from __future__ import annotations

import record_schema
from record_files import record_stats
from record_files.record_stats import (ASPECT_BINS, BYTES_BINS, CENTRE_GRID, FLUSH, MAX_OBJECTS_BIN,  # noqa: F401
                                       MEDIUM_AREA, SIDE_BINS, SIZE_NAMES, SMALL_AREA, ObjectValues, side_label)


def _floats(feature, key: str) -> list:
    value = feature.get(key)
    return list(value.float_list.value) if value is not None else []


def _ints(feature, key: str) -> list:
    value = feature.get(key)
    return list(value.int64_list.value) if value is not None else []


class SplitStats(record_stats.SplitStats):
    """:class:`record_files.record_stats.SplitStats`, counted from parsed records (a scan)."""

    def add(self, feature, task: str) -> list[int]:
        """Count one record (its parsed features); the class ids it holds (for the contact sheets)."""
        width = _first(_ints(feature, record_schema.WIDTH))
        height = _first(_ints(feature, record_schema.HEIGHT))
        encoded = feature.get(record_schema.IMAGE_ENCODED)
        image_format = feature.get(record_schema.IMAGE_FORMAT)
        objects = None
        if task == record_schema.TASK_OBJECTS:
            objects = ObjectValues(*(_ints(feature, key) for key in (
                record_schema.OBJECT_LABEL, record_schema.OBJECT_IS_CROWD, record_schema.OBJECT_DIFFICULT)),
                *(_floats(feature, key) for key in (record_schema.BBOX_XMIN, record_schema.BBOX_YMIN,
                                                    record_schema.BBOX_XMAX, record_schema.BBOX_YMAX)))
            classes = list(objects.labels)
        elif task == record_schema.TASK_SEGMENTATION:
            classes = []  # per pixel, in the mask: not decoded here
        else:
            classes = _ints(feature, record_schema.LABEL)
        self.add_image(width, height, len(encoded.bytes_list.value[0]) if encoded is not None else 0,
                       image_format.bytes_list.value[0] if image_format is not None else b"?",
                       _first(_ints(feature, record_schema.CHANNELS)), task, classes, objects)
        return classes


def _first(values: list):
    return values[0] if values else 0
