"""WebDataset samples as the input: ``--label-member EXT`` labels each image from its sibling member.

img2dataset (LAION, DataComp) and WebDataset's own writers ship samples as
members sharing a *key*, the name up to its first dot: ``000123.jpg`` with
``000123.cls`` (the class as text) and ``000123.json`` (metadata). With
``--label-member cls`` each image's class is the text of ``<key>.cls``; with
``--label-member json:FIELD``, the field FIELD of ``<key>.json``. It works in
folders and archives alike (a folder of ``00000.tar`` shards, one shard, a tree
of them), and folder and archive names are not classes; a top folder named as
a split (``train/``, ``val/``, ``test/``) still gives the split.

In:  a :class:`beam_jobs.planning.discover.Listing` (archives already read as folders).
Out: the :class:`beam_jobs.planning.discover.InputPlan` of the samples' images; label
     ids index the sorted classes (numerically when every class is an
     integer, as label files do), or ``--labels``.

A sample's members are consecutive, as WebDataset requires (a tar written by
its tools, a folder's sorted listing). A sample with no label member, or a
label member without the field or not readable, is listed only to be rejected
as ``missing-label``; a label member with no image beside it as
``missing-image``; never silently dropped. The label members and other
metadata (``.txt`` captions...) are skipped as ``sample-metadata``, each named in ``skipped.jsonl`` (the label
member too: it is read for its label, and is no image).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Iterator, Optional, Sequence

from beam_jobs import formats
from beam_jobs.options import LabelMember
from beam_jobs.planning import discover
from beam_jobs.planning.discover import InputError, InputPlan, Listing
from beam_jobs.planning.listing import SkippedFiles, skip_reason
from beam_jobs.sources.archives import archive_members
from beam_jobs.stage_records import ImageRef

SPLIT_FOLDERS = {"train": "train", "val": "validation", "validation": "validation", "test": "test"}


def key_of(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member's file name: WebDataset's split at the first dot."""
    key, _, extension = name.partition(".")
    return key, extension.lower()


def plan(src: str, listing: Listing, label_member: LabelMember, labels: Optional[Sequence[str]], read_label,
         val_fraction: float, seed: int, scratch: Optional[str] = None) -> InputPlan:
    """The plan of the samples ``listing`` holds; ``read_label(path, source) -> bytes`` reads a label member."""
    skipped = SkippedFiles(listing.skipped, scratch)
    refused: list[ImageRef] = []

    def members() -> Iterator[tuple[str, str, str, str]]:
        for sample in _samples(listing.entries(), skipped):
            yield from _sample_members(sample, label_member, read_label, refused, skipped)

    found = discover.collect_members(members(), scratch)
    if not found.counts:
        raise InputError(f"{src} holds no WebDataset samples with a .{label_member.extension} member beside an image "
                         f"(found {len(refused)} samples without one): check --label-member")
    made = discover.plan_from_members(found, labels, val_fraction, seed, src, skipped, what="labels",
                                      refused=refused)
    return dataclasses.replace(made, skipped_files=skipped)


def _samples(entries: Iterator[tuple[str, str]], skipped: SkippedFiles) -> Iterator[list[tuple[str, str]]]:
    """Consecutive entries of one folder sharing a key, as lists of ``(path, source)``."""
    current: list[tuple[str, str]] = []
    current_id = None
    for path, source in entries:
        if skip_reason(path, skipped):
            continue
        folder, name = posixpath.split(path)
        sample_id = (folder, key_of(name)[0])
        if sample_id != current_id and current:
            yield current
            current = []
        current_id = sample_id
        current.append((path, source))
    if current:
        yield current


def _sample_members(sample: list[tuple[str, str]], label_member: LabelMember, read_label,
                    refused: list[ImageRef], skipped: SkippedFiles) -> Iterator[tuple[str, str, str, str]]:
    """``(split, class, path, source)`` of each image of one sample, or its rejections added to ``refused``."""
    split = SPLIT_FOLDERS.get(sample[0][0].split("/")[0].lower(), "train") if "/" in sample[0][0] else "train"
    images, label_entry, refusals = [], None, []
    for path, source in sample:
        extension = key_of(posixpath.basename(path))[1]
        if source.startswith(archive_members.REFUSED):
            refusals.append(ImageRef(split, path, 0, source))
        elif formats.has_image_extension(posixpath.basename(path)) and extension != label_member.extension:
            images.append((path, source))
        elif extension == label_member.extension:
            label_entry = (path, source)
            skipped.add(path, "sample-metadata", f"the sample's label member (--label-member {label_member.extension}"
                        "): read for its label, no image", warned=True)
        else:  # captions, metadata: not images
            skipped.add(path, "sample-metadata", "a member of the sample that is no image (a caption, metadata)",
                        warned=True)
    refused.extend(refusals)
    if not images:
        if label_entry is not None:
            refused.append(ImageRef(split, label_entry[0], 0, archive_members.refusal(
                "missing-image", "a sample with a label member and no image")))
        return
    label, problem = _label(label_entry, label_member, read_label)
    for path, source in images:
        if problem:
            refused.append(ImageRef(split, path, 0, archive_members.refusal("missing-label", problem)))
        else:
            yield split, label, path, source


def _label(entry: Optional[tuple[str, str]], label_member: LabelMember, read_label) -> tuple[str, str]:
    """``(class, "")``, or ``("", why there is none)``."""
    wanted = f"{label_member.extension}" + (f" field {label_member.field!r}" if label_member.field else "")
    if entry is None:
        return "", f"no .{label_member.extension} member beside it (--label-member {wanted})"
    try:
        text = read_label(*entry).decode("utf-8").strip()
    except (OSError, ValueError) as err:  # ValueError: not UTF-8, or an archive member not as declared
        return "", f"its label member {entry[0]} could not be read: {err}"
    if label_member.field:
        try:
            value = json.loads(text)[label_member.field]
        except (ValueError, KeyError, TypeError, IndexError):
            return "", f"{entry[0]} has no field {label_member.field!r} (--label-member {wanted})"
        if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
            return "", f"{entry[0]}'s field {label_member.field!r} is {value!r}, not a class name or id"
        text = str(value).strip()
    if not text or "\n" in text:
        return "", f"{entry[0]} holds {text[:40]!r}, not one class name or id"
    return text, ""
