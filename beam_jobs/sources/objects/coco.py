"""COCO as it ships, and as the labelling tools export it.

In:  SRC holding ``annotations/instances_train2017.json`` and ``train2017/`` (or ``images/train2017/``), and
     likewise ``val2017`` (train, validation); ``annotations/image_info_test2017.json`` beside ``test2017/``
     (the test split: images without objects); CVAT's COCO 1.0 (``annotations/instances_default.json``, a
     train split, beside ``images/``); Roboflow's COCO export (``train/``, ``valid/``, ``test/``, each holding
     ``_annotations.coco.json`` beside its images); Label Studio's (``result.json`` beside ``images/``); or
     ``--annotations FILE.json`` with the images at ``SRC/<file_name>``.
Out: the plan of the images the JSON lists (:mod:`beam_jobs.sources.objects.annotated_plan`), each with its objects:
     boxes (``bbox`` is ``[x, y, width, height]`` in pixels from the top-left), ``iscrowd``, ``area``;
     class ids are COCO's category ids as given (1-90 with gaps for COCO's 80 classes). Id 0 is the records'
     background: a category 0 without objects (Roboflow's project name, ``supercategory: none``) is left out,
     and a file whose real classes start at 0 (Label Studio's) is written one higher
     (:mod:`beam_jobs.sources.objects.annotated_plan`).

The JSON is read as a stream (``ijson``), in one pass whatever the order of its lists
(:mod:`beam_jobs.sources.objects.coco_json`), so a 450 MB ``instances_train2017.json`` is fetched once and never held
whole, from a folder, an object store or a zip (``annotations_trainval2017.zip``: inflated as it is read);
what stays in memory until the plan is made is each image's objects, packed. An annotation that cannot be used costs only itself: an unknown category or a malformed
``bbox`` is rejected by name (``instances_val2017.json annotation 1234``) and its image keeps its other
objects; an annotation of an image the JSON does not list is counted and named in a warning. An image
the JSON lists is written even without objects (Model Garden trains on such images); a file in the image
folder that the JSON does not list is skipped and counted. A second image entry naming the file of an earlier
one is refused, with its annotations, naming both ids.

Beside ``instances_<set>.json``, ``person_keypoints_<set>.json`` and ``captions_<set>.json`` are read too
(:mod:`beam_jobs.sources.objects.coco_extras`): each object's keypoints (``image/object/keypoint/*``, placed as its box
is) and each image's captions (``image/caption``), the keys the TF Object Detection API's and Model Garden's scripts
write. Stuff and panoptic files are skipped and named in a warning.

Frames: COCO's own tools and Model Garden read pixels without EXIF orientation, so where the JSON's
width and height fit both the stored and the upright image, boxes are in the stored pixels' frame
(:mod:`beam_jobs.annotations` turns them with the image).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import posixpath
import re
from typing import BinaryIO, Callable, Optional, Protocol, Sequence

import record_schema
from beam_jobs import formats, masks
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, skip_reason
from beam_jobs.planning.listing import ANNOTATIONS_NOT_READ, NOT_AN_IMAGE, SkippedFiles
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.objects import annotated_plan, coco_extras, coco_json

_INSTANCES = re.compile(r"^annotations/(?P<kind>instances|image_info)_(?P<name>[^/]+)\.json$")
_ROBOFLOW = re.compile(r"^(?P<folder>[^/]+)/_annotations\.coco\.json$")
LABEL_STUDIO_FILE = "result.json"
_TOP_KEYS = re.compile(rb'"(images|annotations|categories)"\s*:\s*\[')


class Reader(Protocol):
    """What the plan reads SRC's files and archive members with (:class:`beam_jobs.sources.archives.archives.LauncherReader`):
    a file's bytes, or a stream of them."""

    def __call__(self, path: str, source: str) -> bytes: ...

    def open(self, path: str, source: str) -> BinaryIO: ...


