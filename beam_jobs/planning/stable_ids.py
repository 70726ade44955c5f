"""An update's stable class ids: SRC's listed class ids mapped to the version's, in each image's label or annotation.

In:  the latest version's classes, the classes SRC's plan lists now, an :class:`ImageRef` of SRC (its label, or
     its annotation: several labels, or objects).
Out: the version's classes (existing ones keep their ids, a new one gets the next id), and each ref with its ids
     the version's: its label, its tags, its objects' classes; the class ids its record will hold, their key
     (the sources table's ``label``), and an object image's annotation digest (the sources table's ``annotation``).

Ids are stable across versions, so an id compares as its class name would: a source that numbers its classes
anew (a COCO export with a category added in the middle) changes no record of an image it did not change.
(docs/update.md, "Decisions".)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Optional, Sequence

from beam_jobs import annotations
from beam_jobs.planning.discover import class_order
from beam_jobs.stage_records import ImageRef
from record_files.versions import NO_ANNOTATION, label_key


def stable_classes(before: Sequence[str], listed: Sequence[str]) -> tuple[str, ...]:
    """The version's classes: ``before``'s, in order (each keeps its id), then every new name in a conversion's
    order (numeric when every new name is an integer, as a label file's "10" follows "9"). "" (an id an object
    source leaves unused, or the background's) is never a new class."""
    known = set(before)
    return tuple(before) + tuple(class_order({name for name in listed if name and name not in known}))


def remap(classes: Sequence[str], listed: Sequence[str]) -> list[int]:
    """Listed id -> the version's id, by name (``classes``: :func:`stable_classes`); an unused listed id ("")
    maps to the version's first unused id, or -1 (no box carries one)."""
    ids: dict[str, int] = {}
    for index, name in enumerate(classes):
        ids.setdefault(name, index)
    return [ids.get(name, -1) for name in listed]


def label_ids(ref: ImageRef) -> tuple[int, ...]:
    """The class ids ``ref`` labels its image with: its label, or a multi-label image's ids, or its objects'
    classes (its annotation)."""
    if ref.annotation:
        annotation = annotations.decode(ref.annotation)
        if isinstance(annotation, annotations.Labels):
            return annotation.ids
        return tuple(box.label for box in annotation.boxes)
    return (ref.label,)


def stable_ref(ref: ImageRef, ids: Sequence[int]) -> tuple[ImageRef, tuple[int, ...], int, int]:
    """``ref`` with its class ids the version's (``ids``: :func:`remap`), the ids its record holds (an object
    image's: each object's class, as the records table's ``classes``), their key
    (:func:`record_files.versions.label_key`), and its annotation digest (:func:`annotation_digest`; objects only)."""
    if not ref.annotation:  # one label (a call less an image: the comparison's cost is per image of SRC)
        key = ids[ref.label]
        return ref._replace(label=key), (key,), key, NO_ANNOTATION
    if ref.annotation.startswith(b'["objects"'):
        return _stable_objects(ref, ids)
    annotation = annotations.decode(ref.annotation)  # several labels
    held = tuple(sorted(ids[label] for label in annotation.ids))
    return ref._replace(annotation=annotations.encode(annotations.Labels(held))), held, label_key(held), NO_ANNOTATION


def _stable_objects(ref: ImageRef, ids: Sequence[int]) -> tuple[ImageRef, tuple[int, ...], int, int]:
    """:func:`stable_ref` of an object image, on its annotation's JSON as :func:`beam_jobs.annotations.encode`
    writes it (``["objects", source_id, [[name, label, xmin, ymin, xmax, ymax, ...], ...], ...]``): the comparison
    costs 112 us an image of two boxes so, 205 decoding them into boxes, and gives the same bytes (floats
    round-trip through JSON exactly; pinned by tests/converter/test_update_objects.py against
    :func:`annotation_digest`)."""
    value = _JSON.decode(ref.annotation.decode("utf-8", "surrogatepass"))
    boxes = value[2]
    moved = False
    for box in boxes:
        label = ids[box[1]]
        moved |= label != box[1]
        box[1] = label
    if moved:
        ref = ref._replace(annotation=_COMPACT.encode(value).encode("utf-8"))
    # The objects a record holds: each with an extent (placing drops a box without one, annotations.NO_EXTENT).
    held = tuple(box[1] for box in boxes if box[4] > box[2] and box[5] > box[3])
    return ref, held, label_key(held), _unnamed_digest(value)


def objects_digest(annotation: bytes, ids: Sequence[int]) -> tuple[int, Optional[list]]:
    """An annotation's digest, as :func:`stable_ref` gives it (its fourth value), and an object image's semantic
    mask entry (``[path in SRC, locator, ...]``, None without one), from one decode of its JSON: what version 1's
    sources table needs of each image (#57 §6: it decoded each annotation twice and encoded it twice)."""
    if not annotation.startswith(b'["objects"'):
        return NO_ANNOTATION, None  # several labels: no digest
    value = _JSON.decode(annotation.decode("utf-8", "surrogatepass"))
    mask = value[9] if len(value) > 9 and value[9] else None
    for box in value[2]:
        box[1] = ids[box[1]]
    return _unnamed_digest(value), mask


def _unnamed_digest(value: list) -> int:
    """The digest of an object annotation's decoded JSON, ids the version's, without its objects' names (which
    it blanks: ``value`` is the caller's to drop)."""
    for box in value[2]:
        box[0] = ""
    return _digest(_COMPACT.encode(value))


# json.loads / json.dumps(separators=(",", ":"), ensure_ascii=False) with their objects built once, not per call.
_JSON = json.JSONDecoder()
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def annotation_digest(objects: annotations.Objects) -> int:
    """63 bits of BLAKE2b of ``objects`` as encoded, ids the version's, without the objects' names (``annotation
    12``, ``labels/a.txt line 3``: how the rejection report names an object, not what a record holds; an export
    that numbers its annotations anew, or a line added above, changes no record). Never
    :data:`record_files.versions.NO_ANNOTATION`."""
    unnamed = dataclasses.replace(objects, boxes=tuple(box._replace(name="") for box in objects.boxes))
    return _digest(annotations.encode(unnamed).decode("utf-8"))


def _digest(text: str) -> int:
    value = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big") >> 1
    return value or 1
