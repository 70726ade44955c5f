"""COCO as it ships, and as the labelling tools export it.

In:  SRC holding ``annotations/instances_train2017.json`` and ``train2017/`` (or ``images/train2017/``), and
     likewise ``val2017`` (train, validation); ``annotations/image_info_test2017.json`` beside ``test2017/``
     (the test split: images without objects); CVAT's COCO 1.0 (``annotations/instances_default.json``, a
     train split, beside ``images/``); Roboflow's COCO export (``train/``, ``valid/``, ``test/``, each holding
     ``_annotations.coco.json`` beside its images); Label Studio's (``result.json`` beside ``images/``); or
     ``--annotations FILE.json`` with the images at ``SRC/<file_name>``.
Out: the plan of the images the JSON lists (:mod:`beam_jobs.sources.annotated_plan`), each with its objects:
     boxes (``bbox`` is ``[x, y, width, height]`` in pixels from the top-left), ``iscrowd``, ``area``;
     class ids are COCO's category ids as given (1-90 with gaps for COCO's 80 classes). Id 0 is the records'
     background: a category 0 without objects (Roboflow's project name, ``supercategory: none``) is left out,
     and a file whose real classes start at 0 (Label Studio's) is written one higher
     (:mod:`beam_jobs.sources.annotated_plan`).

The JSON is read as a stream (``ijson``), a pass for each of its three lists, so a 450 MB
``instances_train2017.json`` is never held whole; what stays in memory until the plan is made is each
image's objects. An annotation that cannot be used costs only itself: an unknown category or a malformed
``bbox`` is rejected by name (``instances_val2017.json annotation 1234``) and its image keeps its other
objects; an annotation of an image the JSON does not list is counted and named in a warning. An image
the JSON lists is written even without objects (Model Garden trains on such images); a file in the image
folder that the JSON does not list is skipped and counted. A second image entry naming the file of an earlier
one is refused, with its annotations, naming both ids.

Frames: COCO's own tools and Model Garden read pixels without EXIF orientation, so where the JSON's
width and height fit both the stored and the upright image, boxes are in the stored pixels' frame
(:mod:`beam_jobs.annotations` turns them with the image).
"""

from __future__ import annotations

import collections
import io
import json
import posixpath
import re
import struct
from typing import BinaryIO, Callable, Iterator, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats, masks
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, scratch_file, skip_reason
from beam_jobs.sources import annotated_plan

_INSTANCES = re.compile(r"^annotations/(?P<kind>instances|image_info)_(?P<name>[^/]+)\.json$")
_ROBOFLOW = re.compile(r"^(?P<folder>[^/]+)/_annotations\.coco\.json$")
LABEL_STUDIO_FILE = "result.json"
_TOP_KEYS = re.compile(rb'"(images|annotations|categories)"\s*:\s*\[')
Reader = Callable[[str, str], bytes]


def claims(options: ConvertOptions, listing: Optional[Listing]) -> bool:
    """``--annotations`` names a COCO JSON file, or SRC holds ``annotations/instances_*.json``."""
    if options.annotations:
        return is_coco_file(options.annotations)
    return any(_INSTANCES.match(path) or _ROBOFLOW.match(path) for path in listing.files) or (
        LABEL_STUDIO_FILE in listing.files and any(path.startswith("images/") for path in listing.files))


def is_coco_file(path: str) -> bool:
    """A JSON file whose first 64 KiB hold COCO's top-level lists (a JSON Lines label file's rows do not)."""
    if not path.lower().endswith(".json"):
        return False
    try:
        with FileSystems.open(path) as handle:
            head = handle.read(1 << 16)
    except (OSError, ValueError):
        return False  # the label file's reader names the problem
    return bool(_TOP_KEYS.search(head))


def split_of(name: str) -> str:
    """The split a COCO set name means: ``train2017`` train, ``val2017``, ``valid`` and ``minival`` validation,
    ``test*`` test; CVAT's ``default`` (a task without subsets) train."""
    lowered = name.lower()
    if lowered.startswith("train") or lowered == "default":
        return "train"
    if lowered.startswith(("val", "minival")):
        return "validation"
    if lowered.startswith("test"):
        return "test"
    raise InputError(f"the COCO annotations of {name!r}: the name says no split (train..., val..., test...); "
                     "rename the file or its folder, or give it with --annotations")


