"""Pascal VOC's class ids: VOC's 20 as the OD API numbers them, other names after them, near misses named.

In:  the class names a VOC dataset's XMLs give (name -> objects), and ``--labels`` when given.
Out: the class names by id (0 the background) and a note for the run's warnings (:func:`classes_of`); for an
     object whose name is no class, the detail of its rejection (:func:`unknown_detail`: ``'Dog' is not a VOC
     class: did you mean 'dog'?``).

The rule (issue #57 §3): a name with no near match among Pascal's twenty is a class of its own, numbered after
them (21, 22, ...); a near miss (:func:`near_voc`) is rejected with the VOC name it may have meant, so a typo
never becomes a class, nor one odd name renumbers every class.
"""

from __future__ import annotations

import re
from typing import Collection, Mapping, Optional, Sequence

from beam_jobs.sources.objects import annotated_plan

# The OD API's pascal_label_map.pbtxt: VOC's 20 classes, alphabetical, ids 1-20.
VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


def classes_of(found: Mapping[str, int], labels: Optional[Sequence[str]]) -> tuple[tuple[str, ...], str]:
    """Names by id, id 0 the background, and what a warning should say of them. ``--labels``: its order from 1.
    Else, when some name is one of VOC's 20: those as the OD API numbers them (1-20), then each name with no near
    match among them (:func:`near_voc`) as a class of its own, sorted, from 21; a near miss (``Dog``, ``dogs``,
    ``persn``) is no class, and its objects are rejected with the name it may have meant. When no name is VOC's
    (a dataset of one's own classes in VOC's format), the names found, sorted, from 1."""
    if labels is not None:
        return ("",) + tuple(labels), ""
    if found and not any(name in VOC_CLASSES for name in found):
        names = sorted(found)
        return ("",) + tuple(names), (
            f"none of the {len(names)} class names of its VOC annotations is one of VOC's 20 ({_shown(names)}): "
            f"its classes are numbered 1-{len(names)} in sorted order, not as the OD API's pascal_label_map.pbtxt; "
            "give --labels to number them otherwise")
    own = sorted(name for name in found if name not in VOC_CLASSES and near_voc(name, found) is None)
    note = ""
    if own:
        note = (f"{len(own)} class name{'s' if len(own) != 1 else ''} of its VOC annotations "
                f"{'are' if len(own) != 1 else 'is'} not VOC's nor near one of VOC's 20 ({_shown(own)}): each is a "
                f"class of its own, numbered {_span(21, 20 + len(own))} after VOC's 1-20 (the OD API's "
                "pascal_label_map.pbtxt); give --labels to number them otherwise")
    return ("",) + VOC_CLASSES + tuple(own), note


def _shown(names: Sequence[str]) -> str:
    return ", ".join(map(repr, names[:5])) + (" ..." if len(names) > 5 else "")


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


# Other datasets' names of VOC's classes (COCO's, mostly): a name a VOC dataset may hold by mistake.
_VOC_SYNONYMS = {"airplane": "aeroplane", "plane": "aeroplane", "bike": "bicycle", "motorcycle": "motorbike",
                 "couch": "sofa", "tv": "tvmonitor", "monitor": "tvmonitor", "pottedplants": "pottedplant",
                 "plant": "pottedplant", "table": "diningtable", "people": "person"}


def near_voc(name: str, present: Optional[Collection[str]] = None) -> Optional[str]:
    """The VOC class a name that is none of VOC's 20 may have meant, or None (a class of its own).

    A near miss is the same name in another case (``Dog``), spaced or joined otherwise (``dining table``,
    ``potted_plant``), or a plural (``dogs``, ``buses``); and, when the VOC name it is near is ``present`` among
    the dataset's own names (or ``present`` is None), another dataset's name for it (COCO's ``airplane``,
    ``couch``, ``tv``) or, both of four letters or more, one edit away from it (``persn``, ``hors``). One edit
    from ``cat``, ``car``, ``cow``, ``bus`` or ``dog`` is another word (``rat``, ``bat``, ``cot``), a class; so
    is ``house`` in a dataset without ``horse``, ``table`` without ``diningtable``, ``plant``, ``boot``,
    ``chain``: ordinary words, whose objects a rejection would lose whole images of.
    """
    low = name.strip().lower()
    joined = re.sub(r"[\s_\-]+", "", low)
    for candidate in dict.fromkeys((low, joined)):
        if candidate in VOC_CLASSES:
            return candidate
        for cut in (1, 2):  # dogs, buses
            if candidate.endswith("es"[2 - cut:]) and candidate[:-cut] in VOC_CLASSES:
                return candidate[:-cut]
    likely = VOC_CLASSES if present is None else [voc for voc in VOC_CLASSES if voc in present]
    if joined in _VOC_SYNONYMS and _VOC_SYNONYMS[joined] in likely:
        return _VOC_SYNONYMS[joined]
    if low in _VOC_SYNONYMS and _VOC_SYNONYMS[low] in likely:
        return _VOC_SYNONYMS[low]
    if len(joined) < 4:
        return None
    return next((voc for voc in likely if len(voc) >= 4 and _one_edit(joined, voc)), None)


def _one_edit(a: str, b: str) -> bool:
    """``a`` and ``b`` differ by one letter inserted, deleted or replaced."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long = sorted((a, b), key=len)
    cut = next((i for i, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[cut:] == long[cut + 1:]


def near(name: str, classes: Sequence[str], given: bool) -> str:
    near = _near_match(name, classes, given)
    return f" (did you mean {near!r}?)" if near else ""


def _near_match(name: str, classes: Sequence[str], given: bool) -> Optional[str]:
    """The known class an unknown name may have meant: with ``--labels``, the nearest it lists; else the VOC
    class it nearly is."""
    return annotated_plan.near_name(name, classes) if given else near_voc(name)


def unknown_detail(name: str, classes: Sequence[str], given: bool) -> str:
    """An unknown class name, and the known one it may have meant (``'Dog' is not a VOC class: did you mean
    'dog'?``)."""
    near = _near_match(name, classes, given)
    detail = f"{name!r} is not {'in --labels' if given else 'a VOC class'}"
    return detail + (f": did you mean {near!r}?" if near else "")
