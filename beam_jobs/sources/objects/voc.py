"""Pascal VOC as it ships (``VOCdevkit/VOC20xx/{Annotations, JPEGImages, ImageSets/Main}``), and as Roboflow exports it.

In:  SRC holding ``Annotations/`` and ``JPEGImages/`` (at its top, in ``VOC20xx/`` or in
     ``VOCdevkit/VOC20xx/``; VOC2007 and VOC2012 side by side are both read), an XML file per image:
     ``size``, and each ``object``'s ``name``, ``difficult``, ``truncated`` and ``bndbox``. Or folders holding
     each image's XML beside it (``train/a.jpg``, ``train/a.xml``: Roboflow's Pascal VOC export, LabelImg's
     folders; :func:`flat_roots`), whose folder's name is their split (``train``, ``valid``, ``test``; else
     train). Both kinds in one SRC are all read (a VOC ``train/`` beside a Roboflow ``valid/``).
Out: the plan (:mod:`beam_jobs.sources.objects.annotated_plan`) of the images that ``ImageSets/Main/{train,val,test}.txt``
     list (``trainval`` is their union, read only when ``train`` and ``val`` are missing); without
     ``ImageSets/Main``, every annotated image, in the split its root's name says (``valid/``), else train.

With ``--masks``, the images of ``ImageSets/Segmentation`` instead, each with its ``SegmentationClass/<id>.png``
(palette indexes: VOC's class ids, 0 background, 255 the void outline) as ``image/segmentation/class/encoded``,
and, where SRC has ``SegmentationObject/``, each object's mask as ``image/object/mask``
(:mod:`beam_jobs.sources.objects.voc_masks`: checked against the class mask). A root without segmentation lists
is read by its ``Main`` lists, and its images without masks are skipped and counted (``no-mask``).

``bndbox`` is 1-based and inclusive: a box of ``xmin 1 .. xmax 10`` covers the first ten pixels, whose
edges in 0-based pixel coordinates are 0 and 10. So the box written is ``xmin - 1 .. xmax`` (TFDS and the
OD API's script drop the ``- 1``, a pixel off).

Class ids, without ``--labels``: when some name is one of VOC's 20, the OD API's ``pascal_label_map.pbtxt`` (VOC's
20, alphabetical, 1-20, 0 left for the background), then each name with no near match among them as a class of its
own, sorted, numbered 21, 22, ... (a warning names them); a near miss (another case, a plural, one edit, COCO's
name: ``Dog``, ``dogs``, ``persn``, ``airplane``; :func:`near_voc`) is no class: its objects are rejected as
``unknown-class`` with the VOC name meant (``'Dog' is not a VOC class: did you mean 'dog'?``), which rejects their
images (:func:`beam_jobs.annotations.unwritable`), and a warning counts them. When no name is VOC's (a dataset of
one's own classes in VOC's format), the sorted names number from 1, and a warning says so. With ``--labels``, its
order from 1, and an object of a name it lacks is rejected (with the listed name it may have meant).
A class name holding a control character or a line break is refused at planning, naming its XML.

Rejected objects are named by their XML (``VOC2012/Annotations/2008_000001.xml object 2``). An image whose XML
cannot be read is rejected as a whole (``bad-annotation``): written without its objects, it would teach a
detector that they are background. A listed image whose ``JPEGImages/<id>.jpg`` (or another image extension)
is missing is rejected as ``missing-file`` naming its XML; an XML that no split list names and whose image is
missing is named in a warning.
"""

from __future__ import annotations

import collections
import dataclasses
import posixpath
import re
from typing import Callable, Iterable, Iterator, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats, masks
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, skip_reason
from beam_jobs.planning.listing import SkippedFiles
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.objects import annotated_plan, voc_classes, voc_masks, voc_xml
from beam_jobs.stage_records import ImageRef

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


