"""The plan of a dataset whose images carry an annotation value: objects (COCO, YOLO, VOC) or several labels.

In:  ``AnnotatedImage``s from a layout's module (its split, path, locator and its
     :data:`beam_jobs.annotations.Annotation`), and the class names by id.
Out: an :class:`beam_jobs.planning.discover.InputPlan` whose refs carry their annotation (``ImageRef.annotation``)
     and whose ``classes[i]`` is the text of class id ``i``: the source's ids, gaps kept ("" where a dataset
     has no class, COCO's 1-90 for 80 classes), never renumbered, so a model's class 18 means what the
     dataset's documentation says it means.

One label convention for objects, the one the records' readers hold: id 0 is the background. Model Garden's
detection generator drops class index 0 from its detections, and the OD API's label map refuses ``id: 0`` for
any other name. COCO's ids (1-90) and VOC's (1-20) keep it already; a source whose ids start at 0 (YOLO's
indexes, the Hub's ClassLabel, Label Studio's COCO) is written with every id one higher, ``classes[0]`` left
"", and the plan's ``class_id_offset`` (the manifest's) says so: record id = the source's id + offset.
The reader turns record ids into contiguous 0-based ones for KerasHub (``ObjectTargets(contiguous_ids=True)``).

``--val-fraction`` carves validation out of train by the same keyed hash as for classes, unstratified (an
image holds objects, or labels, of several classes).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import difflib
import hashlib
import itertools
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import record_schema
from beam_jobs import annotations
from beam_jobs.files import work_records
from beam_jobs.sources.archives import archive_members
from beam_jobs.planning.carve import carve_count, carve_key
from beam_jobs.planning.discover import InputError, InputPlan, Listing, scratch_file
from beam_jobs.stage_records import ImageRef


@dataclasses.dataclass(frozen=True)
class AnnotatedImage:
    """One image as its layout lists it, with its objects or labels."""

    split: str
    relpath: str
    annotation: annotations.Annotation
    source: str = ""


def derived_source_id(relpath: str) -> str:
    """A stable image id for layouts that have none (YOLO, VOC): 53 bits of the path's SHA-256, as decimal text.

    Model Garden's COCO evaluator parses ``image/source_id`` as an integer; 53 bits stay exact even
    where the id passes through a float64 (JSON readers).
    """
    return str(int.from_bytes(hashlib.sha256(relpath.encode("utf-8", "surrogatepass")).digest()[:8], "big") >> 11)


def source_of(relpath: str, located: Mapping[str, str], folded: Optional[Callable[[], Mapping[str, str]]] = None) -> str:
    """An annotation file's image path as an item's locator: its listed one, or a refusal when the path
    leaves SRC (an absolute path, a ``..``): annotation files come from strangers, and the image is then
    rejected as ``unsafe-path`` without being read. ``folded()`` (:func:`case_folded`, made when first
    needed): an image that is not there under its name but is under another case (``a.jpg``, ``a.JPG``) is
    rejected as ``missing-file`` naming the file that is there."""
    parts = relpath.split("/")
    if relpath.startswith("/") or ".." in parts or "\\" in relpath:
        return archive_members.refusal("unsafe-path", f"{relpath!r} leaves --src; an annotation's image path "
                                       "must be relative to it and stay inside it")
    if relpath not in located and folded is not None:
        other = folded().get(relpath.lower())
        if other is not None:
            return archive_members.refusal("missing-file", f"{relpath} is not there, {other} is: names are "
                                           "case-sensitive; fix the annotation file or rename the file")
    return located.get(relpath, "")


def case_folded(located: Mapping[str, str]) -> Callable[[], Mapping[str, str]]:
    """A function giving ``located``'s paths by their lower-case form, built on the first call (for a miss)."""
    made: dict[str, str] = {}

    def get() -> Mapping[str, str]:
        if not made:
            made.update((path.lower(), path) for path in located)
        return made
    return get


def folders_of(listing: Listing) -> set[str]:
    """Every folder of SRC that holds a file, or that the listing found (object stores have no empty folders,
    and list no folders at all: a folder there is a prefix of its files)."""
    found = set(listing.dirs)
    for path in listing.files:
        while "/" in path:
            path = path.rpartition("/")[0]
            if path in found:
                break
            found.add(path)
    return found


