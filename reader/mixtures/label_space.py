"""One label space over several datasets: classes met by name, each source's ids mapped into it.

Data in: each source's class list (``DatasetInfo.classes``: record id i is
``classes[i]``, "" for an id without a name: an object dataset's background 0
and the gaps of COCO's category ids, whatever the source's own numbering, since
the manifest's ``class_id_offset`` is already in the record ids) and the
user's :class:`LabelSpace`. Data out: a :class:`LabelMap`: the united classes,
a table per source (record id -> united id, -1 for a dropped class), which
sources hold which class, and the OD API label map text.

Ids: classification and several labels number the united classes 0..K-1;
objects 1..K with 0 the background (the OD API's and Model Garden's
convention, as a converted dataset's records), or 0..K-1 with
``ObjectTargets(contiguous_ids=True)`` (KerasHub's). A class one source lacks
is absent from its images: for a detector, that source's images teach
"background" wherever such an object stands unlabelled.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Mapping, Optional, Sequence, Union

import numpy as np

import record_schema

DROPPED = -1


@dataclasses.dataclass(frozen=True)
class LabelSpace:
    """How the sources' classes become the mixture's.

    Attributes:
      labels: the united classes in id order; None: the sorted union of every
        source's class names (after ``rename``). A source class not in it is
        an error for classification (its images would have no label) and
        dropped for objects (its boxes leave the targets).
      rename: source class name -> the mixture's name (``{"motorbike":
        "motorcycle"}``), or None to drop the class: its objects leave the
        targets, and for several labels it leaves the label set. A dict, or
        pairs. Classification cannot drop a class (its images would have no
        label, and removing them would break the batch quotas).
    """

    labels: Optional[tuple[str, ...]] = None
    rename: Union[Mapping[str, Optional[str]], tuple] = ()

    def __post_init__(self) -> None:
        if self.labels is not None:
            if isinstance(self.labels, str) or not all(isinstance(name, str) and name for name in self.labels):
                raise ValueError(f"LabelSpace(labels=...) must be a list of non-empty class names, got {self.labels!r}")
            if len(set(self.labels)) != len(self.labels):
                twice = sorted({name for name in self.labels if list(self.labels).count(name) > 1})
                raise ValueError(f"LabelSpace(labels=...) names {twice} more than once")
            object.__setattr__(self, "labels", tuple(self.labels))
        pairs = tuple(sorted(dict(self.rename).items())) if isinstance(self.rename, Mapping) else tuple(self.rename)
        for pair in pairs:
            if len(pair) != 2 or not isinstance(pair[0], str) or not (pair[1] is None or isinstance(pair[1], str)):
                raise ValueError(f"LabelSpace(rename=...) maps a class name to a name or None, got {pair!r}")
        object.__setattr__(self, "rename", pairs)

    def renamed(self, name: str) -> Optional[str]:
        return dict(self.rename).get(name, name)


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """The mixture's classes and how each source's record ids reach them.

    Attributes:
      names: the united classes, in id order from ``first_id``.
      first_id: 1 for objects with the background at 0, else 0.
      tables: per source, record id -> united id (``DROPPED``: none).
      holders: class name -> the sources that hold it (by name).
    """

    names: tuple[str, ...]
    first_id: int
    tables: tuple[np.ndarray, ...]
    holders: dict

    @property
    def classes(self) -> tuple[str, ...]:
        """As ``DatasetInfo.classes``: index i names id i ("" for the background of objects)."""
        return ("",) * self.first_id + self.names

    def label_map(self) -> str:
        """The TF Object Detection API's label map (``item { id: 1 name: 'cat' }``), ids from 1.

        Written as the converter writes a dataset's ``label_map.pbtxt``; with
        0-based ids (classification, ``contiguous_ids``) item id is the id + 1,
        as the OD API reserves 0.
        """
        def quoted(name: str) -> str:
            return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"
        first = max(self.first_id, 1)
        return "".join(f"item {{\n  id: {first + index}\n  name: {quoted(name)}\n}}\n"
                       for index, name in enumerate(self.names))


def unite(task: str, classes: Sequence[Sequence[str]], sources: Sequence[str], space: LabelSpace,
          contiguous_ids: bool = False) -> LabelMap:
    """The :class:`LabelMap` of sources with these ``classes`` (each ``DatasetInfo.classes``), named ``sources``.

    Raises:
      ValueError: naming the source and class a classification mixture cannot
        label, or a segmentation mixture whose sources' classes differ.
    """
    if task == record_schema.TASK_SEGMENTATION:
        return _same_classes(classes, sources, space)
    renamed = [[space.renamed(name) if name else None for name in names] for names in classes]
    found = sorted({name for names in renamed for name in names if name})
    _check_names(space, {name for names in classes for name in names if name}, set(found))
    names = space.labels if space.labels is not None else tuple(found)
    if not names:
        raise ValueError("LabelSpace(rename=...) drops every class of the mixture: nothing would be left to learn")
    first_id = 1 if task == record_schema.TASK_OBJECTS and not contiguous_ids else 0
    ids = {name: first_id + index for index, name in enumerate(names)}
    tables, holders = [], {name: [] for name in names}
    for source, original, mapped in zip(sources, classes, renamed):
        table = np.full(max(len(mapped), 1), DROPPED, np.int64)
        for record_id, (was, name) in enumerate(zip(original, mapped)):
            if not was:
                continue
            if name is None or name not in ids:
                if task == record_schema.TASK_CLASSIFICATION:
                    why = "dropped by LabelSpace(rename=...)" if name is None else "not in LabelSpace(labels=...)"
                    raise ValueError(f"source {source!r}: its class {was!r} is {why}: a classification source's images "
                                     "each need a label (and dropping them would break the batch quotas); map it to "
                                     "a class of the mixture, or convert the source without it")
                continue
            table[record_id] = ids[name]
            if source not in holders[name]:
                holders[name].append(source)
        tables.append(table)
    return LabelMap(tuple(names), first_id, tuple(tables), {name: tuple(held) for name, held in holders.items()})


def _check_names(space: LabelSpace, held: set, united: set) -> None:
    """A name in ``rename`` or ``labels`` that no source holds is a mistake (a misspelling most often): it
    would be ignored, and the class it meant would stay apart or leave the targets. ``ValueError`` naming it
    and the closest class."""
    for name, _ in space.rename:
        if name not in held:
            raise ValueError(f"LabelSpace(rename=...) renames {name!r}, which no source holds"
                             f"{_closest(name, held)}; the sources' classes: {sorted(held)}")
    for name in space.labels or ():
        if name not in united:
            raise ValueError(f"LabelSpace(labels=...) names {name!r}, which no source holds after renaming"
                             f"{_closest(name, united)}; the mixture's classes: {sorted(united)}")


def _closest(name: str, names: set) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _same_classes(classes: Sequence[Sequence[str]], sources: Sequence[str], space: LabelSpace) -> LabelMap:
    """Segmentation: masks hold ids pixel by pixel, so every source must number the same classes the same way."""
    if space != LabelSpace():
        raise ValueError("LabelSpace(...) cannot remap a segmentation mixture: its masks hold class ids pixel by "
                         "pixel; convert the sources with the same class list instead")
    for source, names in zip(sources[1:], classes[1:]):
        if tuple(names) != tuple(classes[0]):
            raise ValueError(f"source {source!r} numbers its segmentation classes {list(names)} and source "
                             f"{sources[0]!r} {list(classes[0])}: masks are read as they are, so a segmentation "
                             "mixture needs one class list; convert the sources with the same --labels")
    names = tuple(classes[0])
    tables = tuple(np.arange(len(names), dtype=np.int64) for _ in sources)
    return LabelMap(names, 0, tables, {name: tuple(sources) for name in names if name})