def flat_roots(listing: Listing) -> list[str]:
    """Every folder of SRC (``""`` for SRC itself, at most two levels down; no ``Annotations/``) holding a VOC
    XML beside an image of the same stem (``a.xml`` beside ``a.jpg``): Roboflow's Pascal VOC export (``train/``,
    ``valid/``, ``test/``), LabelImg's folders. Two passes: the folders holding ``.xml`` files, then their images."""
    xml_stems: dict[str, set[str]] = {}
    for path in listing.files:
        if not path.endswith(".xml"):
            continue
        folder, _, name = path.rpartition("/")
        if folder.count("/") < 2 and name != "annotations.xml" and posixpath.basename(folder) != "Annotations":
            xml_stems.setdefault(folder, set()).add(name[:-len(".xml")])
    if not xml_stems:  # ImageNet's 1.28M images: one pass, a suffix test each
        return []
    found = set()
    for path in listing.files:
        folder, _, name = path.rpartition("/")
        stems = xml_stems.get(folder)
        if stems and folder not in found and formats.has_image_extension(name) and \
                posixpath.splitext(name)[0] in stems:
            found.add(folder)
    return sorted(found)


def claims(listing: Listing) -> bool:
    return bool(roots(listing)) or bool(flat_roots(listing))


def root_split(root: str) -> str:
    """The split a VOC root's own name says (Roboflow's ``valid/``: validation), else train."""
    return record_schema.split_named(posixpath.basename(root)) or "train"


def plan(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
         scratch: Optional[str] = None) -> InputPlan:
    """The plan of a Pascal VOC dataset (see the module's docstring)."""
    src = options.src
    located = dict(listing.entries())
    skipped = SkippedFiles(listing.skipped, scratch)
    flat, standard = flat_roots(listing), roots(listing)
    kinds = {root: voc_masks.list_kind(root, located, options.masks) for root in standard}
    instance_roots, warnings = voc_masks.instance_roots(standard, located, options.masks)  # decided a root
    instances = bool(instance_roots)
    if options.masks:
        _check_masks(display_path(src), standard, flat, instances, labels)
    wanted = [entry for root in standard for entry in _wanted(src, root, located, read, kinds[root], warnings)]
    wanted += [entry for root in flat for entry in _wanted_flat(src, root, located, warnings)]
    used = {path for _, image, xml in wanted for path in (image, xml)}
    used |= {posixpath.join(root, "ImageSets", kind, f"{name}.txt") for root, kind in kinds.items()
             for name in (*_LISTS, "trainval")}
    if options.masks:
        used |= {voc_masks.mask_path(image, folder) for _, image, _ in wanted if image
                 for folder in (voc_masks.CLASS_FOLDER, voc_masks.OBJECT_FOLDER)}
    elif voc_masks.held(standard, located, voc_masks.CLASS_FOLDER):
        warnings.append(f"{display_path(src)}: the masks of {voc_masks.CLASS_FOLDER}/ and {voc_masks.OBJECT_FOLDER}/ "
                        "are not read without --masks (skipped, in skipped.jsonl); --masks converts "
                        "ImageSets/Segmentation's images with each image's class mask and each object's mask")
    _account(located, used, standard, flat, skipped, kinds)
    names: dict[str, int] = {}  # class name -> its index in the packed objects
    counts: collections.Counter[str] = collections.Counter()  # objects by class name
    listed = list(voc_xml.read_xmls(wanted, located, read, names, counts))
    classes, note = voc_classes.classes_of(counts, labels)
    if note:
        warnings.append(f"{display_path(src)}: {note}")
    refused = [_refused(entry) for entry in listed if entry.problem]
    warnings += _unknown_classes(display_path(src), counts, classes, labels is not None,
                                 options.encode.keep_partial_images)
    if not listed:
        raise InputError(f"{src}: its VOC split lists (ImageSets/{'|'.join(sorted(set(kinds.values())))}/*.txt) "
                         "name no images")
    if options.masks:  # each image without its mask named, not only counted
        segmented = {root for root, kind in kinds.items() if kind == "Segmentation"}
        listed, without_mask, said = voc_masks.with_masks(listed, located, instance_roots, segmented, skipped)
        refused += without_mask
        warnings += said
    kept = [entry for entry in listed if not entry.problem]
    pngs = voc_masks.read_pairs(read, located, [entry.image for entry in kept], instance_roots) if instances \
        else None
    images = _annotated(kept, list(names), classes, located, options.masks, labels is not None, pngs)
    seg = {record_schema.SEGMENTATION_ENCODED: "bytes", record_schema.SEGMENTATION_FORMAT: "bytes",
           **({record_schema.OBJECT_MASK: "bytes_list"} if instances else {})}
    made = annotated_plan.plan(src, images, classes, options.val_fraction, options.seed, skipped, warnings, None,
                               refused, scratch=scratch, extra_features=seg if options.masks else None)
    # Pascal's ids the dataset does not use are the OD API's label map, not classes gone missing: no warning.
    reserved = tuple(name for name in voc_classes.VOC_CLASSES if name in classes and name not in counts) \
        if labels is None else ()
    return dataclasses.replace(made, skipped_files=skipped, unlisted=reserved)