def near_name(name: str, known: Iterable[str]) -> Optional[str]:
    """The known class name an unknown one may have meant (a typo: ``Dog`` for ``dog``, ``persn`` for ``person``),
    or None: the same name in another case first, else :mod:`difflib`'s closest (ratio 0.8 or more)."""
    known = [k for k in known if k]
    folded = [k for k in known if k.casefold() == name.casefold()]
    near = folded or difflib.get_close_matches(name, known, n=1, cutoff=0.8) or \
        difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.8)
    return near[0] if near else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``": did you mean 'dog'?"`` for an unknown name with a near known one (:func:`near_name`), else ""."""
    near = near_name(name, known)
    return f": did you mean {near!r}?" if near else ""


def class_table(names: Mapping[int, str], src: str, where: str) -> tuple[str, ...]:
    """Class names by id, ids kept: ``result[i]`` is class ``i``'s name, "" for an id the dataset does not use."""
    if not names:
        raise InputError(f"{where} names no classes")
    negative = sorted(i for i in names if i < 0)
    if negative:
        raise InputError(f"{where}: class ids must be 0 or more; {negative[:5]} are not")
    if max(names) > 1_000_000:
        raise InputError(f"{where}: class id {max(names)} is too large (ids index a table of names)")
    return tuple(names.get(i, "") for i in range(max(names) + 1))


def plan(src: str, images: Iterable[AnnotatedImage], classes: Sequence[str], val_fraction: float, seed: int,
         skipped: Mapping[str, int], warnings: Sequence[str] = (), labels: Optional[Sequence[str]] = None,
         refused: Sequence[ImageRef] = (), scratch: Optional[str] = None,
         task: str = record_schema.TASK_OBJECTS, extra_features: Optional[Mapping[str, str]] = None) -> InputPlan:
    """The plan of an annotated dataset's images (``task``: what the annotations are).

    ``images`` is read once: with a ``scratch`` folder its refs (objects and all) stream into a scratch
    file and the plan holds a 16-byte carve key an image at most; without one they are held in memory,
    sorted by split and path (tests, small inputs). ``labels`` (``--labels``) must list the dataset's own
    class names in id order, each named id once: it can rename none and renumber none (the ids are the
    source's), so it is checked, not applied.
    """
    named = [name for name in classes if name]  # the dataset's classes, in id order (COCO's gaps left out)
    if labels is not None and list(labels) != named:
        differ = next((i for i, (a, b) in enumerate(zip(labels, named)) if a != b), min(len(labels), len(named)))
        raise InputError(f"--labels differs from the classes {src} numbers itself at line {differ + 1} "
                         f"({labels[differ] if differ < len(labels) else 'none'!r} where the dataset has "
                         f"{named[differ] if differ < len(named) else 'none'!r}); fix it, or leave --labels out")
    for name in classes:
        check_class_name(name, src)
    offset = 1 if task == record_schema.TASK_OBJECTS and classes and classes[0] else 0
    classes = ("",) * offset + tuple(classes)
    sizes: dict[str, int] = {}
    keys: list[bytes] = []  # each train image's carve key, in listing order (--val-fraction only)
    listed_objects: dict[int, int] = {}  # record class id -> objects the annotations give it
    refused_objects = [0]  # objects the source refused already (an unknown class, a line that does not parse)

    def refs() -> Iterator[ImageRef]:
        for image in images:
            sizes[image.split] = sizes.get(image.split, 0) + 1
            if val_fraction > 0 and image.split == "train":
                keys.append(carve_key(seed, image.relpath))
            annotation = _shifted(image.annotation, offset)
            if isinstance(annotation, annotations.Objects):
                for box in annotation.boxes:
                    listed_objects[box.label] = listed_objects.get(box.label, 0) + 1
                refused_objects[0] += len(annotation.rejected)
            yield ImageRef(image.split, image.relpath, 0, image.source, annotations.encode(annotation))

    if scratch is None:
        listed: Sequence[ImageRef] = tuple(refs())
    else:
        listed = work_records.spill(scratch_file(scratch, "objects"), work_records.LISTED, refs(),
                                    work_records.encode_listed, work_records.decode_listed)
    if not len(listed):
        raise InputError(f"{src} lists no images")
    if task == record_schema.TASK_OBJECTS and not listed_objects and not refused_objects[0] and \
            set(sizes) - {"test"}:  # a test split alone (COCO's test2017 for inference) has none, rightly
        warnings = list(warnings) + [f"the annotations give the {len(listed)} images no object at all: a detection "
                                     "dataset without objects teaches only background"]
    threshold = None
    if val_fraction > 0:
        splits = sorted(sizes, key=record_schema.SPLITS.index)
        if splits != ["train"]:
            raise InputError(f"--val-fraction needs a single-split input, but {src} already has splits {splits}")
        count = carve_count(len(keys), val_fraction) if len(keys) > 1 else 0
        threshold = sorted(keys)[count - 1] if count else None
        sizes = {"train": len(keys) - count, **({"validation": count} if count else {})}
    return InputPlan(_ObjectRefs(listed, threshold, seed, refused), tuple(classes), dict(sorted(skipped.items())),
                     tuple(warnings), split_counts=sizes, task=task, extra_features=dict(extra_features or {}),
                     class_id_offset=offset, listed_objects=dict(sorted(listed_objects.items())))


