"""CVAT's own export, "CVAT for images 1.1": ``annotations.xml``, its images beside it wherever they lie.

In:  SRC (a folder, or the export's zip) holding ``annotations.xml``: ``<meta>`` with the task's, job's or
     project's ``<labels>``, then an ``<image id name width height>`` per frame (``subset`` too in a
     project's export) holding its shapes, each with a ``label``: ``<box xtl ytl xbr ybr>`` (and
     ``rotation``, degrees), ``<polygon>``, ``<polyline>``, ``<points>`` (``points="x1,y1;x2,y2;..."``),
     ``<ellipse cx cy rx ry>``, ``<cuboid>``, ``<mask left top width height>``; and ``images/``: a task's or
     job's frames at ``images/<name>``, a project's at ``images/<subset>/<name>`` (``name`` may hold folders);
     or anywhere under SRC, found as CVAT's own importer matches frames (:class:`_Finder`: the file whose path
     ends with the name, ``dataset/cat/1.jpg`` for ``cat/1.jpg``). An ``annotations.xml`` at SRC's top is
     always this layout: it is never read as a class folder's stray file.
Out: the plan (:mod:`beam_jobs.sources.objects.annotated_plan`) of every image the XML lists, with its objects: a box
     as given, any other shape's extent as its box (as YOLO's segments are read for detection), in pixels of
     the ``width`` x ``height`` the image declares: the upright image, as CVAT shows and annotates it.

Class ids: the meta's labels in their listed order, numbered from 1 (0 is the background, as in the OD API's
label maps and Model Garden's detectors); a skeleton's point labels (those with a ``<parent>``) are no
classes. ``--labels`` gives the order instead, and a shape of a label it does not list is rejected
(``unknown-class``, named ``annotations.xml image a.jpg box 2``, with the label it may have meant: ``did you
mean 'car'?``), as is one of a label the meta lacks; either rejects its image
(:func:`beam_jobs.annotations.unwritable`).
Splits: an image's ``subset`` (a project's export), or the task's or job's ``<subset>``: ``train``,
``training``, ``val``, ``valid``, ``validation``, ``test``, ``testing`` in any case, and CVAT's ``default``
(or none) as train. Any other subset name is an error naming each (and its image count) once the XML is read:
CVAT's subsets are free text, and a subset this cannot place is better refused than trained on.

Not written, and counted in one warning: ``<tag>`` (a label of the whole image, without a box) and
``<skeleton>`` (keypoints). ``occluded="1"`` is not written either: the OD API's ``truncated`` means cut
by the image's edge, which an occluded object is not. Image ids come from the path
(:func:`beam_jobs.sources.objects.annotated_plan.derived_source_id`): CVAT's ``id`` is a frame number of its task,
repeated across a project's tasks. An image the XML lists that is not under SRC is rejected as ``missing-file``,
naming where it was looked for; when none is, planning fails naming annotations.xml and where it looked. An image
file under SRC the XML does not list is skipped and counted. A ``<track>`` (the
"CVAT for video" export) is an error: export as "CVAT for images" instead.

The XML is streamed (``iterparse``), each ``<image>`` dropped once read; what stays in memory until the
plan is made is each image's objects (as for COCO).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import math
import posixpath
import re
import xml.etree.ElementTree as ElementTree
from typing import BinaryIO, Callable, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, skip_reason
from beam_jobs.planning.listing import SkippedFiles
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.objects import annotated_plan

ANNOTATIONS = "annotations.xml"
# CVAT's subset names (free text; these are its project's defaults and their usual spellings) -> split.
_SUBSETS = {"": "train", "default": "train", **record_schema.SPLIT_NAMES}  # CVAT's "default": a task's only subset
_NOT_WRITTEN = {"tag": "tags (a label of the whole image, without a box)", "skeleton": "skeletons (keypoints)"}
_CUBOID_CORNER = re.compile(r"^[xy](?:tl|bl|tr|br)[12]$")
Reader = Callable[[str, str], bytes]


def claims(listing: Listing) -> bool:
    """SRC holds ``annotations.xml`` at its top (its images may lie anywhere under SRC: :class:`_Finder`)."""
    return any(path == ANNOTATIONS for path in listing.files)


class _Finder:
    """Where each ``<image name>`` of annotations.xml is under SRC, as CVAT's own importer matches its frames.

    First where CVAT's export puts it (``images/<subset>/<name>``, ``images/<name>``) or the name itself
    (``dataset/cat/1.jpg`` beside annotations.xml); else anywhere under SRC, the one image file whose path
    without its extension ends with the name's parts without its extension (CVAT's ``match_frame_fuzzy``: a
    task made of class folders names ``cat/1.jpg``, and its images may lie in ``dataset/cat/``). Several such
    files: the one of the name's extension, or in a folder named after the image's subset; else the image is
    rejected naming them (``ambiguous-path``).
    """

    def __init__(self, located: dict[str, str]) -> None:
        self.located = located
        self.found = self.missing = 0
        self.first_missing = ""
        self._by_stem: Optional[dict[str, list[str]]] = None

    def find(self, name: str, subset: str) -> tuple[str, str]:
        """``(relpath, locator)`` of the image ``name`` (a refusal, naming where it looked, when not found)."""
        candidates = ([posixpath.join("images", subset, name)] if subset else []) + [posixpath.join("images", name)]
        safe = annotated_plan.source_of(candidates[0], self.located)
        if safe.startswith(archive_members.REFUSED):  # leaves SRC: never looked for
            return candidates[0], safe
        candidates.append(name)
        for path in candidates:
            if path in self.located:
                self.found += 1
                return path, self.located[path]
        matches = self._ending_with(name, subset)
        if len(matches) == 1:
            self.found += 1
            return matches[0], self.located[matches[0]]
        if matches:
            self.found += 1
            return candidates[0], archive_members.refusal("ambiguous-path", (
                f"{ANNOTATIONS} names {name}, and {len(matches)} files under --src end with that name "
                f"({', '.join(map(display_path, matches[:3]))}{' ...' if len(matches) > 3 else ''}): keep one, or "
                "give the image its path from --src in the XML"))
        self.missing += 1
        self.first_missing = self.first_missing or name
        return candidates[0], archive_members.refusal("missing-file", (
            f"{ANNOTATIONS} names {name}, but it is not at {', '.join(map(display_path, dict.fromkeys(candidates)))} "
            "nor anywhere under --src by that name"))

    def _ending_with(self, name: str, subset: str) -> list[str]:
        """The image files whose path without extension ends with ``name``'s; of several, those of its extension,
        then those in a folder named after its subset (a project's ``img0.jpg`` is in each subset)."""
        if self._by_stem is None:
            self._by_stem = {}
            for path in sorted(self.located):
                if formats.has_image_extension(path) and not skip_reason(path, None):
                    stem = posixpath.splitext(path.rpartition("/")[2])[0]
                    self._by_stem.setdefault(stem, []).append(path)
        parts = posixpath.splitext(name)[0].split("/")
        matches = [path for path in self._by_stem.get(parts[-1], ())
                   if posixpath.splitext(path)[0].split("/")[-len(parts):] == parts]
        for keep in (lambda path: path.endswith(posixpath.splitext(name)[1] or "/"),
                     lambda path: bool(subset) and subset in path.split("/")[:-len(parts)]):
            kept = [path for path in matches if keep(path)]
            matches = kept if len(matches) > 1 and kept else matches
        return matches


def plan(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
         scratch: Optional[str] = None) -> InputPlan:
    """The plan of a CVAT for images export (see the module's docstring)."""
    src = options.src
    located = dict(listing.entries())
    where = display_path(f"{src}/{ANNOTATIONS}")
    skipped = SkippedFiles(listing.skipped, scratch)
    parsed = _Parsed(where, labels, _Finder(located))
    with _open(src, located.get(ANNOTATIONS, ""), read) as handle:
        _parse(handle, where, parsed, located)
    finder = parsed.finder
    if finder.missing and not finder.found:
        raise InputError(f"{where} lists {finder.missing} images, but none of them is under {display_path(src)}: "
                         f"looked for each at images/<subset>/<name>, images/<name> and <name>, and for any image "
                         f"file whose path ends with the name, as CVAT's importer matches them (the first: "
                         f"{display_path(finder.first_missing)}). Export the task with its images (\"Save images\"), "
                         "or put them under --src")
    if parsed.unknown_subsets:
        named = ", ".join(f"{name!r} ({count} image{'s' if count != 1 else ''})"
                          for name, count in sorted(parsed.unknown_subsets.items()))
        raise InputError(f"{where}: the subsets {named} say no split; the subsets read are Train, Validation (or Val, "
                         "Valid), Test and default (train), in any case: rename them in CVAT, or their subset=\"...\" "
                         "in the XML")
    classes = parsed.classes()
    warnings = []
    if parsed.duplicates:
        skipped["duplicate-in-annotations"] += parsed.duplicates
        warnings.append(f"{where}: {parsed.duplicates} <image> elements name an image listed before: skipped")
    if parsed.not_written:
        warnings.append(f"{where}: not written: " + ", ".join(f"{count} {_NOT_WRITTEN.get(kind, f'<{kind}>')}"
                                                             for kind, count in sorted(parsed.not_written.items())))
    unlisted = []
    for path in sorted(located):  # every file of SRC not read, skipped and named with its reason
        if path in parsed.seen or path == ANNOTATIONS or skip_reason(path, skipped):
            continue
        if formats.has_image_extension(path):
            unlisted.append(path)
            skipped.add(path, "not-in-annotations", f"an image that no <image> of {ANNOTATIONS} names")
        else:
            skipped.add(path, "not-in-layout", f"neither {ANNOTATIONS} nor an image it names")
    if unlisted:
        warnings.append(f"{len(unlisted)} image{'s' if len(unlisted) != 1 else ''} under {display_path(src)} "
                        f"{'are' if len(unlisted) != 1 else 'is'} in no <image> of {ANNOTATIONS}: skipped "
                        f"({', '.join(display_path(p) for p in unlisted[:3])}{' ...' if len(unlisted) > 3 else ''})")
    made = annotated_plan.plan(src, parsed.images, classes, options.val_fraction, options.seed, skipped, warnings,
                               None, scratch=scratch)
    return dataclasses.replace(made, skipped_files=skipped)


def _open(src: str, source: str, read: Reader) -> BinaryIO:
    """``annotations.xml``: streamed from its file, or an archive member's bytes (the export's zip)."""
    if source:
        return io.BytesIO(read(ANNOTATIONS, source))
    try:
        return FileSystems.open(FileSystems.join(src, ANNOTATIONS))
    except OSError as err:
        raise InputError(f"{display_path(f'{src}/{ANNOTATIONS}')} could not be read: {err}") from err


class _Parsed:
    """What the XML says, gathered as it streams: labels, subsets, then the images with their objects."""

    def __init__(self, where: str, labels: Optional[Sequence[str]], finder: _Finder) -> None:
        self.where, self.given, self.finder = where, labels, finder
        self.meta_labels: list[str] = []  # in listed order, each once
        self.meta_subset = ""  # a task's or job's <subset>
        self.images: list[annotated_plan.AnnotatedImage] = []
        self.seen: set[str] = set()  # the images' paths
        self.duplicates = 0
        self.not_written: collections.Counter[str] = collections.Counter()
        self.unknown_subsets: collections.Counter[str] = collections.Counter()  # subset names that say no split
        self._class_id: Optional[dict[str, int]] = None

    def classes(self) -> tuple[str, ...]:
        """Names by id, 0 the background: ``--labels``, or the meta's labels, from 1."""
        names = list(self.given) if self.given is not None else self.meta_labels
        if not names:
            raise InputError(f"{self.where}: its <meta> lists no <labels>; give the class names with --labels")
        return ("",) + tuple(names)

    def class_id(self) -> dict[str, int]:
        if self._class_id is None:
            self._class_id = {name: index for index, name in enumerate(self.classes()) if name}
        return self._class_id


def _parse(handle: BinaryIO, where: str, parsed: _Parsed, located: dict[str, str]) -> None:
    """Stream the XML into ``parsed``: ``<meta>``'s labels and subset, then each ``<image>``, dropped once read."""
    path: list[str] = []
    root = None
    try:
        for event, element in ElementTree.iterparse(handle, events=("start", "end")):
            if event == "start":
                if root is None:
                    root = element
                    if element.tag != "annotations":
                        raise InputError(f"{where} is not CVAT's annotations.xml: its root is <{element.tag}>, not "
                                         "<annotations>")
                path.append(element.tag)
                if path == ["annotations", "track"]:
                    raise InputError(f"{where} holds <track> elements: it is a \"CVAT for video\" export; export "
                                     "the task as \"CVAT for images 1.1\"")
                continue
            if len(path) == 5 and path[:2] == ["annotations", "meta"] and path[3:] == ["labels", "label"]:
                name = (element.findtext("name") or "").strip()
                if name and not (element.findtext("parent") or "").strip() and name not in parsed.meta_labels:
                    parsed.meta_labels.append(name)
            elif len(path) == 4 and path[:2] == ["annotations", "meta"] and path[2] in ("task", "job") \
                    and path[3] == "subset":
                parsed.meta_subset = (element.text or "").strip()
            elif path == ["annotations", "image"]:
                _image(element, parsed, located)
                root.clear()  # the images read so far: their objects are in parsed
            path.pop()
    except ElementTree.ParseError as err:
        raise InputError(f"{where} is not valid XML: {err}") from err
    except OSError as err:
        raise InputError(f"{where} could not be read: {err}") from err


def _image(element: ElementTree.Element, parsed: _Parsed, located: dict[str, str]) -> None:
    """One ``<image>``: its path, split and objects, appended to ``parsed``."""
    name = element.get("name", "")
    subset = element.get("subset")
    split = _SUBSETS.get((parsed.meta_subset if subset is None else subset).strip().lower())
    if split is None:  # named with the others once the XML is read
        parsed.unknown_subsets[parsed.meta_subset if subset is None else subset] += 1
        return
    relpath, source = parsed.finder.find(name, subset or "")
    if relpath in parsed.seen:
        parsed.duplicates += 1
        return
    parsed.seen.add(relpath)
    try:
        frame = (int(element.get("width", "")), int(element.get("height", "")))
    except ValueError:
        frame = annotations.STORED
    if min(frame) <= 0:
        frame = annotations.STORED
    class_id = parsed.class_id()
    boxes, rejected = [], []
    numbers: collections.Counter[str] = collections.Counter()
    for shape in element:
        kind = shape.tag
        if kind == "attribute":
            continue
        numbers[kind] += 1
        label = f"{ANNOTATIONS} image {display_path(name)} {kind} {numbers[kind]}"
        if kind in _NOT_WRITTEN:
            parsed.not_written[kind] += 1
            continue
        extent = _extent(shape)
        if extent is None:
            if kind in ("box", "polygon", "polyline", "points", "ellipse", "cuboid", "mask"):
                rejected.append((label, annotations.BAD_ANNOTATION, f"its coordinates do not parse: "
                                 f"{str(dict(shape.attrib))[:100]}"))
            else:
                parsed.not_written[kind] += 1
            continue
        class_name = shape.get("label", "")
        if class_name not in class_id:
            known = "--labels" if parsed.given is not None else "the labels of <meta>"
            rejected.append((label, annotations.UNKNOWN_CLASS, f"label {class_name!r} is not in {known}"
                             + annotated_plan.did_you_mean(class_name, class_id)))
            continue
        boxes.append(annotations.Box(label, class_id[class_name], *extent))
    objects = annotations.Objects(annotated_plan.derived_source_id(relpath), tuple(boxes), frame, True,
                                  tuple(rejected))
    parsed.images.append(annotated_plan.AnnotatedImage(split, relpath, objects, source))


def _extent(shape: ElementTree.Element) -> Optional[tuple[float, float, float, float]]:
    """``(xmin, ymin, xmax, ymax)`` of a shape in its image's pixels; None when it has no coordinates that parse."""
    get = shape.attrib
    try:
        if shape.tag == "box":
            x0, y0, x1, y1 = (float(get[key]) for key in ("xtl", "ytl", "xbr", "ybr"))
            angle = math.radians(float(get.get("rotation", 0)))
            if angle:  # rotated about its centre: the extent of its turned corners
                cx, cy, w, h = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2
                dx = abs(w * math.cos(angle)) + abs(h * math.sin(angle))
                dy = abs(w * math.sin(angle)) + abs(h * math.cos(angle))
                return cx - dx, cy - dy, cx + dx, cy + dy
            return x0, y0, x1, y1
        if shape.tag == "mask":  # left, top: its first pixel; width, height: pixels
            left, top, width, height = (float(get[key]) for key in ("left", "top", "width", "height"))
            return left, top, left + width, top + height
        if shape.tag == "ellipse":
            cx, cy, rx, ry = (float(get[key]) for key in ("cx", "cy", "rx", "ry"))
            angle = math.radians(float(get.get("rotation", 0)))
            dx = math.hypot(rx * math.cos(angle), ry * math.sin(angle))
            dy = math.hypot(rx * math.sin(angle), ry * math.cos(angle))
            return cx - dx, cy - dy, cx + dx, cy + dy
        if shape.tag == "cuboid":
            xs = [float(value) for key, value in get.items() if _CUBOID_CORNER.match(key) and key[0] == "x"]
            ys = [float(value) for key, value in get.items() if _CUBOID_CORNER.match(key) and key[0] == "y"]
        elif "points" in get:  # polygon, polyline, points: "x1,y1;x2,y2;..."
            pairs = [pair.split(",") for pair in get["points"].split(";") if pair.strip()]
            if any(len(pair) != 2 for pair in pairs):
                return None
            xs, ys = [float(x) for x, _ in pairs], [float(y) for _, y in pairs]
        else:
            return None
    except (KeyError, ValueError):
        return None
    return (min(xs), min(ys), max(xs), max(ys)) if xs and ys else None
