"""Pascal VOC as it ships: ``VOCdevkit/VOC20xx/{Annotations, JPEGImages, ImageSets/Main}``.

In:  SRC holding ``Annotations/`` and ``JPEGImages/`` (at its top, in ``VOC20xx/`` or in
     ``VOCdevkit/VOC20xx/``; VOC2007 and VOC2012 side by side are both read), an XML file per image:
     ``size``, and each ``object``'s ``name``, ``difficult``, ``truncated`` and ``bndbox``.
Out: the plan (:mod:`beam_jobs.sources.objects.annotated_plan`) of the images that ``ImageSets/Main/{train,val,test}.txt``
     list (``trainval`` is their union, read only when ``train`` and ``val`` are missing); without
     ``ImageSets/Main``, every annotated image is train.

With ``--masks``, the images of ``ImageSets/Segmentation`` instead, each with its ``SegmentationClass/<id>.png``
(palette indexes: VOC's class ids, 0 background, 255 the void outline) as ``image/segmentation/class/encoded``.

``bndbox`` is 1-based and inclusive: a box of ``xmin 1 .. xmax 10`` covers the first ten pixels, whose
edges in 0-based pixel coordinates are 0 and 10. So the box written is ``xmin - 1 .. xmax`` (TFDS and the
OD API's script drop the ``- 1``, a pixel off).

Class ids, without ``--labels``: the OD API's ``pascal_label_map.pbtxt`` (VOC's 20, alphabetical, 1-20, 0 left
for the background) when at least half of the distinct names are VOC's; each object of another name (a typo,
``Dog``, ``persn``) is then rejected as ``unknown-class`` with the near VOC name (``'Dog' is not a VOC class:
did you mean 'dog'?``) and a warning counts them, so one odd name never renumbers every class. When fewer than
half the names are VOC's (none in a dataset of one's own classes in VOC's format), the sorted names number from
1, and a warning says so. With ``--labels``, its order from 1, and an object of a name it lacks is rejected.
A class name holding a control character or a line break is refused at planning, naming its XML.

Rejected objects are named by their XML (``VOC2012/Annotations/2008_000001.xml object 2``). An image whose XML
cannot be read is rejected as a whole (``bad-annotation``): written without its objects, it would teach a
detector that they are background. A listed image whose ``JPEGImages/<id>.jpg`` (or another image extension)
is missing is rejected as ``missing-file`` naming its XML; an XML that no split list names and whose image is
missing is named in a warning.
"""

from __future__ import annotations

import collections
import difflib
import posixpath
import re
import struct
import xml.etree.ElementTree as ElementTree
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.objects import annotated_plan
from beam_jobs.stage_records import ImageRef

# The OD API's pascal_label_map.pbtxt: VOC's 20 classes, alphabetical, ids 1-20.
VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")
_LISTS = ("train", "val", "test")  # ImageSets' list files, each the split record_schema.split_named says
Reader = Callable[[str, str], bytes]


_IN_ROOT = re.compile(r"^(?P<root>(?:[^/]+/){0,2}?)(?P<kind>Annotations|JPEGImages)/[^/]+$")


def roots(listing: Listing) -> list[str]:
    """Every folder of SRC (``""`` for SRC itself, at most two levels down) whose ``Annotations/`` and
    ``JPEGImages/`` both hold files; one pass over the listing (object stores list no folders)."""
    found: dict[str, set[str]] = {}
    for path in listing.files:
        if "Annotations/" not in path and "JPEGImages/" not in path:  # a substring test first: 1.28M paths
            continue
        match = _IN_ROOT.match(path)
        if match:
            found.setdefault(match["root"].rstrip("/"), set()).add(match["kind"])
    return sorted(root for root, kinds in found.items() if len(kinds) == 2)


def claims(listing: Listing) -> bool:
    return bool(roots(listing))


# An object held until the class ids are known: its name's index, its bndbox as VOC writes it, difficult, truncated
# (38 bytes, where a tuple of its fields took hundreds).
_PACKED = struct.Struct("<IddddBB")


class _Listed(NamedTuple):
    """One image a split list names: its XML read, its objects packed, or what is wrong with it."""

    split: str
    image: str  # "" when its JPEGImages/ has no such image
    xml: str
    frame: tuple[int, int]
    problem: str  # the XML's problem, or ""
    packed: bytes


