"""The Hub's annotation columns: objects (cppe-5's ``objects``) and several labels (``Sequence(ClassLabel)``).

In:  a Parquet or Arrow file's Hub features (its ``huggingface`` metadata), and each row's cell.
Out: which column holds the annotations (:class:`AnnotationColumn`), and each row's
     :data:`beam_jobs.annotations.Annotation`.

What the Hub's object-detection datasets hold (the HF task guide's cppe-5): ``objects``, a Sequence (a
``List`` in datasets 4 and later) of ``{id, area, bbox, category}`` with ``category`` a ClassLabel, and
``bbox`` ``[x, y, width, height]`` in pixels (COCO's convention, ``--bbox-format coco``); datasets that
say otherwise are read with ``--bbox-format pascal_voc`` (``[xmin, ymin, xmax, ymax]`` pixels) or
``yolo`` (``[cx, cy, w, h]`` normalized). Arrow stores such a column as a struct of lists or a list of
structs; both read the same. Class ids are the ClassLabel's, as for one label.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from beam_jobs import annotations
from beam_jobs.planning.discover import InputError

BBOX_FORMATS = annotations.BOX_FORMATS
OBJECTS, LABELS = "objects", "labels"
_CATEGORY_FIELDS = ("category", "categories", "label", "labels", "class", "category_id")


@dataclasses.dataclass(frozen=True)
class AnnotationColumn:
    """A column of annotations: ``kind`` objects or labels, its ClassLabel ``names``, and, for objects,
    the field of each object that holds its class."""

    kind: str
    column: str
    names: tuple[str, ...]
    category: str = ""


def _item(spec: object) -> Optional[object]:
    """The feature of each item of a list feature (``List``, ``Sequence``, ``LargeList``, ``[feature]``), or None."""
    if isinstance(spec, dict) and spec.get("_type") in ("List", "Sequence", "LargeList"):
        return spec.get("feature")
    if isinstance(spec, list) and len(spec) == 1:
        return spec[0]
    return None


def _class_label(spec: object) -> Optional[tuple[str, ...]]:
    if isinstance(spec, dict) and spec.get("_type") == "ClassLabel" and spec.get("names"):
        return tuple(spec["names"])
    return None


def _object_fields(spec: object) -> Optional[dict]:
    """The fields of one object when ``spec`` is a list of objects (either way Arrow stores it), else None."""
    item = _item(spec)
    if isinstance(item, dict) and "_type" not in item:  # List({bbox, category, ...})
        return item
    if isinstance(spec, dict) and "_type" not in spec:  # Sequence({...}) in datasets 4+: a dict of lists
        fields = {name: _item(value) for name, value in spec.items()}
        if all(value is not None for value in fields.values()):
            return fields
    return None


def find(features: dict) -> list[AnnotationColumn]:
    """Every column of objects (with a bbox and a ClassLabel field) or of several ClassLabels."""
    found = []
    for column, spec in features.items():
        names = _class_label(_item(spec))
        if names is not None:
            found.append(AnnotationColumn(LABELS, column, names))
            continue
        fields = _object_fields(spec)
        if fields and "bbox" in fields:
            category = next((name for name in _CATEGORY_FIELDS if _class_label(fields.get(name))), None)
            if category is not None:
                found.append(AnnotationColumn(OBJECTS, column, _class_label(fields[category]), category))
    return found


def _objects_of(value: object) -> list[dict]:
    """A cell of objects as a list of dicts: Arrow gives a dict of lists (a struct of lists) or a list of dicts."""
    if value is None:
        return []
    if isinstance(value, dict):
        keys = list(value)
        return [dict(zip(keys, row)) for row in zip(*(value[key] or [] for key in keys))]
    return [item for item in value if isinstance(item, dict)]


def labels_of(value: object, column: AnnotationColumn) -> annotations.Labels:
    """A cell of several ClassLabel ids as :class:`beam_jobs.annotations.Labels` (out-of-range ids raise)."""
    ids = sorted({int(v) for v in value or () if v is not None})
    outside = [i for i in ids if not 0 <= i < len(column.names)]
    if outside:
        raise ValueError(f"label {outside[0]} is not one of the {len(column.names)} ClassLabel names")
    return annotations.Labels(tuple(ids))


def objects_of(value: object, column: AnnotationColumn, bbox_format: str, frame: tuple[int, int], source_id: str,
               where: str) -> annotations.Objects:
    """A cell of objects as :class:`beam_jobs.annotations.Objects`, each named ``{where} object {n}``."""
    boxes, rejected = [], []
    for number, item in enumerate(_objects_of(value), start=1):
        name = f"{where} object {number}"
        label, bbox = item.get(column.category), item.get("bbox")
        if not isinstance(label, int) or not 0 <= label < len(column.names):
            rejected.append((name, annotations.UNKNOWN_CLASS, f"{column.category} {label!r} is not one of the "
                             f"{len(column.names)} ClassLabel names"))
            continue
        if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            rejected.append((name, annotations.BAD_ANNOTATION, f"bbox {str(bbox)[:60]} is not four numbers"))
            continue
        corners = annotations.corners(bbox_format, *(float(v) for v in bbox))
        area = item.get("area")
        boxes.append(annotations.Box(name, label, *corners,
                                     float(area) if isinstance(area, (int, float)) and area >= 0
                                     and bbox_format != "yolo" else -1.0,
                                     bool(item.get("iscrowd", item.get("is_crowd", False)))))
    frame = annotations.NORMALIZED if bbox_format == "yolo" else frame
    return annotations.Objects(source_id, tuple(boxes), frame, bbox_format == "yolo", tuple(rejected))


def check_bbox_format(bbox_format: Optional[str]) -> str:
    if bbox_format is None:
        return "coco"
    if bbox_format not in BBOX_FORMATS:
        raise InputError(f"--bbox-format must be one of {', '.join(BBOX_FORMATS)}, got {bbox_format!r}")
    return bbox_format