def plan(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
         scratch: Optional[str] = None) -> InputPlan:
    """The plan of a COCO dataset (see the module's docstring); ``scratch`` keeps its refs out of memory."""
    src = options.src
    located = dict(listing.entries())
    warnings: list[str] = []
    if options.annotations:
        sets = [(options.annotations, "", _split_from_file(options.annotations), None)]
    else:
        sets = _sets(src, listing, located, warnings)
    if options.masks:
        try:
            masks.check_available()
        except masks.MasksUnavailableError as err:
            raise InputError(str(err)) from err
    blobs = _Blobs(scratch) if options.masks else None
    categories: dict[int, str] = {}
    read_sets: list[_Set] = []
    skipped: collections.Counter[str] = collections.Counter(listing.skipped)
    for path, folder, split, source in sets:
        where = display_path(path if options.annotations else f"{src}/{path}")
        opened = _opener(src, path, source, read, bool(options.annotations))
        found = _read_categories(opened, where, required="/image_info_" not in f"/{path}")
        for category, name in found.items():
            if categories.setdefault(category, name) != name:
                raise InputError(f"{where}: category {category} is {name!r} here and {categories[category]!r} in "
                                 "another annotation file of SRC")
        read_sets.append(_read_set(opened, where, folder, split, found, warnings, blobs))
    listed = {relpath for found in read_sets for relpath in found.relpaths}
    folders = {folder for _, folder, _, _ in sets}
    unlisted = sorted(path for path in located if _in_folders(path, folders) and path not in listed
                      and not skip_reason(path, None) and formats.has_image_extension(path))
    if unlisted:
        skipped["not-in-annotations"] += len(unlisted)
        warnings.append(f"{len(unlisted)} files in the image folders are in no annotation file: skipped "
                        f"({', '.join(display_path(p) for p in unlisted[:3])}{' ...' if len(unlisted) > 3 else ''})")
    _leave_out_unused_zero(categories, {c for found in read_sets for c in found.used}, warnings)
    classes = annotated_plan.class_table(categories, src, "the COCO annotation files")
    folded = annotated_plan.case_folded(located)
    images = (annotated_plan.AnnotatedImage(found.split, relpath, found.objects(index),
                                            annotated_plan.source_of(relpath, located, folded))
              for found in read_sets for index, relpath in enumerate(found.relpaths))
    try:
        return annotated_plan.plan(src, images, classes, options.val_fraction, options.seed, skipped, warnings,
                                   labels, scratch=scratch,
                                   extra_features={record_schema.OBJECT_MASK: "bytes_list"} if options.masks else None)
    finally:
        if blobs is not None:
            blobs.close()


def _sets(src: str, listing: Listing, located: dict, warnings: list[str]) -> list[tuple[str, str, str, str]]:
    """``(annotation file, its images' folder, split, locator)`` of each annotation file of SRC's layout."""
    names = {match["name"] for path in located if (match := _INSTANCES.match(path)) and match["kind"] == "image_info"}
    sets = []
    for path, source in sorted(located.items()):
        if match := _INSTANCES.match(path):
            name = match["name"]
            if match["kind"] == "image_info" and name.lower().startswith("test-dev") and \
                    name.replace("-dev", "") in names:  # test-dev2017's images are a part of test2017's
                warnings.append(f"{display_path(f'{src}/{path}')}: its images are a part of "
                                f"image_info_{name.replace('-dev', '')}.json's, which is read instead")
                continue
            sets.append((path, _image_folder(src, name, listing), split_of(name), source))
        elif match := _ROBOFLOW.match(path):
            sets.append((path, match["folder"], split_of(match["folder"]), source))
    if not sets and LABEL_STUDIO_FILE in located:  # Label Studio: file_name is images/<file> under SRC
        sets.append((LABEL_STUDIO_FILE, "", "train", located[LABEL_STUDIO_FILE]))
    return sets


def _leave_out_unused_zero(categories: dict[int, str], used: set[int], warnings: list[str]) -> None:
    """Category 0 without objects is no class: Roboflow names its project so (``supercategory: none``), and
    id 0 is the records' background. One with objects stays, and the ids are written one higher."""
    if 0 in categories and len(categories) > 1 and 0 not in used:
        warnings.append(f"category 0 ({categories.pop(0)!r}) has no objects: left out (it names the project in a "
                        "Roboflow export; id 0 is the records' background)")
    elif 0 in categories:
        warnings.append("the category ids start at 0: written one higher, as id 0 is the records' background "
                        "(the manifest's class_id_offset is 1)")


def _split_from_file(path: str) -> str:
    """``--annotations .../instances_val2017.json``: the split its name says; train when it says none."""
    match = re.match(r"^instances_(?P<name>.+)\.json$", posixpath.basename(path))
    try:
        return split_of(match["name"]) if match else "train"
    except InputError:
        return "train"


