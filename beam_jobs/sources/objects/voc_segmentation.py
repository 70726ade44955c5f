"""Semantic segmentation as Pascal VOC lays it out without boxes, and as CVAT exports it (Segmentation mask 1.1).

In:  a root (SRC, or a folder at most two levels down) holding ``JPEGImages/`` and ``SegmentationClass/`` and no
     ``Annotations/`` XML: ``SegmentationClass/<id>.png`` each image's classes, as palette indexes or as colours
     (RGB); ``ImageSets/Segmentation/{train,val,test,trainval,default}.txt`` naming the images (CVAT's
     ``default`` is train; without lists every image that has a mask, as train); ``labelmap.txt`` (CVAT's and
     VOC-style tools': ``# label:color_rgb:parts:actions``, then ``name:r,g,b::`` a line) naming the classes in
     order with their colours.
Out: the plan (task ``segmentation``) of the listed images, each with its mask as
     ``image/segmentation/class/encoded``: class ids by the colour table, ``labelmap.txt``'s line order; without it
     VOC's (0 background, 1-20 its classes in their palette's colours, 255 the void outline (224, 224, 192)), or,
     with ``--labels``, line i of that file for VOC's palette colour i. A mask holding a colour the table lacks
     rejects its image (``bad-mask``, naming the colour and its pixels; the workers map the colours, so the plan
     reads no mask).

A listed image without its mask, or a list naming an image that is not there, is ``missing-file``; an image of
a root without lists that has no mask is skipped (``no-mask``). ``SegmentationObject/`` (instances without
boxes) is skipped and named: without an XML no object has a class of its own.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Callable, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats, masks
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, skip_reason
from beam_jobs.planning.listing import SkippedFiles
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.objects import annotated_plan, voc_classes
from beam_jobs.stage_records import ImageRef

Reader = Callable[[str, str], bytes]
LABELMAP = "labelmap.txt"
VOID_COLOUR = (224, 224, 192)
_IN_ROOT = re.compile(r"^(?P<root>(?:[^/]+/){0,2}?)(?P<kind>Annotations|JPEGImages|SegmentationClass)/[^/]+$")
_LISTS = {"train": "train", "val": "validation", "test": "test", "trainval": "train", "default": "train"}


def roots(listing: Listing) -> list[str]:
    """Every folder of SRC (``""`` for SRC, at most two levels down) holding images in ``JPEGImages/`` and PNGs in
    ``SegmentationClass/``, and no XML in ``Annotations/`` (that is :mod:`beam_jobs.sources.objects.voc`'s)."""
    found: dict[str, set[str]] = {}
    for path in listing.files:
        if "JPEGImages/" in path or "SegmentationClass/" in path or "Annotations/" in path:
            match = _IN_ROOT.match(path)
            if match and (match["kind"] != "Annotations" or path.endswith(".xml")):
                found.setdefault(match["root"].rstrip("/"), set()).add(match["kind"])
    return sorted(root for root, kinds in found.items() if kinds == {"JPEGImages", "SegmentationClass"})


def claims(listing: Listing) -> bool:
    return bool(roots(listing))


def voc_colour(index: int) -> tuple[int, int, int]:
    """VOC's palette colour of class ``index`` (the devkit's ``labelcolormap``: the index's bits, three by three,
    into R, G and B from the high bit down): 1 is (128, 0, 0), 255 the void outline (224, 224, 192)."""
    red = green = blue = 0
    for shift in range(7, -1, -1):
        red, green, blue = red | (index & 1) << shift, green | (index >> 1 & 1) << shift, blue | (index >> 2 & 1) << shift
        index >>= 3
    return red, green, blue


def colour_table(root: str, located: dict, read: Reader, labels: Optional[Sequence[str]],
                 where: str) -> tuple[tuple[str, ...], str, str]:
    """``(classes by id, the colour table's JSON, the labelmap's path or "")`` of a root (see the module's docstring)."""
    labelmap = next((path for path in (posixpath.join(root, LABELMAP), LABELMAP) if path in located), "")
    if labelmap:
        names, pairs = [], []
        text = read(labelmap, located[labelmap]).decode("utf-8-sig")
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, _, rest = line.partition(":")
            try:
                colour = tuple(int(value) for value in rest.split(":", 1)[0].split(","))
            except ValueError:
                colour = ()
            if not name.strip() or len(colour) != 3 or not all(0 <= value <= 255 for value in colour):
                raise InputError(f"{where}/{display_path(labelmap)} line {number}: {line.strip()[:60]!r} is not "
                                 "name:r,g,b (CVAT's labelmap.txt: 'cat:128,0,0::')")
            pairs.append((colour, len(names)))
            names.append(name.strip())
        if len(names) > 255:
            raise InputError(f"{where}/{display_path(labelmap)} names {len(names)} classes; a class mask holds 255")
        return tuple(names), masks.colour_table(pairs), labelmap
    names = tuple(labels) if labels is not None else ("background", *voc_classes.VOC_CLASSES)
    pairs = [(voc_colour(index), index) for index in range(min(len(names), 255))] + [(VOID_COLOUR, 255)]
    return names, masks.colour_table(pairs), ""


def plan(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
         scratch: Optional[str] = None) -> InputPlan:
    """The plan of VOC-laid-out semantic segmentation without boxes (see the module's docstring)."""
    src = options.src
    located = dict(listing.entries())
    skipped = SkippedFiles(listing.skipped, scratch)
    images, refused, used, warnings, tables = [], [], set(), [], set()
    classes: tuple[str, ...] = ()
    for root in roots(listing):
        classes, colours, labelmap = colour_table(root, located, read, labels, display_path(src))
        tables.add(classes)
        used.add(labelmap)
        by_id = images_by_id(root, located)  # once a root: a search an id was quadratic in the images
        for split, image_id, lists in _listed(root, located, read, skipped, warnings, used):
            image = by_id.get(image_id, "")
            mask = posixpath.join(root, "SegmentationClass", f"{image_id}.png")
            if image and mask in located:
                used |= {image, mask}
                objects = annotations.Objects(annotated_plan.derived_source_id(image), (), annotations.STORED, False,
                                              class_mask=(mask, located[mask], colours))
                images.append(annotated_plan.AnnotatedImage(split, image, objects, located[image]))
                continue
            missing = mask if image else posixpath.join(root, "JPEGImages", f"{image_id}.jpg")
            used |= {image}
            refused.append(ImageRef(split, image or missing, 0, archive_members.refusal(
                "missing-file", f"{display_path(lists)} lists {image_id}, but {display_path(missing)} is not there")))
    if len(tables) > 1:
        raise InputError(f"{display_path(src)}: its segmentation folders name their classes differently "
                         "(labelmap.txt); convert each on its own")
    _account(located, used, skipped)
    if not images and not refused:
        raise InputError(f"{src}: no image of JPEGImages/ has its mask in SegmentationClass/ (<id>.png)")
    seg = {record_schema.SEGMENTATION_ENCODED: "bytes", record_schema.SEGMENTATION_FORMAT: "bytes"}
    made = annotated_plan.plan(src, images, classes, options.val_fraction, options.seed, skipped, warnings, None,
                               refused, scratch=scratch, task=record_schema.TASK_SEGMENTATION, extra_features=seg)
    return dataclasses.replace(made, skipped_files=skipped)


def images_by_id(root: str, located: dict) -> dict[str, str]:
    """Each image of ``root``'s ``JPEGImages/`` by its id (its name without extension): ``<id>.jpg`` as VOC
    ships, else the first (sorted) of another image extension (a dataset of one's own in VOC's layout). One pass
    over ``located``, the root's images sorted once."""
    prefix = posixpath.join(root, "JPEGImages") + "/"
    found: dict[str, str] = {}
    for path in sorted(path for path in located if path.startswith(prefix)):
        name = path[len(prefix):]
        if "/" not in name and formats.has_image_extension(name):
            image_id = posixpath.splitext(name)[0]
            if image_id not in found or name.endswith(".jpg"):
                found[image_id] = path
    return found


def _listed(root: str, located: dict, read: Reader, skipped: SkippedFiles, warnings: list[str],
            used: set[str]) -> list[tuple[str, str, str]]:
    """``(split, image id, the list naming it)`` from ``ImageSets/Segmentation``; without lists, each image of
    ``JPEGImages/`` that has a mask (train), the others skipped as ``no-mask`` and warned of."""
    folder = posixpath.join(root, "ImageSets", "Segmentation")
    found = []
    for name, split in _LISTS.items():
        path = posixpath.join(folder, f"{name}.txt")
        if path in located and not (name == "trainval" and any(s in ("train", "validation") for s, _, _ in found)):
            used.add(path)
            found += [(split, line.split()[0], path) for line in read(path, located[path]).decode("utf-8-sig")
                      .splitlines() if line.split()]
    if found:
        return list(dict.fromkeys(found))
    prefix = posixpath.join(root, "JPEGImages") + "/"
    bare = []
    for path in sorted(located):
        if path.startswith(prefix) and "/" not in path[len(prefix):] and formats.has_image_extension(path):
            image_id = posixpath.splitext(path[len(prefix):])[0]
            if posixpath.join(root, "SegmentationClass", f"{image_id}.png") in located:
                found.append(("train", image_id, prefix))
            else:
                bare.append(path)
                skipped.add(path, "no-mask", f"no mask SegmentationClass/{image_id}.png beside it")
    if bare:
        warnings.append(f"{len(bare)} image{'s' if len(bare) > 1 else ''} of {display_path(prefix)} "
                        f"{'have' if len(bare) > 1 else 'has'} no mask in SegmentationClass/: skipped "
                        f"({', '.join(map(display_path, bare[:3]))}{' ...' if len(bare) > 3 else ''})")
        used |= set(bare)
    return found


def _account(located: dict, used: set[str], skipped: SkippedFiles) -> None:
    """Every other file of SRC skipped, named with its reason."""
    for path in sorted(located):
        if path in used or skip_reason(path, skipped):
            continue
        if "/SegmentationObject/" in f"/{path}":
            skipped.add(path, "not-in-layout", "an instance mask without boxes (no Annotations/ XML gives its "
                        "objects' classes): not read")
        elif "/JPEGImages/" in f"/{path}":
            skipped.add(path, "not-in-split-lists", "in no list of ImageSets/Segmentation")
        else:
            skipped.add(path, "not-in-layout", "neither an image the segmentation lists name nor one of its files")
