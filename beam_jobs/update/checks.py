"""What an update refuses before it converts anything: the source, the options, a version that dropped images.

In:  the conversion's options (as given with ``--update``), the latest version of OUT (its manifest).
Out: SRC's plan (:class:`beam_jobs.planning.discover.InputPlan`, listed once) when SRC is a source updates
     support (class folders, or a label file: ``--annotations`` CSV, TSV or JSON Lines, one label an image or
     several, ``--label-separator``),
     else :class:`UpdateRefusedError` naming the source, the flag or the version at fault.

(docs/converter.md, "Updating a dataset": the rule, and what is not updated yet.)
"""

from __future__ import annotations

import json
from typing import Optional

import record_schema
from beam_jobs.files import version_store
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run_plan
from beam_jobs.planning import discover
from beam_jobs.sources.objects import coco

# The options whose change would change records already written: an update keeps them (flag -> what it is).
_FIXED = {"encode": "the image options (--max-side, --quality, --min-side, ...)", "seed": "--seed",
          "val_fraction": "--val-fraction", "labels_file": "--labels", "drop_leaks": "--drop-leaks",
          "synsets": "--synsets"}


class UpdateRefusedError(discover.InputError):
    """The update cannot be made as asked (another source than class folders, other options...)."""


def refuse_dropped(out: str, latest: version_store.Version) -> None:
    """Refuse a latest version that left images out (``--drop-leaks``): they are in no sources table, so the
    update would take them for new images and convert them, undoing the drop (issue #59's review)."""
    manifest = latest.manifest
    dropped = manifest.get("duplicates", {}).get("num_dropped", 0)
    if manifest.get("options", {}).get("drop_leaks") or dropped:
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
            raise UpdateRefusedError(
                f"--update: {flag} is {now.get(key)!r} here but {before[key]!r} in the latest version of "
                f"{options.out}; an update keeps the options the records were written with (give the same, or "
                "convert again with --overwrite)")


def source_plan(options: ConvertOptions, scratch: str) -> discover.InputPlan:
    """SRC's plan (listed once), refused unless it is class folders or a label file (``--annotations`` CSV, TSV
    or JSON Lines, one label an image or several: the sources updates support yet), naming the source it is
    read as."""
    given = [flag for flag, value in (("--label-member", options.label_member),
                                      ("--val-labels", options.val_labels), ("--config", options.config),
                                      ("--image-column", options.image_column),
                                      ("--label-column", options.label_column)) if value]
    if given:
        _refuse(options, f"the source {given[0]} names")
    if options.annotations and coco.is_coco_file(options.annotations):  # before a COCO file is read whole
        _refuse(options, f"an annotated dataset (COCO: --annotations {options.annotations})")
    plan = run_plan.plan_inputs(options, scratch, None)
    if plan.task not in (record_schema.TASK_CLASSIFICATION, record_schema.TASK_MULTILABEL):
        _refuse(options, f"an annotated dataset (COCO, YOLO, Pascal VOC, CVAT or masks beside images: task {plan.task!r})")
    if plan.provenance:
        _refuse(options, "a Parquet dataset (the Hub's)")
    if plan.archives or any(ref.source for ref in plan.refs):
        _refuse(options, "images inside archives")
    return plan


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


def _refuse(options: ConvertOptions, kind: str) -> None:
    raise UpdateRefusedError(f"--update supports class folders and label files only for now; {options.src} is read "
                             f"as {kind}: convert it again with --overwrite")