def _shifted(annotation: annotations.Annotation, offset: int) -> annotations.Annotation:
    """``annotation`` with its objects' class ids ``offset`` higher (the background's id 0 kept free)."""
    if not offset or not isinstance(annotation, annotations.Objects):
        return annotation
    return dataclasses.replace(annotation, boxes=tuple(box._replace(label=box.label + offset)
                                                       for box in annotation.boxes))


def check_class_name(name: str, where: str) -> None:
    """A class name is one line of ``labels.txt`` and a quoted string of ``label_map.pbtxt``: a control character
    or a line break in it would break both (:func:`beam_jobs.annotations.class_name_problem`)."""
    problem = annotations.class_name_problem(name, where)
    if problem:
        raise InputError(problem)


class _ObjectRefs:
    """The plan's refs, re-iterable: validation carved on the way (the images whose carve key is at most
    ``threshold``), sorted when held in memory, then the refused ones."""

    def __init__(self, listed: Sequence[ImageRef], threshold: Optional[bytes], seed: int,
                 refused: Sequence[ImageRef]) -> None:
        self._listed, self._threshold, self._seed, self._refused = listed, threshold, seed, tuple(refused)

    def _carved(self) -> Iterator[ImageRef]:
        for ref in self._listed:
            if self._threshold is not None and carve_key(self._seed, ref.relpath) <= self._threshold:
                ref = ref._replace(split="validation")
            yield ref

    def __iter__(self) -> Iterator[ImageRef]:
        if isinstance(self._listed, tuple):
            ordered = sorted(self._carved(), key=lambda ref: (record_schema.SPLITS.index(ref.split), ref.relpath))
            return iter(ordered + list(self._refused))
        return itertools.chain(self._carved(), self._refused)

    def __len__(self) -> int:
        return len(self._listed) + len(self._refused)


READERS = 32  # annotation files read at once (each a GET in an object store: tens of ms, mostly waiting)


def read_in_order(read: Callable[[str, str], bytes], wanted: Iterable[Optional[tuple[str, str]]],
                  threads: Optional[int] = None) -> Iterator[Optional[bytes]]:
    """The bytes of each ``(path, locator)`` of ``wanted`` (None for None), in order: files read by ``threads``
    threads at once (:data:`READERS`), at most four times that many ahead of the caller (100k label files in
    an object store are not 100k GETs one after another); archive members by the caller's thread, in order
    (they share the reader's one handle and its read-ahead window, which serves consecutive members)."""
    threads = threads or READERS
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="annotation-reads")
    ahead: collections.deque = collections.deque()

    def take() -> Optional[bytes]:
        item = ahead.popleft()
        if isinstance(item, concurrent.futures.Future):
            return item.result()
        return None if item is None else read(*item)

    try:
        for item in wanted:
            ahead.append(pool.submit(read, *item) if item is not None and not item[1] else item)
            if len(ahead) > 4 * threads:
                yield take()
        while ahead:
            yield take()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
