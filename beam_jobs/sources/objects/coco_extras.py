"""COCO's keypoints and captions beside its instances: ``person_keypoints_<set>.json`` and ``captions_<set>.json``.

In:  the two files of a set whose ``instances_<set>.json`` is read (``annotations/`` of COCO 2014-2017), each
     read once as a stream (:func:`beam_jobs.sources.objects.coco_json.read_entries`): the keypoints file's
     categories (``keypoints``: the points' names, 17 for COCO's person) and annotations (``id``, ``keypoints``:
     ``x, y, visibility`` a point, in the image's pixels), the captions file's annotations (``image_id``, ``caption``).
Out: an :class:`Extras` that :class:`beam_jobs.sources.objects.coco_json.CocoSet` asks for each object's points (by
     its annotation id: a keypoints annotation is the instances file's person annotation of the same id, with
     the points added) and each image's captions.

What the records get is what the TF Object Detection API's ``create_coco_tf_record.py`` (``--*_keypoint_annotations_file``)
and Model Garden's (``--caption_annotations_file``) write: every object of an image holds K points, zeros with
visibility 0 where it has none (a car, a person without keypoints), so ``image/object/keypoint/x`` has K entries an
object and its decoder's ``num_keypoints`` reshapes them; ``image/caption`` lists an image's captions. The points'
names are not written an object (the OD API writes 17 names on each: 150 MB over train2017); they are the
keypoints file's ``categories[].keypoints``, in docs/converter.md. Held until the plan is made: 212 bytes an object
with keypoints (train2017's 262k: 56 MB), the captions' UTF-8.
"""

from __future__ import annotations

import math
import posixpath
import re
import struct
from typing import BinaryIO, Callable, Optional

from beam_jobs.planning.discover import InputError
from beam_jobs.sources.objects import coco_json

KEYPOINTS_PREFIX, CAPTIONS_PREFIX = "person_keypoints_", "captions_"
_IMAGE = struct.Struct("<q")  # a keypoints annotation's image_id, before its values
_NO_IMAGE = -(1 << 63)  # a keypoints annotation without an int image_id: attached by its id alone
# A point's name as words: separators kept, camelCase split (leftEye: left, Eye; hand_L: hand, _, L; LEye: L, Eye).
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^A-Za-z0-9]+")
_OTHER_SIDE = {"left": "right", "right": "left", "l": "r", "r": "l"}


def _partner(name: str) -> Optional[str]:
    """``name`` with each word that says a side swapped for the other (left_eye: right_eye, hand_L: hand_R,
    L_eye: R_eye, leftEye: rightEye, Right Hip: Left Hip), the case kept; None when no word says a side. A
    lone ``l`` or ``r`` says a side only beside another word of letters (points named ``l`` and ``r`` alone
    could be anything)."""
    words = _WORDS.findall(name)
    lettered = [word for word in words if word.isalpha()]
    swapped, sided = [], False
    for word in words:
        other = _OTHER_SIDE.get(word.lower())
        if other is None or (len(word) == 1 and len(lettered) < 2):
            swapped.append(word)
            continue
        sided = True
        swapped.append(other.upper() if word.isupper() else other.capitalize() if word[0].isupper() else other)
    return "".join(swapped) if sided else None


def pairing(names: tuple[str, ...]) -> tuple[tuple[int, ...], list[str]]:
    """``(flip, unpaired)``: the points a horizontal flip swaps, from their names (see :func:`flip_of`), and the
    names that say a side whose other side no name has (they stay in place: a flip cannot be read from them).
    Names that pair ambiguously (two names with the same partner) give no flip, all of them unpaired."""
    index = {name: place for place, name in enumerate(names)}
    flip, unpaired = list(range(len(names))), []
    for place, name in enumerate(names):
        partner = _partner(name)
        if partner is None:
            continue
        if partner in index and index[partner] != place:
            flip[place] = index[partner]
        else:
            unpaired.append(name)
    if any(flip[other] != place for place, other in enumerate(flip)) or len(index) != len(names):
        return (), [name for name in names if _partner(name) is not None]
    return (tuple(flip) if flip != list(range(len(names))) else ()), unpaired


def flip_of(names: tuple[str, ...]) -> tuple[int, ...]:
    """The points a horizontal flip swaps, from their names: each point whose name says a side takes the place of
    the one named the same with the other side (``left_eye`` and ``right_eye``; ``hand_L`` and ``hand_R``,
    ``L_eye`` and ``R_eye``, ``leftEye`` and ``rightEye``), the others stay (``nose``); what the reader's
    ``ObjectTargets(keypoint_flip=...)`` takes (COCO's 17: ``reader.COCO_KEYPOINT_FLIP``). Empty when no two
    names pair up, so no flip is guessed for points whose names say no side."""
    return pairing(names)[0]


