"""The files that name a dataset's classes and describe it, written into staging beside the shards: published
with them or not at all.

In:  the plan's classes (and its task); the manifest and the user's card.
Out: ``labels.txt``, ``label_map.pbtxt`` (object and segmentation datasets) and ``croissant.json`` in staging.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import record_schema
from beam_jobs.files import filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.planning import discover
from record_files import croissant, dataset_card
from record_files.dataset_card import DatasetCard


def write_label_files(staging: str, plan: discover.InputPlan) -> None:
    """``labels.txt`` (one class a line, by id), and the label map where the records hold objects or masks."""
    filesystems.write_text(FileSystems.join(staging, record_schema.LABELS_FILE), "".join(c + "\n" for c in plan.classes))
    if plan.task in (record_schema.TASK_OBJECTS, record_schema.TASK_SEGMENTATION):
        filesystems.write_text(FileSystems.join(staging, record_schema.LABEL_MAP_FILE), label_map(plan.classes))


def label_map(classes: Sequence[str]) -> str:
    """The TF Object Detection API's label map (``item { id: 1 name: 'cat' }``) of the classes that have a name."""
    def quoted(name: str) -> str:
        return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "".join(f"item {{\n  id: {index}\n  name: {quoted(name)}\n}}\n" for index, name in enumerate(classes)
                   if name)


def card_of(card: Optional[DatasetCard], stated_license: Sequence[str]) -> Optional[DatasetCard]:
    """The user's card, with the licence the source's README states (``(licence, file)``) when it gives none."""
    return dataset_card.with_stated_license(card, *stated_license) if stated_license else card


def write_card(staging: str, out: str, manifest: dict, card: Optional[DatasetCard]) -> None:
    """``croissant.json`` into staging beside the manifest the commit writes: published with it or not at all."""
    name = os.path.basename(out.rstrip("/"))
    text = croissant.croissant_text(croissant.build_croissant(manifest, card, folder_name=name))
    filesystems.write_text(FileSystems.join(staging, croissant.CROISSANT_FILE), text)
