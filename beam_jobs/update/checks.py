"""What an update refuses before it converts anything: the source, the options, a version that dropped images.

In:  the conversion's options (as given with ``--update``), the latest version of OUT (its manifest).
Out: SRC's plan (:class:`beam_jobs.planning.discover.InputPlan`, listed once) when SRC is a source updates
     support (class folders; a label file: ``--annotations`` CSV, TSV or JSON Lines, one label an image or
     several, ``--label-separator``; COCO, with Label Studio's; YOLO; Pascal VOC; CVAT; class masks, ``--masks``;
     WebDataset; ImageNet; the Hub's Parquet; each in folders or archives: every source), else
     :class:`UpdateRefusedError` naming the source, the flag or the version at fault.

(docs/converter.md, "Updating a dataset": the rule, and what is not updated yet.)
"""

from __future__ import annotations

import collections

import json
import logging
from typing import Iterable, Optional

import record_schema
from beam_jobs import sources
from beam_jobs.files import version_store
from beam_jobs.options import ConvertOptions
from beam_jobs.planning import discover
from beam_jobs.sources.hub import hub

logger = logging.getLogger(__name__)

# The options whose change would change records already written: an update keeps them (flag -> what it is).
_FIXED = {"encode": "the image options (--max-side, --quality, --min-side, ...)", "seed": "--seed",
          "val_fraction": "--val-fraction", "labels_file": "--labels", "drop_leaks": "--drop-leaks",
          "synsets": "--synsets"}

# The image options' fields whose flag is not the field's name with dashes.
_FLAGS = {"perceptual_hash": "the perceptual hash (--near-distance off when False)"}


class UpdateRefusedError(discover.InputError):
    """The update cannot be made as asked (another source than class folders, other options...)."""


def refuse_dropped(out: str, latest: version_store.Version) -> None:
    """Refuse a latest version a conversion wrote that left images out (``--drop-leaks``): they are in no sources
    table, so the update would take them for new images and convert them, undoing the drop (issue #59's review).
    An update's version lists its left-out images in its sources table (no record, as a rejected image's)."""
    manifest = latest.manifest
    dropped = manifest.get("duplicates", {}).get("num_dropped", 0)
    if dropped and "previous_version" not in manifest:
        raise UpdateRefusedError(
            f"--update: version {latest.number} of {out} was converted with --drop-leaks ({dropped} image(s) "
            "dropped); an update cannot keep them dropped yet and would convert them back; convert SRC again "
            "with --overwrite (and --drop-leaks) instead")


def check_options(options: ConvertOptions, manifest: dict) -> None:
    """Refuse options that would change how the records already written were made, naming the flag."""
    now = json.loads(json.dumps(options.to_json(), default=str))
    before = manifest.get("options", {})
    for key, flag in _FIXED.items():
        if key in before and before[key] != now.get(key):
            differ = _differing(before[key], now.get(key))
            said = ("; ".join(f"{_FLAGS.get(name, '--' + name.replace('_', '-'))} is {new!r} here but {old!r}"
                              for name, old, new in differ)
                    if differ else f"{flag} is {now.get(key)!r} here but {before[key]!r}")
            raise UpdateRefusedError(
                f"--update: {said} in the latest version of {options.out}; an update keeps the options the records "
                "were written with (give the same, or convert again with --overwrite)")


def _differing(before: object, now: object) -> list[tuple[str, object, object]]:
    """The fields two option groups (dicts: the image options) differ in, by name, or [] when not both dicts:
    the refusal names the flag changed, not the group's two whole dicts (the trial's finding)."""
    if not (isinstance(before, dict) and isinstance(now, dict)):
        return []
    return [(name, before.get(name), now.get(name)) for name in sorted(set(before) | set(now))
            if before.get(name) != now.get(name)]


# The sources an update reads (beam_jobs.sources.SOURCES's names): each image's identity is its path under SRC (a
# member's: in the extraction), its stamp its file's, member's or mask's (beam_jobs.sources.source_stamps), and what
# labels it (a label, tags, objects) comes with its ref, compared by id or digest. Archives read as folders; a
# Parquet row's identity is its record's name (its image path, else its number in the split), its stamp its file's.
UPDATABLE = ("class-folders", "label-file", "coco", "yolo", "pascal-voc", "cvat", "voc-segmentation", "mask-folders",
             "webdataset", "hugging-face", "hugging-face-file", "imagenet")
_WHAT_WORKS = ("class folders, label files (--annotations CSV, TSV, JSON Lines), COCO, YOLO, Pascal VOC, CVAT, class "
               "masks, WebDataset (--label-member), ImageNet (--val-labels) and the Hub's Parquet, in folders or "
               "archives")


def source_plan(options: ConvertOptions, scratch: str) -> discover.InputPlan:
    """SRC's plan (listed once, its skips and warnings logged as a conversion logs them), refused unless its
    source is one updates support (:data:`UPDATABLE`: refused before that source reads its annotations), naming
    the source it is read as and what works."""
    source, request = sources.claiming(options, scratch)
    if source.name not in UPDATABLE:
        _refuse(options, f"{source.what} ({source.name})")
    plan = sources.planned(source, request)
    if plan.skipped:
        logger.info("skipped without reading: %s", plan.skipped)
    for warning in plan.warnings:
        logger.warning("%s", warning)
    return plan