def flip_warning(names: tuple[str, ...], where: str) -> str:
    """A warning naming the points whose names say a side and pair with none (:func:`pairing`), and how a reader
    gives the flip itself; "" when every such name pairs."""
    flip, unpaired = pairing(names)
    if not unpaired:
        return ""
    shown = ", ".join(unpaired[:8]) + (" ..." if len(unpaired) > 8 else "")
    kept = (f"the manifest's flip swaps only the pairs it found ({' '.join(map(str, flip))})" if flip else
            "the manifest records no flip")
    return (f"{where}: keypoint{'s' if len(unpaired) > 1 else ''} {shown} name{'' if len(unpaired) > 1 else 's'} a "
            f"side, and no point is named the same with the other side (left/right, l/r): a horizontal flip keeps "
            f"{'them' if len(unpaired) > 1 else 'it'} in place and {kept}. Give the flip when reading: "
            f"reader.ObjectTargets(keypoints=\"auto\", keypoint_flip=(...)), the {len(names)} points' order after a "
            f"mirror, entry i the point that becomes point i (Ultralytics' flip_idx, the OD API's "
            f"keypoint_flip_permutation)")


def manifest_entry(names: tuple[str, ...]) -> dict:
    """The manifest's ``keypoints``: K, the points' names in their order, and the flip their names give (see
    :func:`flip_of`; absent where they give none), so a reader learns the ``ObjectTargets`` to ask for."""
    flip = flip_of(names)
    return {"count": len(names), "names": list(names), **({"flip": list(flip)} if flip else {})}


def files_of(instances: str, located) -> tuple[str, str]:
    """``(keypoints file, captions file)`` of the set of ``annotations/instances_<set>.json``, "" where SRC has none."""
    folder, name = posixpath.split(instances)
    stem = name[len("instances_"):] if name.startswith("instances_") else ""
    found = [posixpath.join(folder, prefix + stem) for prefix in (KEYPOINTS_PREFIX, CAPTIONS_PREFIX)] if stem else []
    return tuple(path if path in located else "" for path in found) if found else ("", "")