def _image_folder(src: str, name: str, listing: Listing) -> str:
    """Where a set's images are: ``SRC/<name>/`` (COCO's zips), ``SRC/images/<name>/`` (CVAT's subsets), or
    ``SRC/images/`` (CVAT's COCO 1.0 without subsets)."""
    folders = annotated_plan.folders_of(listing)
    for folder in (name, f"images/{name}", "images"):
        if folder in folders:
            return folder
    top = sorted(folder for folder in folders if "/" not in folder)
    raise InputError(f"{display_path(src)}/annotations/ holds the annotations of {name!r}, but no image folder is "
                     f"beside it: expected {name}/, images/{name}/ or images/ (the folders there: "
                     f"{', '.join(top[:8]) or 'none'})")


def _in_folders(path: str, folders: set[str]) -> bool:
    return any(not folder or path.startswith(folder + "/") for folder in folders)


def _opener(src: str, path: str, source: str, read: Reader, given: bool) -> Callable[[], BinaryIO]:
    """Opens the JSON afresh for each pass: streamed from its file, or an archive member's bytes."""
    if source:
        data = read(path, source)
        return lambda: io.BytesIO(data)
    full = path if given else FileSystems.join(src, *path.split("/"))
    return lambda: FileSystems.open(full)


def _items(opened: Callable[[], BinaryIO], where: str, prefix: str) -> Iterator[dict]:
    """Each object of one top-level list, streamed."""
    import ijson

    try:
        with opened() as handle:
            for item in ijson.items(handle, f"{prefix}.item", use_float=True):
                if not isinstance(item, dict):
                    raise InputError(f"{where}: an entry of {prefix!r} is not a JSON object: {str(item)[:80]}")
                yield item
    except ijson.JSONError as err:
        raise InputError(f"{where} is not valid JSON: {err}") from err
    except OSError as err:
        raise InputError(f"{where} could not be read: {err}") from err


def _read_categories(opened: Callable[[], BinaryIO], where: str, required: bool = True) -> dict[int, str]:
    found: dict[int, str] = {}
    for item in _items(opened, where, "categories"):
        category, name = item.get("id"), item.get("name")
        if not isinstance(category, int) or not isinstance(name, str) or not name:
            raise InputError(f"{where}: category {str(item)[:80]} needs an integer id and a name")
        if category in found:
            raise InputError(f"{where}: category id {category} is listed twice")
        found[category] = name
    if not found and required:
        raise InputError(f"{where} lists no categories; an instances file names its classes in \"categories\"")
    return found


# annotation id, category id, x0, y0, x1, y1, area (-1: none), iscrowd; its segmentation's place in the blobs.
_PACKED = struct.Struct("<qqdddddBqI")


class _Blobs:
    """The objects' segmentations (``--masks``) as JSON text, kept until their image's objects are made: in a
    scratch file (train2017's are most of its 450 MB), or in memory without one."""

    def __init__(self, scratch: Optional[str]) -> None:
        self._file = open(scratch_file(scratch, "segmentations"), "w+b") if scratch else io.BytesIO()
        self._size = 0

    def add(self, value: object) -> tuple[int, int]:
        data = json.dumps(value, separators=(",", ":")).encode("utf-8")
        self._file.seek(self._size)
        self._file.write(data)
        self._size += len(data)
        return self._size - len(data), len(data)

    def get(self, offset: int, length: int) -> str:
        if not length:
            return ""
        self._file.seek(offset)
        return self._file.read(length).decode("utf-8")

    def close(self) -> None:
        self._file.close()


class _Set:
    """One annotation file's images and objects, compact: each image's objects packed into bytes (57 an
    object, where the dictionaries ijson yields take kilobytes), so train2017's 860k fit in ~50 MB."""

    def __init__(self, where: str, folder: str, split: str, blobs: Optional[_Blobs]) -> None:
        self.where, self.folder, self.split, self.blobs = where, folder, split, blobs
        self.relpaths: list[str] = []
        self.source_ids: list[str] = []
        self.frames: list[tuple[int, int]] = []
        self.packed: list[bytearray] = []
        self.rejected: dict[int, list[tuple[str, str, str]]] = {}
        self.used: set[int] = set()  # the category ids of its objects

    def objects(self, index: int) -> annotations.Objects:
        base = posixpath.basename(self.where)
        blobs = self.blobs
        boxes = tuple(annotations.Box(f"{base} annotation {ann}", category, x0, y0, x1, y1, area, bool(crowd),
                                      mask=blobs.get(offset, length) if blobs else "")
                      for ann, category, x0, y0, x1, y1, area, crowd, offset, length
                      in _PACKED.iter_unpack(self.packed[index]))
        return annotations.Objects(self.source_ids[index], boxes, self.frames[index], False,
                                   tuple(self.rejected.get(index, ())), masks=blobs is not None)