def _check_masks(where: str, standard: Sequence[str], flat: Sequence[str], instances: bool,
                 labels: Optional[Sequence[str]]) -> None:
    """``--masks`` refused where it cannot be done: a --labels renumbering VOC's classes, instance masks without
    pycocotools, Roboflow's folders (no masks)."""
    if standard and (problem := voc_masks.labels_problem(labels, where)):
        raise InputError(problem)
    if instances:
        try:
            masks.check_available()
        except masks.MasksUnavailableError as err:
            raise InputError(str(err)) from err
    if flat:
        raise InputError(f"--masks reads VOC's ImageSets/Segmentation and SegmentationClass/, but {where} "
                         f"holds XMLs beside their images in {', '.join((r or '.') + '/' for r in flat[:3])} (Roboflow's "
                         "Pascal VOC export), which have no masks: leave --masks out")


def _unknown_classes(where: str, counts: collections.Counter, classes: Sequence[str], given: bool,
                     keep_partial: bool) -> list[str]:
    """The warning counting the objects whose class name is no class (``given``: not in --labels), or none."""
    unknown = collections.Counter({name: count for name, count in counts.items() if name not in classes})
    if not unknown:
        return []
    shown = ", ".join(f"{name!r}" + (f" x{count}" if count > 1 else "") + voc_classes.near(name, classes, given)
                      for name, count in unknown.most_common(5))
    return [f"{where}: {sum(unknown.values())} objects name a class "
            f"{'--labels does not list' if given else 'VOC nearly has'} ({shown}{' ...' if len(unknown) > 5 else ''}): "
            f"rejected as unknown-class, {'its image kept' if keep_partial else 'each with its image'} "
            "(named in rejected.jsonl, by its XML); fix the names in the XML files"
            + ("" if given else ", or, if they are classes of their own, list every class name of the dataset, one "
               "a line, in --labels")]


