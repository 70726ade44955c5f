"""Semantic segmentation as many datasets ship it: an image folder beside a mask folder of the same stems.

In:  SRC holding ``images/`` and ``masks/`` (or ``annotations/``, ADE20K's name), optionally each with split
     folders (``train``/``training``, ``val``/``validation``, ``test``), ``images/<split>/<stem>.jpg`` beside
     ``masks/<split>/<stem>.png``: a PNG of class ids, pixel by pixel, the size of its image; and
     ``--labels``, naming class id i on line i (a mask holds numbers, not names).
Out: the plan (:mod:`beam_jobs.sources.objects.annotated_plan`, task ``segmentation``) of every image that has a
     mask, each record with ``image/segmentation/class/encoded`` (turned and resized with its image). An
     image without a mask is skipped and named (``no-mask``, in ``skipped.jsonl`` and a warning), as is a
     mask without an image.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Callable, Optional, Sequence

import record_schema
from beam_jobs import annotations, formats
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputError, InputPlan, Listing, display_path, skip_reason
from beam_jobs.planning.listing import SkippedFiles
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
    skipped = SkippedFiles(listing.skipped, scratch)
    masks_by_stem = {posixpath.splitext(path[len(mask_folder) + 1:])[0]: path for path in located
                     if path.startswith(mask_folder + "/") and path.lower().endswith(".png")}
    images, used, warnings = [], set(), []
    for path in sorted(located):
        if not path.startswith("images/") or skip_reason(path, skipped) or not formats.has_image_extension(path):
            continue
        stem = posixpath.splitext(path[len("images/"):])[0]
        mask = masks_by_stem.get(stem)
        if mask is None:
            skipped.add(path, "no-mask", f"no mask {display_path(mask_folder)}/{display_path(stem)}.png beside it")
            continue
        used.add(stem)
        parts = stem.split("/")
        split = (record_schema.split_named(parts[0]) or "train") if len(parts) > 1 else "train"
        objects = annotations.Objects(annotated_plan.derived_source_id(path), (), annotations.STORED, False,
                                      class_mask=(mask, located[mask]))
        images.append(annotated_plan.AnnotatedImage(split, path, objects, located[path]))
    for stem, mask in sorted(masks_by_stem.items()):
        if stem not in used:
            skipped.add(mask, "mask-without-image", f"no image images/{display_path(stem)}.<ext> beside it")
    if skipped.examples.get("no-mask"):
        count = skipped["no-mask"]
        warnings.append(f"{count} image{' has' if count == 1 else 's have'} no mask in {mask_folder}/: skipped "
                        f"({', '.join(skipped.examples['no-mask'])}{' ...' if count > 3 else ''}; "
                        f"each in {record_schema.SKIPPED_FILE})")
    if not images:
        raise InputError(f"{src}: no image in images/ has a mask of the same name in {mask_folder}/ "
                         f"(e.g. images/a.jpg beside {display_path(mask_folder)}/a.png)")
    seg = {record_schema.SEGMENTATION_ENCODED: "bytes", record_schema.SEGMENTATION_FORMAT: "bytes"}
    made = annotated_plan.plan(src, images, tuple(labels), options.val_fraction, options.seed, skipped, warnings,
                               scratch=scratch, task=record_schema.TASK_SEGMENTATION, extra_features=seg)
    return dataclasses.replace(made, skipped_files=skipped)
