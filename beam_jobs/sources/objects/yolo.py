"""Ultralytics YOLO as it ships: ``data.yaml``, ``images/{split}/`` and ``labels/{split}/``.

In:  SRC holding the dataset's yaml (``data.yaml``, or one ``*.yaml`` named after the dataset as Ultralytics
     names its own: ``coco8.yaml``; ``train``, ``val``, ``test``: image folders, or lists of them; ``names``: a
     list, or an ``{id: name}`` map); or Label Studio's YOLO export, ``classes.txt`` (a name a line, line i
     names class i) beside ``images/`` and ``labels/``, one split. Each image folder's labels in the folder
     of the same path with
     ``images`` turned into ``labels`` (Ultralytics' rule), one ``<stem>.txt`` per image, a line per object:
     ``class cx cy w h``, normalized to the image (or ``class x1 y1 x2 y2 ...``, a polygon, whose extent is
     its box, as Ultralytics reads segments for detection; with ``--masks``, also its instance mask, drawn as
     COCO's polygons are once the image's size is known: :func:`beam_jobs.annotations.place`).
Out: the plan of every image in the split folders (:mod:`beam_jobs.sources.objects.annotated_plan`), class ids the
     yaml's indexes one higher (the records' id 0 is the background); an empty or missing label file is an
     image without objects, a label file without its image a warning naming it.

``path:`` in the yaml often names the author's machine (``../datasets/coco8``): SRC, the yaml's folder, is
the root; entries that climb out of it (Roboflow's ``../train/images``) are read inside it. Labels are in the
upright image's frame: Ultralytics reads images with EXIF orientation applied. The label files are read
:data:`beam_jobs.sources.objects.annotated_plan.READERS` at a time, in order, as the plan takes the images; each image's objects are encoded by the
plan before the next image's are made (spilled to the scratch file when there is one), so the launcher never
holds the dataset's objects. A ``test:`` folder that is not
there is a note, not an error (Ultralytics does not need it; Roboflow writes ``test: ../test/images`` without one).
Every other file of SRC is skipped and named in ``skipped.jsonl`` with its reason (:func:`_account`).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Callable, Iterator, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats, masks
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, skip_reason
from beam_jobs.planning.listing import ANNOTATIONS_NOT_READ, NOT_AN_IMAGE, SkippedFiles
from beam_jobs.sources.objects import annotated_plan

YAML_NAMES = ("data.yaml", "data.yml", "dataset.yaml")
LABEL_STUDIO_CLASSES = "classes.txt"
LABEL_STUDIO_NOTES = "notes.json"  # Label Studio's YOLO export: its classes again, as classes.txt lists them
_SPLIT_KEYS = ("train", "val", "test")  # the yaml's keys, each the split record_schema.split_named says
Reader = Callable[[str, str], bytes]


def claims(listing: Listing) -> bool:
    """SRC holds ``data.yaml`` at its top; or a yaml of another name, or Label Studio's ``classes.txt``, with
    label files in a ``labels/`` folder."""
    top = {path for path in listing.files if "/" not in path}
    if any(name in top for name in YAML_NAMES):
        return True
    if not (_yamls(top) or LABEL_STUDIO_CLASSES in top):
        return False
    return any(path.endswith(".txt") and "/labels/" in f"/{path}" for path in listing.files)


def _yamls(top: set[str]) -> list[str]:
    return sorted(path for path in top if path.lower().endswith((".yaml", ".yml")))


def _yaml_file(listing: Listing, where: str) -> Optional[str]:
    """The dataset's yaml: ``data.yaml`` (or its aliases), else the one yaml at SRC's top; None for Label Studio's
    layout. Several yamls and no ``data.yaml``: an error naming them (which one is the dataset's is a guess)."""
    top = {path for path in listing.files if "/" not in path}
    named = next((name for name in YAML_NAMES if name in top), None)
    found = _yamls(top)
    if named or len(found) == 1:
        return named or found[0]
    if len(found) > 1:
        raise InputError(f"{where} holds several yaml files ({', '.join(found[:5])}) and no data.yaml: which is the "
                         "dataset's? Rename it data.yaml, or move the others away")
    return None


def plan(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
         scratch: Optional[str] = None) -> InputPlan:
    """The plan of a YOLO dataset (see the module's docstring)."""
    src = options.src
    located = dict(listing.entries())
    name = _yaml_file(listing, display_path(src))
    if name is None:
        where = display_path(f"{src}/{LABEL_STUDIO_CLASSES}")
        text = read(LABEL_STUDIO_CLASSES, located[LABEL_STUDIO_CLASSES]).decode("utf-8-sig", "replace")
        lines = [line.strip() for line in text.splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        names = dict(enumerate(lines))  # line i names class i: a blank line is an id without a class, not a shift
        folders, notes = [("train", "images")], []
        if "images" not in annotated_plan.folders_of(listing):
            raise InputError(f"{where} is Label Studio's YOLO export, but {display_path(src)} has no images/ folder "
                             "beside it")
    else:
        where = display_path(f"{src}/{name}")
        config = _read_yaml(read(name, located[name]), where)
        names = _names(config.get("names"), where)
        if isinstance(config.get("nc"), int) and config["nc"] != len(names):
            raise InputError(f"{where}: nc is {config['nc']} but names lists {len(names)} classes; make them agree")
        folders, notes = _split_folders(config, where, listing)
    classes = annotated_plan.class_table(names, src, where)
    skipped = SkippedFiles(listing.skipped, scratch)
    listed = [(split, path) for split, folder in folders for path in sorted(p for p in located
                                                                            if p.startswith(folder + "/"))
              if not skip_reason(path, None) and formats.has_image_extension(path)]
    labelled = {label_file_of(path) for _, path in listed}
    _check_some_labels_found(located, labelled, folders, where)
    warnings = notes + _orphan_labels(located, labelled, folders)
    outside = _outside_folders(located, {path for _, path in listed})
    warnings += _outside_warning(outside, where)
    _account(located, {path for _, path in listed} | labelled | {name or LABEL_STUDIO_CLASSES},
             set(_orphans(located, labelled, folders)), set(outside), name is None, skipped)
    if options.masks:
        try:
            masks.check_available()
        except masks.MasksUnavailableError as err:
            raise InputError(str(err)) from err
    polygons = [0]  # polygon lines read (--masks: a dataset of boxes only has no masks to write)
    made = annotated_plan.plan(src, _images(listed, located, read, classes, options.masks, polygons), classes,
                               options.val_fraction, options.seed, skipped, warnings, labels, scratch=scratch,
                               extra_features={record_schema.OBJECT_MASK: "bytes_list"} if options.masks else None)
    if options.masks and not polygons[0]:
        raise InputError(f"--masks writes the instance masks of polygon lines ('class x1 y1 x2 y2 ...', Ultralytics' "
                         f"segmentation labels), but no label file of {where}'s splits holds one: leave --masks out")
    return dataclasses.replace(made, skipped_files=skipped)


def _account(located: dict, used: set[str], orphans: set[str], outside: set[str], label_studio: bool,
             skipped: SkippedFiles) -> None:
    """Every file of SRC the plan does not read, skipped and named with its reason: a hidden or system file; an
    image in no folder the yaml names, or its label file (``not-in-yaml-folders``, warned of); a label file
    without its image (``no-image``, warned of); an annotation file (named in a warning, but Label Studio's
    ``notes.json``, its classes again); anything else (a README, Ultralytics' ``labels/*.cache``): no image."""
    outside_labels = {label_file_of(path) for path in outside}
    for path in sorted(located):
        if path in used or skip_reason(path, skipped):
            continue
        if path in outside or path in outside_labels:
            skipped.add(path, "not-in-yaml-folders", "an image in no folder the yaml names (train:, val:, test:)"
                        if path in outside else "the label file of an image in no folder the yaml names", warned=True)
        elif path in orphans:
            skipped.add(path, "no-image", "a label file without its image: its objects are not written", warned=True)
        elif label_studio and path == LABEL_STUDIO_NOTES:
            skipped.add(path, ANNOTATIONS_NOT_READ, "Label Studio's notes.json: the classes classes.txt lists",
                        warned=True)
        else:
            skipped.add(path, NOT_AN_IMAGE, "neither an image of the yaml's folders nor a label file")


def _images(listed: Sequence[tuple[str, str]], located: dict, read: Reader, classes: Sequence[str],
            with_masks: bool = False, polygons: Optional[list[int]] = None) -> Iterator[annotated_plan.AnnotatedImage]:
    """Each listed image with its objects, made as the plan takes it: its label file read ahead by
    :func:`beam_jobs.sources.objects.annotated_plan.read_in_order`, its objects encoded by the plan (and, with a scratch folder, spilled) before the
    next image's are made, so no image's objects wait in memory for the others'."""
    wanted = ((label, located[label]) if (label := label_file_of(path)) in located else None for _, path in listed)
    for (split, path), data in zip(listed, annotated_plan.read_in_order(read, wanted)):
        objects = _objects(path, label_file_of(path), data, len(classes), classes, with_masks, polygons)
        yield annotated_plan.AnnotatedImage(split, path, objects, located[path])


def _check_some_labels_found(located: dict, labelled: set[str], folders: Sequence[tuple[str, str]], where: str) -> None:
    """Label files that no image has, and no image with one: the names do not follow Ultralytics' rule (an
    ``x.jpg.txt``, a ``labels/`` folder elsewhere), and the dataset would be written without a single object."""
    if any(label in located for label in labelled):
        return
    orphans = _orphans(located, labelled, folders)
    if orphans:
        raise InputError(f"{where}: none of the {len(orphans)} label files belongs to an image: the label of "
                         f"images/<split>/<stem>.jpg is labels/<split>/<stem>.txt (Ultralytics' rule), but the first "
                         f"one found is {display_path(orphans[0])}")
    elsewhere = _labels_elsewhere(located, labelled)
    if elsewhere:
        folders, found = elsewhere
        shown = ", ".join(f"{display_path(folder)}/" for folder in folders[:3]) + (" ..." if len(folders) > 3 else "")
        name = posixpath.basename(folders[0])
        verb = "holds" if len(folders) == 1 else "hold"
        raise InputError(f"{where}: no image has its label file in labels/, but {shown} {verb} {len(found)} of "
                         f"them (e.g. {display_path(found[0])}): Ultralytics reads an image's labels from labels/ "
                         f"beside images/; rename {name}/ to labels/")


def _labels_elsewhere(located: dict, labelled: set[str]) -> Optional[tuple[list[str], list[str]]]:
    """``(folders, label files)`` when the images' label files are in folders of another name than ``labels/``
    (``annotations/train/a.txt`` for ``images/train/a.jpg``), else None: written as they stand, no image would
    have an object, and Ultralytics would train on none either."""
    folders: set[str] = set()
    found: list[str] = []
    for path in sorted(located):
        if not path.endswith(".txt"):
            continue
        parts = path.split("/")
        for index in range(len(parts) - 2, -1, -1):
            if parts[index] != "labels" and "/".join(parts[:index] + ["labels"] + parts[index + 1:]) in labelled:
                folders.add("/".join(parts[:index + 1]))
                found.append(path)
                break
    return (sorted(folders), found) if found else None


def _outside_folders(located: dict, listed: set[str]) -> list[str]:
    """The images in no folder the yaml names (an ``images/test/`` without ``test:``, an ``images/extra/``, one at
    SRC's top), sorted: skipped and named."""
    return sorted(path for path in located if path not in listed and formats.has_image_extension(path)
                  and not skip_reason(path, None))


def _outside_warning(outside: Sequence[str], where: str) -> list[str]:
    """A warning naming the first images in no folder the yaml names."""
    if not outside:
        return []
    shown = ", ".join(display_path(p) for p in outside[:3]) + (" ..." if len(outside) > 3 else "")
    return [f"{len(outside)} images are in no folder that {where} names (train:, val:, test:): skipped ({shown})"]


def _read_yaml(data: bytes, where: str) -> dict:
    import yaml

    try:
        config = yaml.safe_load(data.decode("utf-8-sig"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise InputError(f"{where} is not valid YAML: {err}") from err
    if not isinstance(config, dict) or "names" not in config:
        raise InputError(f"{where} is not a YOLO dataset's yaml: a mapping with train, val and names")
    return config


def _orphans(located: dict, used: set[str], folders: Sequence[tuple[str, str]]) -> list[str]:
    """The label files of the split folders' label folders that no image has, sorted."""
    roots = {label_file_of(folder + "/x").rpartition("/")[0] for _, folder in folders}
    return sorted(path for path in located if path.endswith(".txt") and path not in used
                  and any(path.startswith(root + "/") for root in roots))


def _orphan_labels(located: dict, used: set[str], folders: Sequence[tuple[str, str]]) -> list[str]:
    """A warning naming the label files of the split folders that no image has (their objects are not written)."""
    orphans = _orphans(located, used, folders)
    if not orphans:
        return []
    shown = ", ".join(orphans[:3]) + (" ..." if len(orphans) > 3 else "")
    return [f"{len(orphans)} label files have no image beside them, so their objects are not written ({shown})"]


def _names(names: object, where: str) -> dict[int, str]:
    """``names:`` as ``{id: name}``: a list numbers its names from 0."""
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise InputError(f"{where}: 'names' must list the class names, or map ids to them")
    out = {}
    for key, value in names.items():
        try:
            out[int(key)] = str(value)
        except (TypeError, ValueError) as err:
            raise InputError(f"{where}: names has the id {key!r}, which is not an integer") from err
    return out


def _split_folders(config: dict, where: str, listing: Listing) -> tuple[list[tuple[str, str]], list[str]]:
    """``(split, image folder relative to SRC)`` for each split the yaml names, and a note for a missing
    ``test:`` folder (Ultralytics does not need one)."""
    dirs = annotated_plan.folders_of(listing)
    root = str(config.get("path") or "").strip("/")
    root = root if root in dirs else ""  # a path on the author's machine: SRC is the root
    found, notes = [], []
    for key in _SPLIT_KEYS:
        split, entries = record_schema.split_named(key), config.get(key)
        for entry in entries if isinstance(entries, list) else [entries] if entries else []:
            folder = _inside(posixpath.join(root, str(entry)))
            if folder not in dirs and str(entry).startswith("/"):  # another machine's path (Colab's /content/...)
                folder = next((tail for tail in _tails(folder) if tail in dirs), folder)
            if folder.endswith(".txt"):
                raise InputError(f"{where}: {key}: {entry} is a list of image files, which is not read; give the "
                                 "images' folder")
            if folder not in dirs and key == "test":
                notes.append(f"{where}: test: {entry} is not there, so the dataset has no test split")
                continue
            if folder not in dirs:
                raise InputError(f"{where}: {key}: {entry} is not a folder beside it")
            found.append((split, folder))
    if not found:
        raise InputError(f"{where} names no split folder (train:, val:, test:)")
    return found, notes


def _tails(path: str) -> Iterator[str]:
    """``a/b/c``, ``b/c``, ``c``: where an absolute path of the author's machine may lie inside SRC."""
    parts = path.split("/")
    return ("/".join(parts[i:]) for i in range(len(parts)))


def _inside(path: str) -> str:
    """A yaml entry as a path inside SRC: leading ``../`` dropped (SRC is the yaml's folder)."""
    parts = [part for part in posixpath.normpath(path).split("/") if part not in ("", ".")]
    while parts and parts[0] == "..":
        parts.pop(0)
    return "/".join(parts)


def label_file_of(image: str) -> str:
    """Ultralytics' rule: the last ``images`` folder of the path becomes ``labels``, the extension ``.txt``."""
    parts = image.split("/")
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "images":
            parts[index] = "labels"
            break
    return posixpath.splitext("/".join(parts))[0] + ".txt"


def _objects(image: str, label_path: str, data: Optional[bytes], num_classes: int, classes: Sequence[str],
             with_masks: bool = False, polygons: Optional[list[int]] = None) -> annotations.Objects:
    """The objects of one image from its label file's bytes (none when it has no label file: ``data`` None).
    ``with_masks``: each polygon line's points go with its object (``Box.mask``: ``[[x1, y1, ...]]``, normalized,
    as COCO's segmentation is in pixels), counted in ``polygons[0]``; a box line has no mask, and is rejected."""
    source_id = annotated_plan.derived_source_id(image)
    if data is None:
        return annotations.Objects(source_id, (), annotations.NORMALIZED, True, masks=with_masks)
    boxes, rejected = [], []
    text = data.decode("utf-8-sig", "replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name = f"{display_path(label_path)} line {number}"
        parsed = _line(line)
        if parsed is None:
            rejected.append((name, annotations.BAD_ANNOTATION, _unparsed(line)))
            continue
        label, (x0, y0, x1, y1), polygon = parsed
        if not 0 <= label < num_classes or not classes[label]:
            rejected.append((name, annotations.UNKNOWN_CLASS, f"class {label} is not in names ({num_classes} "
                             "classes)"))
            continue
        if with_masks and polygon is None:
            rejected.append((name, annotations.BAD_MASK, "--masks: a box line ('class cx cy w h') has no polygon to "
                             "draw its mask from ('class x1 y1 x2 y2 ...')"))
            continue
        if with_masks and polygons is not None:
            polygons[0] += 1
        boxes.append(annotations.Box(name, label, x0, y0, x1, y1, mask=json.dumps([polygon]) if with_masks else ""))
    return annotations.Objects(source_id, tuple(boxes), annotations.NORMALIZED, True, tuple(rejected),
                               masks=with_masks)


def _unparsed(line: str) -> str:
    """Why a label line does not parse, worded for what it looks like: past five numbers it is a polygon
    (Ultralytics' segmentation labels), whose points come in pairs."""
    fields = line.split()
    shown = f"{line.strip()[:60]!r}{' ...' if len(line.strip()) > 60 else ''}"
    if len(fields) > 5 and len(fields) % 2 == 0:
        try:
            [float(v) for v in fields[1:]]
            return (f"{shown} is a polygon ('class x1 y1 x2 y2 ...') with {len(fields) - 1} coordinates, an odd "
                    "number: its last point has no y")
        except ValueError:
            pass
    return f"{shown} is neither 'class cx cy w h' nor a polygon 'class x1 y1 x2 y2 x3 y3 ...'"


def _line(line: str) -> Optional[tuple[int, tuple[float, float, float, float], Optional[list[float]]]]:
    """``(class, (x0, y0, x1, y1), polygon)`` of a label line, normalized (``polygon``: its points, None for a box
    line); None when it does not parse."""
    fields = line.split()
    try:
        label, values = int(fields[0]), [float(v) for v in fields[1:]]
    except (ValueError, IndexError):
        return None
    if len(values) == 4:
        return label, annotations.corners("yolo", *values), None
    if len(values) >= 6 and len(values) % 2 == 0:  # a polygon: its extent
        xs, ys = values[0::2], values[1::2]
        return label, (min(xs), min(ys), max(xs), max(ys)), values
    return None