class Extras:
    """A set's keypoints (by annotation id) and captions (by image id), compact."""

    def __init__(self, keypoints_where: str = "", captions_where: str = "") -> None:
        self.keypoints_where, self.captions_where = keypoints_where, captions_where
        self.names: tuple[str, ...] = ()  # the keypoints' names, from the file's categories
        self.count = 0  # K: points an object; 0 without a keypoints file
        # annotation id -> its image id (int64; _NO_IMAGE: none given) and values as float32 (x, y, visibility a point)
        self._points: dict[int, bytes] = {}
        self._bad: dict[int, str] = {}  # annotation id -> why its keypoints cannot be used
        self._captions: dict[str, list[str]] = {}
        self._used: set[int] = set()  # the annotation ids whose keypoints an object took
        # Keypoints attach to objects by an int "id" on both sides (a place in the file is no key: it would give
        # one object another's points): the keypoints annotations without one are dropped and counted, the
        # instances file's objects without one get unlabelled points and are counted.
        self.without_id = 0
        self.objects_without_id = 0

    def unused(self) -> list[int]:
        """The keypoints annotations no object of the instances file took (asked for by :meth:`points`), sorted."""
        return sorted(set(self._points) - self._used)

    def said(self, instances_where: str) -> list[str]:
        """The warnings of the keypoints not written: those no object took (:meth:`unused`), those without an
        int id, and the instances file's objects without one (given unlabelled points)."""
        ids, where, said = self.unused(), self.keypoints_where, []
        if ids:
            said.append(f"{where}: {len(ids)} keypoints annotation{'s' if len(ids) > 1 else ''} name"
                        f"{'' if len(ids) > 1 else 's'} no object its instances file lists, and "
                        f"{'were' if len(ids) > 1 else 'was'} not written (ids {', '.join(map(str, ids[:5]))}"
                        f"{' ...' if len(ids) > 5 else ''})")
        if self.without_id:
            many = self.without_id > 1
            said.append(f"{where}: {self.without_id} keypoints annotation{'s have' if many else ' has'} no int "
                        f"\"id\" and {'were' if many else 'was'} not written (keypoints attach to objects by id)")
        if self.objects_without_id:
            said.append(f"{instances_where}: {self.objects_without_id} annotation"
                        f"{'s have' if self.objects_without_id > 1 else ' has'} no int \"id\": written with "
                        f"{self.count} keypoints of visibility 0 (keypoints attach to objects by id)")
        return said

    def unlabelled(self) -> tuple[tuple, str]:
        """The points of an object without an int id: K unlabelled (zeros, visibility 0), counted."""
        if not self.count:
            return (), ""
        if self.keypoints_where:
            self.objects_without_id += 1
        return (0.0, 0.0, 0) * self.count, ""

    def points(self, annotation_id: int, image_id: str = "", instances_where: str = "") -> tuple[tuple, str]:
        """``(x, y, visibility, ...)`` of an object in its image's pixels (zeros for an object without keypoints),
        or ``((), problem)`` for keypoints that cannot be used; ``((), "")`` without a keypoints file.

        ``image_id``: the object's image in the instances file (``instances_where``): keypoints that name
        another image are another object's (the files disagree), refused naming both ids rather than attached."""
        if not self.count:
            return (), ""
        if annotation_id in self._bad:
            return (), self._bad[annotation_id]
        packed = self._points.get(annotation_id)
        if packed is None:
            return (0.0, 0.0, 0) * self.count, ""
        self._used.add(annotation_id)
        (their_image,) = _IMAGE.unpack_from(packed)
        where = posixpath.basename(self.keypoints_where)
        if image_id and their_image != _NO_IMAGE and str(their_image) != image_id:
            return (), (f"{where} annotation {annotation_id} is of image_id {their_image}, and "
                        f"{posixpath.basename(instances_where) or 'the instances file'}'s annotation {annotation_id} of "
                        f"image_id {image_id}: the files disagree on whose keypoints these are")
        values = struct.unpack(f"<{(len(packed) - _IMAGE.size) // 4}f", packed[_IMAGE.size:])
        if len(values) != 3 * self.count:
            return (), (f"{where} annotation {annotation_id}: {len(values)} keypoint "
                        f"values, not x, y, visibility for each of the {self.count} points its categories name")
        return tuple(value if index % 3 != 2 else int(value) for index, value in enumerate(values)), ""

    def captions_of(self, source_id: str) -> tuple[str, ...]:
        return tuple(self._captions.get(source_id, ()))

    def _category(self, item: dict) -> None:
        names = item.get("keypoints")
        if not isinstance(names, list) or not names:
            return
        if self.count and len(names) != self.count:
            raise InputError(f"{self.keypoints_where}: category {item.get('id')} names {len(names)} keypoints, another "
                             f"{self.count}: one count of points an object is what the records' keys can hold")
        self.names, self.count = tuple(str(name) for name in names), len(names)

    def _keypoints(self, item: dict) -> None:
        annotation_id, values = item.get("id"), item.get("keypoints")
        if values is None:
            return
        if not isinstance(annotation_id, int) or isinstance(annotation_id, bool):
            self.without_id += 1
            return
        if not (isinstance(values, list) and len(values) % 3 == 0 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)):
            self._bad[annotation_id] = (f"{posixpath.basename(self.keypoints_where)} annotation {annotation_id}: "
                                        f"keypoints {str(values)[:60]} are not x, y, visibility numbers")
            return
        image_id = item.get("image_id")
        image_id = image_id if isinstance(image_id, int) and not isinstance(image_id, bool) else _NO_IMAGE
        self._points[annotation_id] = _IMAGE.pack(image_id) + struct.pack(f"<{len(values)}f", *values)

    def _caption(self, item: dict) -> None:
        image_id, text = item.get("image_id"), item.get("caption")
        if isinstance(image_id, int) and isinstance(text, str):
            self._captions.setdefault(str(image_id), []).append(text.strip())


def read(keypoints: Optional[tuple[str, Callable[[], BinaryIO]]],
         captions: Optional[tuple[str, Callable[[], BinaryIO]]]) -> Optional[Extras]:
    """The extras of one set: ``(where, opener)`` of its keypoints and captions files (None where it has none);
    None when it has neither. A damaged file raises :class:`InputError` naming it and the byte offset."""
    if keypoints is None and captions is None:
        return None
    extras = Extras(keypoints[0] if keypoints else "", captions[0] if captions else "")
    if keypoints is not None:
        coco_json.read_entries(keypoints[1], keypoints[0], {"categories": extras._category,
                                                           "annotations": extras._keypoints})
        if not extras.count:
            raise InputError(f"{keypoints[0]}: no category names its keypoints (\"keypoints\": [\"nose\", ...]); a "
                             "person_keypoints file lists them")
    if captions is not None:
        coco_json.read_entries(captions[1], captions[0], {"annotations": extras._caption})
    return extras