def check_objects(options: ConvertOptions, plan: discover.InputPlan, manifest: dict) -> None:
    """Refuse an object dataset whose record ids would mean another thing than the latest version's: another
    task (objects where the version holds labels), or another offset of the records' ids from the source's."""
    before = manifest.get("task", record_schema.TASK_CLASSIFICATION)
    if plan.task != before:
        raise UpdateRefusedError(f"--update: {options.src} is read as {plan.task!r} records but the latest version of "
                                 f"{options.out} holds {before!r} ones; convert it again with --overwrite")
    repeated = sorted(name for name, count in collections.Counter(plan.classes).items() if name and count > 1)
    if repeated:  # an update maps classes by name: two ids of one name would become one (the review's finding)
        raise UpdateRefusedError(
            f"--update: {options.src} names the class {repeated[0]!r} more than once (ids "
            f"{[i for i, name in enumerate(plan.classes) if name == repeated[0]]}); an update keeps class ids by "
            "name, so their objects would merge into one id: give each category its own name, or convert again "
            "with --overwrite")
    offset = manifest.get("class_id_offset", 0)
    if plan.task == record_schema.TASK_OBJECTS and plan.class_id_offset != offset:
        raise UpdateRefusedError(
            f"--update: {options.src}'s class ids are written {plan.class_id_offset} higher than the source's, but "
            f"those of the latest version of {options.out} {offset} higher (class_id_offset): the ids would mean "
            "other classes; convert it again with --overwrite")


def check_row_names(options: ConvertOptions, plan: discover.InputPlan, out: str,
                    latest: version_store.Version) -> None:
    """Refuse a Hub dataset whose rows an update would match by their number (issue #59's review, finding 2).

    A split whose rows have no distinct image path names its records by row number (:mod:`beam_jobs.sources.hub.
    hub`): one row deleted or inserted renames every later row. With ``--val-fraction`` a "changed" row keeps the
    split of the name it now has, so training photos would become validation images; and a split named otherwise
    now than in the latest version (a new row repeating a path, or without one) would see every row deleted and
    added again. Both are refused, naming the split; the way that works is a conversion again. Reads the latest
    version's sources table once when its manifest does not say how its splits were named (versions before it
    did, and updates that converted no row)."""
    now = plan.provenance.get("source_parquet", {}).get("names") if plan.provenance else None
    if now is None:  # not the Hub's Parquet
        return
    before = latest.manifest.get("source_parquet", {}).get("names") or _names_in_table(out, latest, now)
    how = {hub.PATH_NAMES: "by their image paths", hub.ROW_NAMES: "by their row numbers (no distinct image path)"}
    for split in sorted(set(now) | set(before)):
        if split in now and split in before and now[split] != before[split]:
            raise UpdateRefusedError(
                f"--update: the {split} split of {options.src} names its rows {how[now[split]]}, but version "
                f"{latest.number} of {out} named them {how[before[split]]} (a row without an image path, or two "
                "rows of one path, name a split's rows by number): every row would be deleted and added again; "
                "convert SRC again with --overwrite")
        if options.val_fraction > 0 and hub.ROW_NAMES in (now.get(split), before.get(split)):
            raise UpdateRefusedError(
                f"--update: the {split} split of {options.src} names its rows by their row numbers (they have no "
                "distinct image path), so a row deleted or inserted renames every later row, and with "
                "--val-fraction a renamed row would keep the split of the row it is named after (a training "
                "photo could become a validation image); convert SRC again with --overwrite")


def _names_in_table(out: str, latest: version_store.Version, splits: Iterable[str]) -> dict[str, str]:
    """How the latest version named each of ``splits``: by row numbers when its first row's number-name is in
    the version's sources table (a rejected row is there too), else by paths; one pass, a row group at a time."""
    first = {hub.row_name(split, 0): split for split in splits}
    seen, numbered = set(), set()
    for row in version_store.iter_sources(out, latest):
        split = row.path.partition("/")[0]
        if split in splits:
            seen.add(split)
        if row.path in first:
            numbered.add(first[row.path])
    return {split: hub.ROW_NAMES if split in numbered else hub.PATH_NAMES for split in seen}


def unlabelled_warning(options: ConvertOptions, version: int, unlabelled: int) -> Optional[str]:
    """What to tell the user when a label file's images were compared with rows that record no label (a sources
    table written before the ``label`` column): a relabel of those is not seen, and the update records the
    file's labels as theirs, so no later update sees it either. None when there is nothing to say."""
    if not (options.annotations and unlabelled):
        return None
    return (f"--update: {unlabelled} image(s) of version {version} of {options.out} have no label recorded (its "
            "sources table was written before labels were): if --annotations "
            f"{options.annotations} labels any of them otherwise now, this update does not see it (--rehash "
            "compares bytes, not labels); to be sure of every label, convert SRC again with --overwrite")


def unannotated_warning(options: ConvertOptions, version: int, unannotated: int) -> Optional[str]:
    """What to tell the user when object images were compared with rows that record no annotation digest: a
    version 1 converted before conversions wrote its sources table (:mod:`beam_jobs.pipeline.first_sources`; a
    conversion now records every digest, so its first update compares boxes as later ones do). Their objects'
    classes are compared (the records tables hold them), their boxes not; their rows stay without a digest, so a
    later ``--rehash`` still converts them (once). None when there is none."""
    if not unannotated:
        return None
    return (f"--update: {unannotated} image(s) of version {version} of {options.out} have no annotation digest "
            "recorded (it was converted before conversions recorded them): their objects' classes were compared, "
            "not their boxes; to compare their boxes, update with --rehash once (it converts those images again, "
            "in the splits and with the class ids they had; later updates compare every image's boxes)")


def _refuse(options: ConvertOptions, kind: str) -> None:
    raise UpdateRefusedError(f"--update supports {_WHAT_WORKS} only for now; {options.src} is read as {kind}: "
                             "convert it again with --overwrite")