def plan(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
         scratch: Optional[str] = None) -> InputPlan:
    """The plan of a Pascal VOC dataset (see the module's docstring)."""
    src = options.src
    located = dict(listing.entries())
    skipped: collections.Counter[str] = collections.Counter(listing.skipped)
    warnings: list[str] = []
    lists = "Segmentation" if options.masks else "Main"
    wanted = [entry for root in roots(listing) for entry in _wanted(src, root, located, read, lists, skipped, warnings)]
    names: dict[str, int] = {}  # class name -> its index in the packed objects
    counts: collections.Counter[str] = collections.Counter()  # objects by class name
    listed = list(_read(wanted, located, read, names, counts))
    classes, note = _classes(counts, labels)
    if note:
        warnings.append(f"{display_path(src)}: {note}")
    unknown = collections.Counter({name: count for name, count in counts.items() if name not in classes})
    refused = [_refused(entry) for entry in listed if entry.problem or not entry.image]
    if unknown:
        shown = ", ".join(f"{name!r}" + (f" x{count}" if count > 1 else "") + _near(name, classes)
                          for name, count in unknown.most_common(5))
        warnings.append(f"{display_path(src)}: {sum(unknown.values())} objects name a class "
                        f"{'--labels does not list' if labels is not None else 'VOC does not have'} ({shown}"
                        f"{' ...' if len(unknown) > 5 else ''}): rejected as unknown-class (each in rejected.jsonl, "
                        "by its XML); fix the names in the XML files"
                        + ("" if labels is not None else ", or, if they are classes of their own, list every class "
                           "name of the dataset, one a line, in --labels"))
    if not listed:
        raise InputError(f"{src}: its VOC split lists (ImageSets/{lists}/*.txt) name no images")
    images = _annotated((entry for entry in listed if not (entry.problem or not entry.image)), list(names), classes,
                        located, options.masks, labels is not None)
    seg = {record_schema.SEGMENTATION_ENCODED: "bytes", record_schema.SEGMENTATION_FORMAT: "bytes"}
    return annotated_plan.plan(src, images, classes, options.val_fraction, options.seed, skipped, warnings, None, refused,
                               scratch=scratch, extra_features=seg if options.masks else None)


def _wanted(src: str, root: str, located: dict, read: Reader, lists: str, skipped: collections.Counter,
            warnings: list[str]) -> list[tuple[str, str, str]]:
    """``(split, image or "", XML)`` of each image ``root``'s split lists name; the images no list names, and
    the XMLs of no listed image and no image, counted and named in ``warnings``."""
    images_of = _images_by_id(root, located)
    wanted = [(split, images_of.get(image_id, ""), posixpath.join(root, "Annotations", f"{image_id}.xml"))
              for split, image_id in _listed(root, located, read, lists)]
    listed = {image for _, image, _ in wanted}
    unlisted = sorted(p for p in located if p.startswith(posixpath.join(root, "JPEGImages") + "/")
                      and p not in listed)
    skipped["not-in-split-lists"] += len(unlisted)
    if unlisted:
        warnings.append(f"{len(unlisted)} image{'s' if len(unlisted) != 1 else ''} of {display_path(src)}/"
                        f"{root or '.'}/JPEGImages are in no split list of ImageSets/{lists}: skipped "
                        f"({_some(unlisted)})")
    read_xml = {xml for _, _, xml in wanted if xml in located}
    orphans = sorted(p for p in located if _xml_id(root, p) is not None and p not in read_xml
                     and _xml_id(root, p) not in images_of)
    if orphans:
        warnings.append(f"{len(orphans)} annotation file{'s' if len(orphans) != 1 else ''} of "
                        f"{display_path(src)}/{root or '.'}/Annotations have no image in JPEGImages and are in no "
                        f"split list of ImageSets/{lists}: not read ({_some(orphans)})")
    return wanted