def _account(located: dict, used: set[str], standard: Sequence[str], flat: Sequence[str],
             skipped: SkippedFiles, kinds: dict[str, str]) -> None:
    """Every file of SRC the plan does not read, skipped and named with its reason (warned of already where
    it matters): an image of ``JPEGImages/`` in no split list (its XML too), an image without its XML beside it
    (Roboflow's layout) or an XML without its image, a list of ImageSets not read (``splits-from-segmentation``
    or ``-main``: ``kinds``, each root's lists), a hidden file, anything else outside the layout."""
    jpeg_folders = {posixpath.join(root, "JPEGImages") for root in standard}
    xml_folders = {posixpath.join(root, "Annotations") for root in standard}
    flat_folders = set(flat)
    for path in sorted(located):
        if path in used or skip_reason(path, skipped):
            continue
        folder = posixpath.dirname(path)
        if folder in jpeg_folders or folder in xml_folders and path.endswith(".xml"):
            skipped.add(path, "not-in-split-lists", "in no split list of ImageSets", warned=True)
        elif folder in flat_folders and path.endswith(".xml"):
            skipped.add(path, "no-image", "a VOC XML without its image beside it", warned=True)
        elif folder in flat_folders and formats.has_image_extension(path):
            skipped.add(path, "no-annotation", "an image without its VOC XML beside it")
        elif posixpath.basename(posixpath.dirname(folder)) == "ImageSets" and \
                posixpath.basename(folder) != kinds.get(posixpath.dirname(posixpath.dirname(folder)), "Main"):
            # Named for the lists the splits come from, so the run's summary says why these were not used.
            root = posixpath.dirname(posixpath.dirname(folder))
            kind = kinds.get(root, "Main")
            skipped.add(path, f"splits-from-{kind.lower()}", f"an ImageSets/{posixpath.basename(folder)} list: the "
                        f"splits of {root or '.'}/ come from ImageSets/{kind}/ ("
                        + ("--masks reads the images VOC segmented)" if kind == "Segmentation" else
                           "--masks reads ImageSets/Segmentation's where a root has them)"))
        elif posixpath.basename(posixpath.dirname(posixpath.dirname(path))) == "ImageSets":
            skipped.add(path, "not-in-layout", "a list of the ImageSets read that is no split list (a class's)")
        else:
            skipped.add(path, "not-in-layout", "neither an image the VOC annotations name nor one of their files")


def _wanted(src: str, root: str, located: dict, read: Reader, lists: str,
            warnings: list[str]) -> list[tuple[str, str, str]]:
    """``(split, image or "", XML)`` of each image ``root``'s split lists name; the images no list names, and
    the XMLs of no listed image and no image, counted and named in ``warnings``."""
    images_of = _images_by_id(root, located)
    wanted = [(split, images_of.get(image_id, ""), posixpath.join(root, "Annotations", f"{image_id}.xml"))
              for split, image_id in _listed(root, located, read, lists)]
    listed = {image for _, image, _ in wanted}
    unlisted = sorted(p for p in located if p.startswith(posixpath.join(root, "JPEGImages") + "/")
                      and p not in listed)
    if unlisted:
        warnings.append(f"{len(unlisted)} image{'s' if len(unlisted) != 1 else ''} of {display_path(src)}/"
                        f"{root or '.'}/JPEGImages are in no split list of ImageSets/{lists}: skipped "
                        f"({_some(unlisted)})" + ("; with --masks the splits are the images VOC segmented, "
                                                  "ImageSets/Segmentation's lists, not Main's"
                                                  if lists == "Segmentation" else ""))
    read_xml = {xml for _, _, xml in wanted if xml in located}
    orphans = sorted(p for p in located if _xml_id(root, p) is not None and p not in read_xml
                     and _xml_id(root, p) not in images_of)
    if orphans:
        warnings.append(f"{len(orphans)} annotation file{'s' if len(orphans) != 1 else ''} of "
                        f"{display_path(src)}/{root or '.'}/Annotations have no image in JPEGImages and are in no "
                        f"split list of ImageSets/{lists}: not read ({_some(orphans)})")
    return wanted


def _wanted_flat(src: str, folder: str, located: dict, warnings: list[str]) -> list[tuple[str, str, str]]:
    """``(split, image, XML)`` of each XML of ``folder`` beside its image (the split: the folder's name, else
    train); an image without an XML is skipped and counted (``no-annotation``), an XML without an image is a
    missing image (``image`` ""), rejected by :func:`_refused`."""
    prefix = folder + "/" if folder else ""
    xmls, images = {}, {}
    for path in sorted(located):
        if not path.startswith(prefix) or "/" in path[len(prefix):]:
            continue
        stem, ext = posixpath.splitext(path[len(prefix):])
        if ext == ".xml" and path[len(prefix):] != "annotations.xml":
            xmls[stem] = path
        elif formats.has_image_extension(path) and (stem not in images or ext == ".jpg"):
            images[stem] = path
    split = root_split(folder)
    where = f"{display_path(src)}/{folder or '.'}"
    bare = sorted(path for stem, path in images.items() if stem not in xmls)
    if bare:
        warnings.append(f"{len(bare)} image{'s' if len(bare) != 1 else ''} of {where} have no VOC XML of the same "
                        f"name beside them: skipped ({_some(bare)})")
    # An XML without its image (deleted, or lost on the way) is a missing image, rejected by name with its
    # objects' classes, as COCO's and CVAT's are: its objects must not vanish with a warning only.
    return [(split, images.get(stem, ""), xml) for stem, xml in sorted(xmls.items())]


