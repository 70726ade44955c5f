"""Semantic segmentation as many datasets ship it: an image folder beside a mask folder of the same stems.

In:  SRC holding ``images/`` and ``masks/`` (or ``annotations/``, ADE20K's name), optionally each with split
     folders (``train``/``training``, ``val``/``validation``, ``test``), ``images/<split>/<stem>.jpg`` beside
     ``masks/<split>/<stem>.png``: a PNG of class ids, pixel by pixel, the size of its image; and
     ``--labels``, naming class id i on line i (a mask holds numbers, not names).
Out: the plan (:mod:`beam_jobs.sources.objects.annotated_plan`, task ``segmentation``) of every image that has a
     mask, each record with ``image/segmentation/class/encoded`` (turned and resized with its image). An
     image without a mask is skipped and counted (``no-mask``), as is a mask without an image.
"""

from __future__ import annotations

import collections
import posixpath
from typing import Callable, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, skip_reason
from beam_jobs.sources.objects import annotated_plan

MASK_FOLDERS = ("masks", "annotations")
Reader = Callable[[str, str], bytes]


def _top_folders(listing: Listing) -> set[str]:
    return {path.split("/", 1)[0] for path in listing.files if "/" in path}


def claims(listing: Listing) -> bool:
    """SRC's folders are ``images/`` and one mask folder (``masks/`` or ``annotations/``), nothing else."""
    top = {name for name in _top_folders(listing) if not name.startswith(".")}
    return len(top) == 2 and "images" in top and bool(top & set(MASK_FOLDERS))


def plan(options: ConvertOptions, listing: Listing, read: Reader, labels: Optional[Sequence[str]],
         scratch: Optional[str] = None) -> InputPlan:
    """The plan of an image folder beside its mask folder (see the module's docstring)."""
    src = options.src
    mask_folder = next(name for name in MASK_FOLDERS if name in _top_folders(listing))
    texts = sum(1 for path in listing.files if path.startswith(mask_folder + "/") and path.endswith(".txt"))
    if texts and not any(path.startswith(mask_folder + "/") and path.lower().endswith(".png") for path in listing.files):
        raise InputError(f"{display_path(src)}/{mask_folder}/ holds {texts} .txt files and no mask: YOLO's labels? "
                         f"Ultralytics reads them from labels/ beside images/: rename {mask_folder}/ to labels/ and put "
                         "the dataset's yaml (names:, train:) beside them")
    if labels is None:
        raise InputError(f"{src} is images/ beside a mask folder (semantic segmentation): name the classes with "
                         "--labels FILE (line i names the class whose pixels are i in the masks)")
    located = dict(listing.entries())
    skipped: collections.Counter[str] = collections.Counter(listing.skipped)
    masks_by_stem = {posixpath.splitext(path[len(mask_folder) + 1:])[0]: path for path in located
                     if path.startswith(mask_folder + "/") and path.lower().endswith(".png")}
    images, used = [], set()
    for path in sorted(located):
        if not path.startswith("images/") or skip_reason(path, skipped) or not formats.has_image_extension(path):
            continue
        stem = posixpath.splitext(path[len("images/"):])[0]
        mask = masks_by_stem.get(stem)
        if mask is None:
            skipped["no-mask"] += 1
            continue
        used.add(stem)
        parts = stem.split("/")
        split = (record_schema.split_named(parts[0]) or "train") if len(parts) > 1 else "train"
        objects = annotations.Objects(annotated_plan.derived_source_id(path), (), annotations.STORED, False,
                                      class_mask=(mask, located[mask]))
        images.append(annotated_plan.AnnotatedImage(split, path, objects, located[path]))
    unmatched = len(masks_by_stem) - len(used)
    if unmatched:
        skipped["mask-without-image"] += unmatched
    if not images:
        raise InputError(f"{src}: no image in images/ has a mask of the same name in {mask_folder}/ "
                         f"(e.g. images/a.jpg beside {display_path(mask_folder)}/a.png)")
    seg = {record_schema.SEGMENTATION_ENCODED: "bytes", record_schema.SEGMENTATION_FORMAT: "bytes"}
    return annotated_plan.plan(src, images, tuple(labels), options.val_fraction, options.seed, skipped,
                               scratch=scratch, task=record_schema.TASK_SEGMENTATION, extra_features=seg)