def _read(wanted: Sequence[tuple[str, str, str]], located: dict, read: Reader, names: dict[str, int],
          counts: collections.Counter) -> Iterator[_Listed]:
    """Each wanted image's XML, read :data:`annotated_plan.READERS` at a time in order, parsed, its objects
    packed; ``names`` and ``counts`` gather the class names met."""
    xmls = ((xml, located[xml]) if xml in located else None for _, _, xml in wanted)
    for (split, image, xml), data in zip(wanted, annotated_plan.read_in_order(read, xmls)):
        if data is None:
            missing = image or posixpath.join(posixpath.dirname(posixpath.dirname(xml)), "JPEGImages",
                                              posixpath.basename(xml)[:-len(".xml")] + ".jpg")
            yield _Listed(split, missing, xml, annotations.STORED, f"{display_path(xml)} is missing", b"")
            continue
        result = _parse(data, display_path(xml))
        if isinstance(result, str):
            yield _Listed(split, image, xml, annotations.STORED, result, b"")
            continue
        frame, objects = result
        packed = bytearray()
        for index, (name, x0, y0, x1, y1, difficult, truncated) in enumerate(objects, start=1):
            problem = annotations.class_name_problem(name, f"{display_path(xml)} object {index}")
            if problem:
                raise InputError(problem)
            counts[name] += 1
            packed += _PACKED.pack(names.setdefault(name, len(names)), x0, y0, x1, y1, difficult, truncated)
        yield _Listed(split, image, xml, frame, "", bytes(packed))


def _refused(entry: _Listed) -> ImageRef:
    """An image refused whole: its XML cannot be read, or its image is not there."""
    if entry.problem:
        return ImageRef(entry.split, entry.image, 0, archive_members.refusal(annotations.BAD_ANNOTATION, entry.problem))
    stem = posixpath.splitext(posixpath.basename(entry.xml))[0]
    expected = posixpath.join(posixpath.dirname(posixpath.dirname(entry.xml)), "JPEGImages", f"{stem}.jpg")
    return ImageRef(entry.split, expected, 0, archive_members.refusal(
        "missing-file", f"{display_path(entry.xml)} annotates it, but {display_path(expected)} (or another image "
        "extension) is not there"))


def _annotated(listed: Iterable[_Listed], names: Sequence[str], classes: Sequence[str], located: dict, masks: bool,
               given: bool) -> Iterator[annotated_plan.AnnotatedImage]:
    """The listed images with their objects, class ids now known, made as the plan takes them."""
    class_id = {name: index for index, name in enumerate(classes) if name}
    for split, image, xml_path, frame, _, packed in listed:
        boxes, rejected = [], []
        for index, (name_index, x0, y0, x1, y1, difficult, truncated) in enumerate(_PACKED.iter_unpack(packed), 1):
            name, label = names[name_index], f"{display_path(xml_path)} object {index}"
            if name not in class_id:
                rejected.append((label, annotations.UNKNOWN_CLASS, _unknown_detail(name, classes, given)))
                continue
            boxes.append(annotations.Box(label, class_id[name], x0 - 1, y0 - 1, x1, y1, -1.0, False, bool(difficult),
                                         bool(truncated)))
        class_mask = ()
        if masks:  # SegmentationClass/<id>.png beside JPEGImages/<id>.jpg
            mask = posixpath.join(posixpath.dirname(posixpath.dirname(image)), "SegmentationClass",
                                  posixpath.splitext(posixpath.basename(image))[0] + ".png")
            class_mask = (mask, located.get(mask, ""))
        objects_value = annotations.Objects(annotated_plan.derived_source_id(image), tuple(boxes), frame, False,
                                            tuple(rejected), class_mask=class_mask)
        yield annotated_plan.AnnotatedImage(split, image, objects_value, annotated_plan.source_of(image, located))


def _some(paths: Sequence[str]) -> str:
    return ", ".join(map(display_path, paths[:3])) + (" ..." if len(paths) > 3 else "")


def _images_by_id(root: str, located: dict) -> dict[str, str]:
    """Each image of ``root``'s ``JPEGImages/`` by its id (its name without extension): ``<id>.jpg`` as VOC
    ships, or another image extension (a dataset of one's own in VOC's layout)."""
    prefix = posixpath.join(root, "JPEGImages") + "/"
    found: dict[str, str] = {}
    for path in sorted(located):
        name = path[len(prefix):] if path.startswith(prefix) else ""
        if name and formats.has_image_extension(name):
            image_id = posixpath.splitext(name)[0]
            if image_id not in found or name.endswith(".jpg"):
                found[image_id] = path
    return found


def _xml_id(root: str, path: str) -> Optional[str]:
    """The image id of an annotation file of ``root``'s ``Annotations/``, or None for another path."""
    prefix = posixpath.join(root, "Annotations") + "/"
    name = path[len(prefix):] if path.startswith(prefix) else ""
    return name[:-len(".xml")] if name.endswith(".xml") else None