def claims(options: ConvertOptions, listing: Optional[Listing]) -> bool:
    """``--annotations`` names a COCO JSON file, or SRC holds ``annotations/instances_*.json``."""
    if options.annotations:
        return is_coco_file(options.annotations)
    return any(path.endswith(".json") and (_INSTANCES.match(path) or _ROBOFLOW.match(path))
               for path in listing.files) or (
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
    blobs = coco_json.Blobs(scratch) if options.masks else None
    try:  # closed whatever fails after it is opened: a bad JSON, an unknown category, an empty class table
        return _plan_sets(options, listing, read, labels, scratch, located, sets, blobs, warnings)
    finally:
        if blobs is not None:
            blobs.close()


def _plan_sets(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
               scratch: Optional[str], located: dict, sets: list, blobs: Optional[coco_json.Blobs],
               warnings: list[str]) -> InputPlan:
    """The plan of the annotation files ``sets`` (``(file, its images' folder, split, locator)``), each read
    once, masks into ``blobs``."""
    src = options.src
    categories: dict[int, str] = {}
    supercategories: dict[int, object] = {}
    read_sets: list[coco_json.CocoSet] = []
    read_extras: set[str] = set()
    skipped = SkippedFiles(listing.skipped, scratch)
    for path, folder, split, source in sets:
        where = display_path(path if options.annotations else f"{src}/{path}")
        opened = _opener(src, path, source, read, bool(options.annotations))
        found = coco_json.read_set(opened, where, folder, split, warnings, blobs,
                                   required="/image_info_" not in f"/{path}", upright=_annotates_upright(path),
                                   max_pixels=options.encode.max_pixels)
        found.extras, extra_files = _extras(src, path, located, read, bool(options.annotations))
        read_extras |= extra_files
        supercategories.update(found.supercategories)
        for category, name in found.categories.items():
            if categories.setdefault(category, name) != name:
                raise InputError(f"{where}: category {category} is {name!r} here and {categories[category]!r} in "
                                 "another annotation file of SRC")
        read_sets.append(found)
    _points_for_every_set(read_sets, warnings)
    listed = {relpath for found in read_sets for relpath in found.relpaths}
    folders = {folder for _, folder, _, _ in sets}
    read_files = {path for path, _, _, _ in sets} | _inside(src, options.annotations) | read_extras
    _account(src, located, listed, read_files, folders, skipped, warnings)
    _leave_out_unused_zero(categories, supercategories, {c for found in read_sets for c in found.used}, warnings)
    classes = annotated_plan.class_table(categories, src, "the COCO annotation files")
    folded = annotated_plan.case_folded(located)
    images = (_image(found, index, relpath, located, folded, categories)
              for found in read_sets for index, relpath in enumerate(found.relpaths))
    extra_features = {record_schema.OBJECT_MASK: "bytes_list"} if options.masks else {}
    if any(found.extras and found.extras.count for found in read_sets):
        extra_features.update(record_schema.KEYPOINT_FEATURES)
    if any(found.extras and found.extras.captions_where for found in read_sets):
        extra_features[record_schema.CAPTION] = "bytes_list"
    keypoints = _keypoints_entry(read_sets, warnings)
    made = annotated_plan.plan(src, images, classes, options.val_fraction, options.seed, skipped, warnings,
                               labels, scratch=scratch, extra_features=extra_features or None)
    said = tuple(line for found in read_sets if found.extras and found.extras.keypoints_where
                 for line in found.extras.said(found.where))
    return dataclasses.replace(made, skipped_files=skipped, warnings=made.warnings + said,
                               keypoints=keypoints)


def _keypoints_entry(read_sets: list, warnings: list[str]) -> dict:
    """The manifest's ``keypoints`` (K, names, flip) from the keypoints files' categories; a second file naming
    its points otherwise is warned of (the first file's names are recorded: the records hold K points either
    way, and a reader's flip follows the names)."""
    named = {found.extras.keypoints_where: found.extras.names for found in read_sets
             if found.extras and found.extras.names}
    if not named:
        return {}
    (first, names), *others = sorted(named.items())
    for where, other in others:
        if other != names:
            warnings.append(f"{where} names its {len(other)} keypoints {', '.join(other)}; {first} names them "
                            f"{', '.join(names)}: the manifest records {posixpath.basename(first)}'s names")
    unpaired = coco_extras.flip_warning(names, first)  # hand_L beside R_hand: no flip is read from the names
    warnings.extend([unpaired] if unpaired else [])
    return coco_extras.manifest_entry(names)


def _points_for_every_set(read_sets: list, warnings: list[str]) -> None:
    """When any set has a keypoints file (K points an object), every object of a set without one gets K points
    of visibility 0 ("not labelled", as COCO writes an object without keypoints): the manifest's keypoint keys
    hold for every record, and a reader asking for K gets K from each. The sets say it in a warning each;
    two files naming different counts are refused (one count an object is what the records' keys can hold)."""
    counts = {found.extras.keypoints_where: found.extras.count for found in read_sets
              if found.extras and found.extras.count}
    if len(set(counts.values())) > 1:
        raise InputError("; ".join(f"{where}: {count} keypoints an object" for where, count in sorted(counts.items()))
                         + ": the records' keypoint keys hold one count an object for the whole dataset")
    if not counts:
        return
    count = next(iter(counts.values()))
    for found in read_sets:
        if found.extras and found.extras.count:
            continue
        found.extras = found.extras or coco_extras.Extras()
        found.extras.count = count
        warnings.append(f"{found.where}: no {coco_extras.KEYPOINTS_PREFIX}<set>.json beside it (another set has "
                        f"one): its objects are written with {count} keypoints of visibility 0, not labelled")


def _image(found: coco_json.CocoSet, index: int, relpath: str, located: dict, folded: Callable,
           categories: dict[int, str]) -> annotated_plan.AnnotatedImage:
    """One listed image, its objects, and where its bytes are; an image whose file SRC does not hold is
    rejected by name as ``missing-file``, its objects' classes named on its line (validation counts them)."""
    objects = found.objects(index)
    source = annotated_plan.source_of(relpath, located, folded)
    if not source and relpath not in located:
        classes = collections.Counter(categories.get(box.label, str(box.label)) for box in objects.boxes)
        named = ", ".join(f"{name} {count}" for name, count in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0])))
        source = archive_members.refusal(
            "missing-file", f"listed in {posixpath.basename(found.where)}, but --src has no file "
            f"{display_path(relpath)}" + (f" (its objects: {named})" if named else ""))
    return annotated_plan.AnnotatedImage(found.split, relpath, objects, source)