def _refused(entry: voc_xml.Listed) -> ImageRef:
    """An image refused whole: its XML cannot be read."""
    return ImageRef(entry.split, entry.image, 0, archive_members.refusal(annotations.BAD_ANNOTATION, entry.problem))


def _missing(xml: str, boxes: Sequence[annotations.Box], names: Sequence[str]) -> tuple[str, str]:
    """``(path, refusal)`` of the image an XML annotates that is not there: rejected as ``missing-file`` with its
    objects (counted as a rejected image's, their classes named), as COCO's missing images are."""
    expected = voc_xml.expected_image(xml)
    named = collections.Counter(names[box.label] for box in boxes)
    shown = ", ".join(f"{name} {count}" for name, count in sorted(named.items(), key=lambda kv: (-kv[1], kv[0])))
    return expected, archive_members.refusal(
        "missing-file", f"{display_path(xml)} annotates it, but {display_path(expected)} (or another image "
        "extension) is not there" + (f" (its objects: {shown})" if shown else ""))


def _annotated(listed: Iterable[voc_xml.Listed], names: Sequence[str], classes: Sequence[str], located: dict,
               with_masks: bool, given: bool, pngs: Optional[Iterator] = None) -> Iterator[annotated_plan.AnnotatedImage]:
    """The listed images with their objects, class ids now known, made as the plan takes them; ``pngs``: each
    image's ``(SegmentationObject, SegmentationClass)`` PNGs (:func:`voc_masks.read_pairs`), for its objects' masks."""
    class_id = {name: index for index, name in enumerate(classes) if name}
    for split, image, xml_path, frame, _, packed in listed:
        boxes, rejected, places = [], [], []
        objects = voc_xml.PACKED.iter_unpack(packed)
        for index, (name_index, x0, y0, x1, y1, difficult, truncated) in enumerate(objects, 1):
            name, label = names[name_index], f"{display_path(xml_path)} object {index}"
            if name not in class_id:
                rejected.append((label, annotations.UNKNOWN_CLASS, voc_classes.unknown_detail(name, classes, given)))
                continue
            boxes.append(annotations.Box(label, class_id[name], x0 - 1, y0 - 1, x1, y1, -1.0, False, bool(difficult),
                                         bool(truncated)))
            places.append(index)
        pair = next(pngs) if pngs is not None else None
        if pair is not None:  # each object's instance mask, its class checked against the class mask
            count = len(packed) // voc_xml.PACKED.size
            boxes, bad = voc_masks.with_instances(list(zip(places, boxes)), count, *pair, *(
                display_path(voc_masks.mask_path(image, folder))
                for folder in (voc_masks.OBJECT_FOLDER, voc_masks.CLASS_FOLDER)))
            rejected += bad
        source = annotated_plan.source_of(image, located) if image else ""
        if not image:  # the XML's image is not there
            image, source = _missing(xml_path, boxes, classes)
        class_mask = ()
        if with_masks:
            mask = voc_masks.mask_path(image, voc_masks.CLASS_FOLDER)
            class_mask = (mask, located.get(mask, ""))
        objects_value = annotations.Objects(annotated_plan.derived_source_id(image), tuple(boxes), frame, False,
                                            tuple(rejected), masks=pair is not None, class_mask=class_mask)
        yield annotated_plan.AnnotatedImage(split, image, objects_value, source)


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
        found = [(root_split(root), posixpath.splitext(p[len(prefix):])[0]) for p in sorted(located)
                 if p.startswith(prefix) and p.endswith(".xml")]
    return found