def _listed(root: str, located: dict, read: Reader, kind: str = "Main") -> list[tuple[str, str]]:
    """``(split, image id)`` from ``ImageSets/<kind>`` (Main, or Segmentation with --masks), or every
    annotated image as train when it has none."""
    lists = posixpath.join(root, "ImageSets", kind)
    def ids(name: str) -> Optional[list[str]]:
        path = posixpath.join(lists, f"{name}.txt")
        if path not in located:
            return None
        return [line.split()[0] for line in read(path, located[path]).decode("utf-8-sig").splitlines() if line.split()]
    found = [(record_schema.split_named(name), image_id) for name in _LISTS for image_id in ids(name) or []]
    if not any(split in ("train", "validation") for split, _ in found):
        found += [("train", image_id) for image_id in ids("trainval") or []]
    if not found:
        prefix = posixpath.join(root, "Annotations") + "/"
        found = [("train", posixpath.splitext(p[len(prefix):])[0]) for p in sorted(located)
                 if p.startswith(prefix) and p.endswith(".xml")]
    return found


def _parse(data: bytes, where: str):
    """``((width, height) or STORED, [(name, xmin, ymin, xmax, ymax, difficult, truncated)])``, or what is wrong."""
    try:
        tree = ElementTree.fromstring(data)
    except ElementTree.ParseError as err:
        return f"{where} is not valid XML: {err}"
    frame = annotations.STORED
    size = tree.find("size")
    if size is not None:
        try:
            width, height = int(size.findtext("width", "0")), int(size.findtext("height", "0"))
        except ValueError:
            width = height = 0
        if width > 0 and height > 0:
            frame = (width, height)
    objects = []
    for index, item in enumerate(tree.findall("object"), start=1):
        box = item.find("bndbox")
        try:
            corners = [float(box.findtext(key)) for key in ("xmin", "ymin", "xmax", "ymax")]
        except (AttributeError, TypeError, ValueError):
            return f"{where}: object {index} has no bndbox of four numbers"
        name = (item.findtext("name") or "").strip()
        if not name:
            return f"{where}: object {index} has no name"
        objects.append((name, *corners, _flag(item, "difficult"), _flag(item, "truncated")))
    return frame, objects


def _flag(item, key: str) -> bool:
    return (item.findtext(key) or "0").strip() in ("1", "true", "True")


def _classes(found: Mapping[str, int], labels: Optional[Sequence[str]]) -> tuple[tuple[str, ...], str]:
    """Names by id, id 0 the background, and what a warning should say of them: ``--labels`` from 1; VOC's 20
    as the OD API numbers them when at least half of the names found are VOC's (the others are rejected as
    unknown); else the names found, sorted, from 1."""
    if labels is not None:
        return ("",) + tuple(labels), ""
    voc = [name for name in found if name in VOC_CLASSES]
    if 2 * len(voc) >= len(found):
        return ("",) + VOC_CLASSES, ""
    custom = sorted(name for name in found if name not in VOC_CLASSES)
    shown = ", ".join(map(repr, custom[:5])) + (" ..." if len(custom) > 5 else "")
    return ("",) + tuple(sorted(found)), (
        f"{len(custom)} of the {len(found)} class names of its VOC annotations are not VOC's 20 ({shown}): "
        f"its classes are numbered 1-{len(found)} in sorted order, not as the OD API's pascal_label_map.pbtxt; "
        "give --labels to number them otherwise")


def _near_match(name: str, classes: Sequence[str]) -> Optional[str]:
    """The known class an unknown name may have meant (``Dog``: ``dog``; ``persn``: ``person``), or None."""
    known = [c for c in classes if c]
    near = [c for c in known if c.lower() == name.lower()] or difflib.get_close_matches(name, known, n=1) \
        or difflib.get_close_matches(name.lower(), known, n=1)
    return near[0] if near else None


def _near(name: str, classes: Sequence[str]) -> str:
    near = _near_match(name, classes)
    return f" (did you mean {near!r}?)" if near else ""


def _unknown_detail(name: str, classes: Sequence[str], given: bool) -> str:
    """An unknown class name, and the known one it may have meant (``'Dog' is not a VOC class: did you mean
    'dog'?``)."""
    near = _near_match(name, classes)
    detail = f"{name!r} is not {'in --labels' if given else 'a VOC class'}"
    return detail + (f": did you mean {near!r}?" if near else "")