def _is_segmentation(value: object) -> bool:
    """COCO's polygons (lists of at least three x, y pairs) or an RLE (``{"size": [h, w], "counts": ...}``)."""
    if isinstance(value, dict):
        return isinstance(value.get("size"), list) and isinstance(value.get("counts"), (list, str))
    return isinstance(value, list) and bool(value) and all(
        isinstance(polygon, list) and len(polygon) >= 6 and len(polygon) % 2 == 0 for polygon in value)


def _read_set(opened: Callable[[], BinaryIO], where: str, folder: str, split: str, categories: dict[int, str],
              warnings: list[str], blobs: Optional[_Blobs]) -> _Set:
    """The images of one annotation file with their objects (and, with ``blobs``, their segmentations)."""
    found = _Set(where, folder, split, blobs)
    index_of: dict[object, int] = {}
    first_of: dict[str, object] = {}  # relpath -> the image id that named it first
    refused: dict[object, list] = {}  # image id of a second entry for a file -> [the first's id, its objects]
    for item in _items(opened, where, "images"):
        image_id, name = item.get("id"), item.get("file_name")
        if image_id is None or not isinstance(name, str) or not name:
            raise InputError(f"{where}: image {str(item)[:80]} needs an id and a file_name")
        if image_id in index_of or image_id in refused:
            raise InputError(f"{where}: image id {image_id} is listed twice")
        relpath = posixpath.join(folder, name) if folder else name
        if relpath in first_of:
            refused[image_id] = [first_of[relpath], 0]
            continue
        first_of[relpath] = image_id
        index_of[image_id] = len(found.relpaths)
        width, height = item.get("width"), item.get("height")
        found.relpaths.append(relpath)
        found.frames.append((width, height) if isinstance(width, int) and isinstance(height, int) and width > 0
                            and height > 0 else annotations.STORED)
        found.source_ids.append(str(image_id) if isinstance(image_id, int) else annotated_plan.derived_source_id(relpath))
        found.packed.append(bytearray())
    orphans: list[object] = []
    base = posixpath.basename(where)
    for position, item in enumerate(_items(opened, where, "annotations")):
        index = index_of.get(item.get("image_id"))
        if index is None and item.get("image_id") in refused:
            refused[item.get("image_id")][1] += 1
            continue
        if index is None:
            orphans.append(item.get("id"))
            continue
        ann = item.get("id")
        ann = ann if isinstance(ann, int) else position  # the report names it by its place in the file
        category, bbox = item.get("category_id"), item.get("bbox")
        if category not in categories:
            found.rejected.setdefault(index, []).append(
                (f"{base} annotation {ann}", annotations.UNKNOWN_CLASS,
                 f"category_id {category} is not in the file's categories"))
        elif not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            found.rejected.setdefault(index, []).append(
                (f"{base} annotation {ann}", annotations.BAD_ANNOTATION,
                 f"bbox {str(bbox)[:60]} is not [x, y, width, height]"))
        elif blobs is not None and not _is_segmentation(item.get("segmentation")):
            found.rejected.setdefault(index, []).append(
                (f"{base} annotation {ann}", annotations.BAD_ANNOTATION,
                 f"--masks: segmentation {str(item.get('segmentation'))[:60]} is neither polygons nor an RLE"))
        else:
            x, y, w, h = (float(v) for v in bbox)
            area = item.get("area")
            area = float(area) if isinstance(area, (int, float)) and area >= 0 else -1.0
            offset, length = blobs.add(item["segmentation"]) if blobs is not None else (0, 0)
            found.packed[index] += _PACKED.pack(ann, category, x, y, x + w, y + h, area, bool(item.get("iscrowd", 0)),
                                                offset, length)
            found.used.add(category)
    for image_id, (first, count) in list(refused.items())[:5]:
        warnings.append(f"{display_path(where)}: image id {image_id} names the file of image id {first}: refused, "
                        f"with its {count} annotations (one image, one entry)")
    if len(refused) > 5:
        warnings.append(f"{display_path(where)}: {len(refused) - 5} more image entries name an earlier entry's file")
    if orphans:
        shown = ", ".join(str(o) for o in orphans[:5])
        warnings.append(f"{display_path(where)}: {len(orphans)} annotations name an image id that its \"images\" do "
                        f"not list, and were not written (annotation ids {shown}{' ...' if len(orphans) > 5 else ''})")
    return found