# COCO's other annotation files, beside instances_*.json: what they hold, for the warning that names them.
_OTHER_KINDS = {"person_keypoints": "keypoints", "captions": "captions", "stuff": "stuff segmentation",
                "panoptic": "panoptic segmentation"}


def _account(src: str, located: dict, listed: set[str], read_files: set[str], folders: set[str],
             skipped: SkippedFiles, warnings: list[str]) -> None:
    """Every file of SRC that is neither an image the annotations list nor an annotation file read is skipped,
    named with its reason: hidden, an image in no annotation file or outside the image folders, an annotation
    file not read (COCO's keypoints and captions: a warning each), anything else (a README) no image."""
    unlisted = []
    for path in sorted(located):
        if path in listed or path in read_files or skip_reason(path, skipped):
            continue
        name = posixpath.basename(path)
        other = re.match(r"^(?P<kind>person_keypoints|captions|stuff|panoptic)_.*\.json$", name)
        if other:
            warnings.append(f"{display_path(src)}/{display_path(path)}: COCO {_OTHER_KINDS[other['kind']]}, which the "
                            "converter does not read: skipped (the instances files' boxes, classes and masks are "
                            "converted, and the keypoints and captions files of a set whose instances file is read)")
            skipped.add(path, ANNOTATIONS_NOT_READ, f"COCO {_OTHER_KINDS[other['kind']]}, not read", warned=True)
        elif _in_folders(path, folders) and formats.has_image_extension(path):
            unlisted.append(path)
            skipped.add(path, "not-in-annotations", "in an image folder, but in no annotation file")
        elif formats.has_image_extension(path):
            skipped.add(path, "not-in-layout", "an image outside the folders of the annotation files' images")
        else:  # a README, a licence: an annotation file (.json, .xml...) is told apart by SkippedFiles
            skipped.add(path, NOT_AN_IMAGE, "neither an image the annotation files list nor one of them")
    if unlisted:
        warnings.append(f"{len(unlisted)} files in the image folders are in no annotation file: skipped "
                        f"({', '.join(display_path(p) for p in unlisted[:3])}{' ...' if len(unlisted) > 3 else ''})")


def _inside(src: str, path: str) -> set[str]:
    """``--annotations``' file as a path of SRC's listing, when it lies inside SRC (it is read, not skipped),
    however either is spelled (``./ds`` and ``ds/ann.json``, a trailing slash)."""
    if not path:
        return set()
    if "://" not in src and "://" not in path:
        src, path = os.path.abspath(src), os.path.abspath(path)
    base = src.rstrip("/") + "/"
    return {path[len(base):]} if path.startswith(base) else set()


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


def _annotates_upright(path: str) -> bool:
    """The tools that write these files (Roboflow's ``_annotations.coco.json``, CVAT's ``instances_default``,
    Label Studio's ``result.json``) show images upright and annotate them so; COCO's own files are in the
    stored pixels' frame. Decides only where an image's size cannot tell (``--annotation-frame`` overrides)."""
    name = posixpath.basename(path)
    return bool(_ROBOFLOW.match(path)) or name == LABEL_STUDIO_FILE or name.startswith("instances_default")


def _leave_out_unused_zero(categories: dict[int, str], supercategories: dict[int, object], used: set[int],
                           warnings: list[str]) -> None:
    """Category 0 without objects and with ``supercategory: none`` is no class: Roboflow names its project so,
    and id 0 is the records' background. Any other category 0 is a class (Label Studio numbers its labels from 0
    and lists them all, used or not), and the ids are written one higher."""
    if 0 in categories and len(categories) > 1 and 0 not in used and supercategories.get(0) == "none":
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


def _extras(src: str, path: str, located: dict, read: Reader, given: bool) -> tuple[Optional[coco_extras.Extras], set]:
    """The keypoints and captions files beside an instances file (``annotations/person_keypoints_<set>.json``,
    ``captions_<set>.json``), read (:mod:`beam_jobs.sources.objects.coco_extras`), and their paths."""
    if given:
        return None, set()
    files = [file for file in coco_extras.files_of(path, located)]
    opened = [(display_path(f"{src}/{file}"), _opener(src, file, located[file], read, False)) if file else None
              for file in files]
    return coco_extras.read(*opened), {file for file in files if file}


def _opener(src: str, path: str, source: str, read: Reader, given: bool) -> Callable[[], BinaryIO]:
    """Opens the JSON (once: it is read in one pass) as a stream: its file, or an archive member inflated as it
    is read (``read.open``), never its whole bytes."""
    if source:
        return lambda: read.open(path, source)
    full = path if given else FileSystems.join(src, *path.split("/"))
    return lambda: FileSystems.open(full)
