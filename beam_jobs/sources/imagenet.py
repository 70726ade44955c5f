"""ImageNet (ILSVRC-2012) as it ships: class folders for train, a flat ``val/`` labelled by a file.

::

    SRC/train/n01440764/n01440764_10026.JPEG ...    (one folder per wnid)
    SRC/val/ILSVRC2012_val_00000001.JPEG ...        (flat)

``--val-labels FILE`` labels the flat folder, in either published form:

* the Kaggle release's ``LOC_val_solution.csv`` (``ImageId,PredictionString``;
  the first token of the prediction string is the wnid);
* the TF models repository's ``imagenet_2012_validation_synset_labels.txt``:
  one wnid per line, for the validation images in file-name order.

``--synsets FILE`` (``LOC_synset_mapping.txt``: ``n01440764 tench, Tinca
tinca``) gives each class its text; label ids stay the sorted wnids, as the
TF models scripts assign them (0-based here). The same flag pair works for any
dataset whose train split is class folders and whose validation split is flat.
ImageNet's odd files (a PNG named ``.JPEG``, CMYK and grayscale JPEGs) are
handled by the converter's per-image policy like any other input. Every other file of SRC (a ``test/`` folder,
the Kaggle release's CSVs, a README) is skipped and named in ``skipped.jsonl`` with its reason.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import posixpath
from typing import Iterable, Iterator, Optional, Sequence

import record_schema
from beam_jobs.planning import discover
from beam_jobs.planning.discover import InputError, InputPlan, Listing
from beam_jobs import formats
from beam_jobs.planning.listing import NOT_AN_IMAGE, SkippedFiles, is_hidden, skip_reason
from beam_jobs.stage_records import ImageRef

_FLAT_SPLITS = {name for name, split in record_schema.SPLIT_NAMES.items() if split == "validation"}


def plan(src: str, listing: Listing, val_labels: str, labels: Optional[Sequence[str]], seed: int,
         scratch: Optional[str] = None, synsets: Optional[str] = None) -> InputPlan:
    """The plan of an ImageNet-shaped SRC: ``train/<class>/...`` plus a flat validation folder.

    Holds the flat folder's names (ImageNet: 50,000) and the train classes;
    train images stream from the listing (see :mod:`beam_jobs.planning.discover`).
    """
    flat = sorted(entry for entry in listing.entries() if entry[0].count("/") == 1
                  and entry[0].split("/")[0].lower() in _FLAT_SPLITS and not is_hidden(entry[0]))
    if not flat:
        raise InputError(f"--val-labels needs a flat validation folder: {src}/val/<image> (found none)")
    folder = flat[0][0].split("/")[0]
    train_listing = Listing(_Train(listing.files), tuple(d for d in listing.dirs if d.split("/")[0].lower() == "train"),
                            listing.skipped, None if listing.located is None else _Train(listing.located),
                            archive_folders=listing.archive_folders)
    if not any(True for _ in train_listing.files):
        raise InputError(f"{src} has no train/<class>/<image> folders beside {folder}/")
    train = discover.plan_inputs(train_listing, labels, 0.0, seed, src=src, scratch=scratch)
    label_of_file = read_val_labels(val_labels, sorted(posixpath.basename(p) for p, _ in flat))
    unknown = sorted({name for name in label_of_file.values() if name not in train.classes})
    if unknown:
        raise InputError(f"--val-labels {val_labels} names classes with no train folder: {unknown[:5]}")

    def triples() -> Iterator[tuple[str, str, str, str]]:
        for ref in train.refs:
            yield "train", train.classes[ref.label], ref.relpath, ref.source
        for path, source in flat:
            yield "validation", label_of_file[posixpath.basename(path)], path, source

    members = discover.collect_members(triples(), scratch)
    refused = [ImageRef("validation" if path.split("/")[0].lower() in _FLAT_SPLITS else "train", path, 0, source)
               for path, source in listing.refused]
    skipped = train.skipped_files if train.skipped_files is not None else SkippedFiles(train.skipped, scratch)
    _account(listing, folder, {path for path, _ in flat}, _inside(src, (val_labels, synsets)), skipped)
    made = discover.plan_from_members(members, train.classes, 0.0, seed, src, skipped, what="classes",
                                      refused=refused)
    return dataclasses.replace(made, skipped_files=skipped)


def _account(listing: Listing, folder: str, flat: set[str], read: set[str], skipped: SkippedFiles) -> None:
    """Every file outside ``train/`` (whose own are accounted for by the class folders' plan) that is not an image
    of the flat ``folder`` nor a flag's file read: skipped and named with its reason (an image elsewhere,
    ``test/``'s unlabelled ones or a class folder inside ``folder``, as ``not-in-layout``)."""
    for path, _ in listing.entries():
        if path.split("/")[0].lower() == "train" or path in flat or path in read or skip_reason(path, skipped):
            continue
        if formats.has_image_extension(path):
            skipped.add(path, "not-in-layout", f"an image in neither train/<class>/ nor the flat {folder}/")
        else:
            skipped.add(path, NOT_AN_IMAGE, f"neither an image of train/<class>/ nor of the flat {folder}/")


def _inside(src: str, paths: Iterable[Optional[str]]) -> set[str]:
    """The flags' files (``--val-labels``, ``--synsets``) that lie inside a local SRC, as its listing's paths: read,
    not skipped."""
    base = os.path.abspath(src[len("file://"):] if src.startswith("file://") else src) + os.sep
    found = set()
    for path in paths:
        if path and "://" not in path and os.path.abspath(path).startswith(base):
            found.add(os.path.abspath(path)[len(base):].replace(os.sep, "/"))
    return found


class _Train:
    """The listed files (paths, or ``(path, source)`` entries) under ``train/``, re-iterable (streamed from the
    listing on each pass)."""

    def __init__(self, files: Iterable) -> None:
        self._files = files

    def __iter__(self) -> Iterator:
        return (item for item in self._files
                if (item if isinstance(item, str) else item[0]).split("/")[0].lower() == "train")


def read_val_labels(path: str, names: Sequence[str]) -> dict[str, str]:
    """File name -> wnid for every image of the flat folder, from either published form.

    Raises:
      InputError: unreadable or malformed, or it does not cover the folder's images.
    """
    text = discover.read_flag_file("--val-labels", path)
    lines = text.splitlines()
    if lines and lines[0].replace(" ", "").lower().startswith("imageid,predictionstring"):
        by_stem = {}
        for number, row in enumerate(csv.reader(io.StringIO("\n".join(lines[1:]))), start=2):
            if not row:
                continue
            if len(row) != 2 or not row[1].split():
                raise InputError(f"--val-labels {path} line {number} is not 'ImageId,PredictionString': {row}")
            by_stem[row[0].strip()] = row[1].split()[0]
        missing = [name for name in names if posixpath.splitext(name)[0] not in by_stem]
        if missing:
            raise InputError(f"--val-labels {path} has no label for {len(missing)} of the {len(names)} validation "
                             f"images (e.g. {missing[0]})")
        return {name: by_stem[posixpath.splitext(name)[0]] for name in names}
    wnids = [line.strip() for line in lines if line.strip()]
    if len(wnids) != len(names):
        raise InputError(f"--val-labels {path} has {len(wnids)} labels, one per line for the validation images in "
                         f"file-name order, but the validation folder holds {len(names)} images")
    for number, wnid in enumerate(wnids, start=1):
        if len(wnid.split()) != 1:
            raise InputError(f"--val-labels {path} line {number} is not a single class id: {wnid!r}")
    return dict(zip(names, wnids))


def read_synsets(path: str, classes: Sequence[str]) -> tuple[str, ...]:
    """Each class's text from a synset mapping (``n01440764 tench, Tinca tinca`` per line)."""
    text = discover.read_flag_file("--synsets", path)
    mapping = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        wnid, _, words = line.strip().partition(" ")
        if not words.strip():
            raise InputError(f"--synsets {path} line {number} is not 'ID text': {line!r}")
        mapping[wnid] = words.strip()
    missing = [name for name in classes if name not in mapping]
    if missing:
        raise InputError(f"--synsets {path} has no text for classes {missing[:5]}")
    return tuple(mapping[name] for name in classes)
