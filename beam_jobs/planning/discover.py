"""Discover the inputs: list SRC, find splits and classes, assign label ids.

Listing happens once, on the machine that launches the job (like TFDS and the
tensorflow/models scripts), because label ids need the global view: they are
indices into the sorted union of class names over all splits, so a class that
is missing from one split never shifts the ids of the others.

:func:`plan_inputs` holds every rule of class folders (relative paths in, plan out);
:mod:`beam_jobs.planning.listing` is the only part that touches a file system, and
:mod:`beam_jobs.planning.carve` carves validation out of train. Given a local
``scratch`` folder, both keep the per-image lists there (see
:class:`beam_jobs.files.work_records.Spilled`) and hold only counters, folders and
classes, so the launcher's memory does not grow with the number of images; the
rules make a few streaming passes over those lists instead. Without one (tests,
small inputs), the lists are held in memory and the plan's images are sorted.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import re
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import record_schema
from beam_jobs import formats
from beam_jobs.files import work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.planning.carve import carve_count, carve_key, carve_thresholds
from beam_jobs.planning.listing import (  # noqa: F401 - the listing's names, as every source's plan meets them
    NOT_AN_IMAGE,
    SYSTEM_FILES,
    InputError,
    Listing,
    SkippedFiles,
    display_path,
    is_hidden,
    list_tree,
    listing_of,
    not_an_image,
    plain_container,
    scratch_file,
    skip_reason,
    walk,
)
from beam_jobs.stage_records import ImageRef

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class InputPlan:
    """The images to convert, their labels and what was skipped.

    Attributes:
      refs: every image to read: re-iterable, with a length; sorted by (split,
        relpath) when held in memory, in listing order when streamed from
        scratch files (the output never depends on this order).
      classes: class names; label i is ``classes[i]``.
      skipped: reason -> count of files skipped without reading them.
      warnings: oddities worth telling the user that do not stop the run
        (a single class, classes without images, validation larger than train...).
      split_counts: images per split.
    """

    refs: Sequence[ImageRef] | "PlannedRefs"
    classes: tuple[str, ...]
    skipped: Mapping[str, int]
    warnings: tuple[str, ...] = ()
    class_text: tuple[str, ...] = ()  # each class's text for the records (--synsets); default: its name
    split_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    unlisted: tuple[str, ...] = ()  # classes (of --labels) with no listed file, already warned about
    # Compressed archives the listing inflated (beam_jobs.sources.archives.compressed.Inflated): the launcher puts
    # them in the run's work folder, where their members' sources point, before the pipeline reads them.
    inflated: tuple = ()
    # Each archive of SRC (not inside another), or each Parquet file of a Hugging Face dataset -> its size
    # and modification time: a changed one is a changed input.
    archives: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The rows a source reads at once (a Parquet row group; 0: each image alone): a part holds at least that many.
    read_unit: int = 0
    # What the manifest records of the inputs' files, a source's own (the Hub's: "source_parquet", its files and
    # revision); empty: "source_archives", each archive of SRC, when there are any.
    provenance: Mapping[str, object] = dataclasses.field(default_factory=dict)
    # What the records label: one class per image, or objects (record_schema.TASK_OBJECTS: each ref's
    # annotation holds its boxes, and ``classes[i]`` is the source's class id i, "" for an unused id).
    task: str = record_schema.TASK_CLASSIFICATION
    # Inputs held by containers refused whole (a cut Parquet file) beyond the one rejection each counts:
    # they count against the error budget, so a lost half of a split fails the run.
    lost_inputs: int = 0
    # Keys the records hold beyond the task's (record_schema.*_FEATURES): masks, when asked for -> their kind.
    extra_features: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Objects: record class id = the source's id + this (1 where the source numbers a real class 0, which the
    # records' convention keeps for the background: beam_jobs.sources.objects.annotated_plan).
    class_id_offset: int = 0
    # Objects: record class id -> the objects its annotations list (a class without any is not "all rejected").
    listed_objects: Mapping[int, int] = dataclasses.field(default_factory=dict)
    # Each skipped file named (``skipped.jsonl``), where the source names them; ``skipped`` counts every one.
    skipped_files: Optional[SkippedFiles] = None
    # --val-fraction on class folders: class name -> the images the carve moved to validation (a warning names
    # a class that ends up with none written: carve.unstratified).
    carved: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # (licence, the file stating it) an export's README states, for the Croissant card when the user gives
    # none (beam_jobs.sources.stated_license); empty: none stated, or the user gave one.
    stated_license: tuple[str, ...] = ()
    # Objects with keypoints: the manifest's "keypoints" (K, the points' names, the flip their names give:
    # beam_jobs.sources.objects.coco_extras.manifest_entry); empty: the records hold none.
    keypoints: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def split_sizes(self) -> dict[str, int]:
        return {split: self.split_counts[split] for split in record_schema.SPLITS if self.split_counts.get(split)}


@dataclasses.dataclass(frozen=True)
class Members:
    """``(split, class name, relpath, source)`` of every image, and the count per (split, class name).

    ``items`` is held in memory, or spilled to a scratch file (see :func:`collect_members`).
    """

    items: Iterable[tuple[str, str, str, str]]
    counts: Mapping[tuple[str, str], int]


def collect_members(triples: Iterable[tuple[str, str, str, str]], scratch: Optional[str] = None) -> Members:
    """Gather ``(split, class name, relpath, source)`` tuples, counting them: in memory, or streamed to ``scratch``."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def counted() -> Iterator[tuple[str, str, str]]:
        for triple in triples:
            counts[triple[0], triple[1]] += 1
            yield triple

    if scratch is None:
        items: Iterable[tuple[str, str, str, str]] = tuple(counted())
    else:
        items = work_records.spill(scratch_file(scratch, "members"), work_records.MEMBER, counted(),
                                   lambda t: work_records.encode_member(*t), work_records.decode_member)
    return Members(items, dict(counts))


class PlannedRefs:
    """The plan's images as ``ImageRef``: members with their label ids and carved split, re-iterable.

    Streams its members on every iteration (sorted first when they are held
    in memory anyway), so a plan of a billion images holds none of them.
    """

    def __init__(self, members: Members, label_of: Mapping[str, int], carve: Optional[Mapping[str, bytes]],
                 seed: int, refused: Sequence[ImageRef] = ()) -> None:
        self._members, self._label_of, self._carve, self._seed = members, dict(label_of), carve, seed
        self._refused = tuple(refused)  # listed only to be rejected (see Listing.refused): last
        self._count = sum(members.counts.values()) + len(self._refused)

    def _refs(self) -> Iterator[ImageRef]:
        carve, seed, label_of = self._carve, self._seed, self._label_of
        for split, name, relpath, source in self._members.items:
            if carve is not None:
                threshold = carve.get(name)
                carved = threshold is not None and carve_key(seed, relpath) <= threshold
                split = "validation" if carved else "train"
            yield ImageRef(split, relpath, label_of[name], source)

    def __iter__(self) -> Iterator[ImageRef]:
        if isinstance(self._members.items, tuple):
            ordered = sorted(self._refs(), key=lambda ref: (record_schema.SPLITS.index(ref.split), ref.relpath))
            return iter(ordered + list(self._refused))
        return itertools.chain(self._refs(), self._refused)

    def __len__(self) -> int:
        return self._count

    def __eq__(self, other: object) -> bool:
        """The same images with the same labels and splits, in the same order (reads both through)."""
        if not isinstance(other, PlannedRefs):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))



def read_flag_file(flag: str, path: str) -> str:
    """The text of the file a flag names (local or any Beam filesystem), or an InputError naming both."""
    try:
        with FileSystems.open(path) as handle:
            return handle.read().decode("utf-8-sig")
    except (OSError, ValueError) as err:  # Beam raises BeamIOError (an IOError) or decode errors
        raise InputError(f"{flag} {path!r} could not be read: {err}") from err


def read_labels_file(path: str) -> list[str]:
    """Class names from a ``--labels`` file: one per line, line i is label i."""
    text = read_flag_file("--labels", path)
    names = [line.strip() for line in text.splitlines()]
    while names and not names[-1]:
        names.pop()
    if not names:
        raise InputError(f"--labels {path!r} is empty; it needs one class name per line")
    for number, name in enumerate(names, start=1):
        if not name:
            raise InputError(f"--labels {path!r} line {number} is blank")
    duplicates = sorted(name for name, count in collections.Counter(names).items() if count > 1)
    if duplicates:
        raise InputError(f"--labels {path!r} lists {duplicates} more than once")
    return names


def plan_inputs(
    listing: Listing,
    labels: Optional[Sequence[str]] = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    src: str = "SRC",
    scratch: Optional[str] = None,
    read_head: Optional[Callable[[str, str], bytes]] = None,
) -> InputPlan:
    """Turn a listing of SRC into the plan of what to convert.

    Layout: when every top-level folder is a split name (train, validation or
    val, test), each holds class folders; otherwise SRC holds class folders and
    everything is the train split. Streaming passes over ``listing.files``;
    ``scratch`` (a local folder) keeps the images' list out of memory.

    Raises:
      InputError: no images, an empty class folder, a class missing from
        ``labels``, both ``val`` and ``validation``, or ``val_fraction`` on a
        tree that already has a validation split.

    ``read_head(path, source)``: a file's first bytes, to skip (and name) the files that are no image
    (:func:`beam_jobs.planning.listing.not_an_image`); without it every file in a class folder is an input.
    """
    skipped = SkippedFiles(listing.skipped, scratch)
    warnings: list[str] = []
    datasets = _dataset_folders(listing)
    for folder in datasets:
        warnings.append(f"{src}/{folder} is a converted dataset (it holds {record_schema.MANIFEST_FILE} and shards), "
                        "not a class: skipped. Point --src at the folder of images")
    inside = tuple(folder + "/" for folder in datasets)

    def visible(count: bool) -> Iterator[tuple[str, str]]:
        for path, source in listing.entries():
            if path.startswith(inside):
                if count:
                    skipped.add(path, "converted-dataset", "in a converted dataset's folder")
            elif not skip_reason(path, skipped if count else None):
                yield path, source

    top_dirs = {path.split("/")[0] for path, _ in visible(count=True) if "/" in path}
    dirs = [d for d in listing.dirs if d not in datasets and not d.startswith(inside)]
    top_dirs |= {d.split("/")[0] for d in dirs if not is_hidden(d)}
    split_layout = bool(top_dirs) and all(d.lower() in _SPLIT_NAMES for d in top_dirs)
    if split_layout and len({_SPLIT_NAMES[d.lower()] for d in top_dirs}) < len(top_dirs):
        raise InputError(f"{src} has split folders {sorted(top_dirs)} naming the same split twice")

    depth = 2 if split_layout else 1  # path parts before the file's class
    stray = _Stray()  # images not in a class folder, by folder
    not_images: set[tuple[str, str]] = set()  # (split, class folder) holding files skipped as no image

    def split_of(path: str) -> str:
        return _SPLIT_NAMES.get(path.split("/")[0].lower(), "train") if split_layout else "train"

    def triples() -> Iterator[tuple[str, str, str, str]]:
        for path, source in visible(count=False):
            parts = path.split("/")
            if len(parts) <= depth:
                skipped.add(path, "stray-file", "not in a class folder")
                if formats.has_image_extension(parts[-1]):
                    stray.add("/".join(parts[:-1]), path)
                continue
            why = read_head and not_an_image(parts[-1], functools.partial(read_head, path, source))
            if why:
                skipped.add(path, NOT_AN_IMAGE, why)
                not_images.add((split_of(path), parts[depth - 1]))
                continue
            yield split_of(path), parts[depth - 1], path, source

    members = collect_members(triples(), scratch)
    class_dirs = {tuple(d.split("/")[:depth]) for d in dirs if len(d.split("/")) >= depth}
    for parts in sorted(class_dirs):
        if any(is_hidden(part) for part in parts):
            continue
        split = _SPLIT_NAMES[parts[0].lower()] if split_layout else "train"
        if (split, parts[-1]) not in members.counts:
            folder = "/".join(parts)
            if (split, parts[-1]) in not_images:  # files, none an image (docs/, a ROM folder): no class
                warnings.append(f"{src}/{folder} holds no images, only files skipped as {NOT_AN_IMAGE} "
                                f"(named in {record_schema.SKIPPED_FILE}): not a class")
                continue
            if folder in listing.archive_folders:
                archive = listing.archive_folders[folder]
                # Refused whole (a refusal's locator is "!reason<TAB>detail"): its class would vanish, shifting ids.
                why = next((source[1:].split("\t", 1)[-1] for path, source in listing.refused if path == archive), "")
                if why:
                    raise InputError(f"class archive {src}/{archive} could not be read ({why}), so class "
                                     f"{parts[-1]!r} would have no images; replace it or remove it")
                raise InputError(f"class archive {src}/{archive} holds no images; remove it or add images")
            raise InputError(f"class folder {src}/{folder} holds no images; remove it or add images")
    if not members.counts:
        raise InputError(_no_images_message(src, stray, depth))
    for _, name in members.counts:
        if display_path(name) != name:
            raise InputError(
                f"class folder {src}/{display_path(name)} has a name that is not valid UTF-8, so it cannot "
                "be a class name (class names are stored as text in every record); rename it"
            )
    refused = [ImageRef(split_of(path), path, 0, source) for path, source in listing.refused]
    plan = plan_from_members(members, labels, val_fraction, seed, src, skipped, what="class folders", refused=refused)
    warnings += [_stray_warning(src, folder, count, examples, depth) for folder, count, examples in stray.folders()]
    return dataclasses.replace(plan, warnings=tuple(warnings) + plan.warnings, skipped_files=skipped)


class _Stray:
    """Images outside any class folder: a count and the first few paths (by name) per folder."""

    EXAMPLES = 3

    def __init__(self) -> None:
        self._count: collections.Counter[str] = collections.Counter()
        self._examples: dict[str, list[str]] = collections.defaultdict(list)

    def add(self, folder: str, path: str) -> None:
        self._count[folder] += 1
        examples = self._examples[folder]
        if len(examples) < self.EXAMPLES or path < examples[-1]:
            examples.append(path)
            examples.sort()
            del examples[self.EXAMPLES:]

    def folders(self) -> list[tuple[str, int, list[str]]]:
        return [(folder, self._count[folder], self._examples[folder]) for folder in sorted(self._count)]

    def total(self) -> int:
        return sum(self._count.values())


def _dataset_folders(listing: Listing) -> list[str]:
    """Folders under SRC that hold a converted dataset (our manifest and shards): never classes.

    ``--src`` pointed at the folder above the images also finds the dataset
    written beside them (``<SRC>-tfrecords``), which must not become a class.
    """
    folders = set(listing.dirs)
    manifests, shards = set(), set()
    for path in listing.files:
        folder, _, name = path.rpartition("/")
        if folder not in folders:
            continue
        if name == record_schema.MANIFEST_FILE:
            manifests.add(folder)
        elif record_schema.parse_shard_filename(name):
            shards.add(folder)
    found: list[str] = []
    for folder in sorted(manifests):  # parents sort before their sub-folders
        if not any(folder.startswith(f + "/") for f in found):
            found.append(folder)
    return [folder for folder in found if folder in shards]


def _stray_warning(src: str, folder: str, count: int, examples: Sequence[str], depth: int) -> str:
    """Images skipped because they are not in a class folder: say where, how many, and the likely fix."""
    if not folder:
        return (f"{count} images at the top level of {src} were skipped ({_few(examples, 3, count)}): only "
                f"{src}/<class>/<image> is read. If {src} is one class's folder, pass the folder that holds "
                "the class folders as --src")
    message = (f"{count} images directly in {src}/{folder} were skipped ({_few(examples, 3, count)}): only "
               f"{src}/{folder}/<class>/<image> is read")
    if _SPLIT_NAMES.get(folder.lower()) == "validation":
        message += (f". If {src}/{folder} is ImageNet's flat validation folder, give its labels with --val-labels "
                    "(LOC_val_solution.csv, or imagenet_2012_validation_synset_labels.txt)")
    return message


def plan_from_members(
    members: Members,
    labels: Optional[Sequence[str]],
    val_fraction: float,
    seed: int,
    src: str,
    skipped: Mapping[str, int],
    what: str = "classes",
    refused: Sequence[ImageRef] = (),
) -> InputPlan:
    """The plan of every input source: ``(split, class name, relpath)`` members in, refs with label ids out.

    Label ids index the sorted union of class names over all splits (or
    ``labels``), so a class missing from one split never shifts the others;
    ``val_fraction`` carves validation out of train; oddities become warnings.
    ``refused``: archive entries listed only to be rejected (see :class:`Listing`).
    """
    found = class_order({name for _, name in members.counts})
    if labels is not None:
        unknown = [name for name in found if name not in labels]
        if unknown:
            raise InputError(f"{what} {unknown[:10]} are not in --labels; add them to the file or remove them")
        classes = tuple(labels)
    else:
        classes = tuple(found)
    label_of = {name: index for index, name in enumerate(classes)}
    warnings = _class_warnings(src, found, classes, labels is not None)

    sizes: collections.Counter[str] = collections.Counter()
    for (split, _), count in members.counts.items():
        sizes[split] += count
    carve, wanted = None, {}
    if val_fraction > 0:
        splits = sorted({split for split, _ in members.counts})
        if splits != ["train"]:
            raise InputError(f"--val-fraction needs a single-split input, but {src} already has splits {splits}")
        single = sorted(name for (_, name), count in members.counts.items() if count < 2)
        if single:
            warnings.append(f"--val-fraction: classes {_few(single)} have a single image, which stays in train "
                            "(a class is split only when it has two or more images)")
        wanted = {name: carve_count(count, val_fraction) for (_, name), count in members.counts.items()}
        carve = carve_thresholds(members.items, {name: n for (split, name), n in members.counts.items()
                                                 if split == "train"},
                                 {name: k for name, k in wanted.items() if k}, seed)
        sizes["validation"] = sum(wanted.values())
        sizes["train"] -= sizes["validation"]

    for split in ("validation", "test"):
        if sizes["train"] and sizes[split] > sizes["train"]:
            warnings.append(f"split {split} has {sizes[split]} images, more than train's {sizes['train']}"
                            + (f" (--val-fraction {val_fraction:g})" if val_fraction > 0 else ""))
    refs = PlannedRefs(members, label_of, carve, seed, refused)
    return InputPlan(refs, classes, dict(sorted(skipped.items())), tuple(warnings),
                     split_counts={split: n for split, n in sizes.items() if n},
                     unlisted=tuple(name for name in classes if name not in set(found)),
                     carved={name: k for name, k in wanted.items() if k} if carve is not None else {})


def _few(names: Sequence[str], limit: int = 5, total: Optional[int] = None) -> str:
    """The first ``limit`` names, and how many more of ``total`` (default: all of ``names``) there are."""
    total = len(names) if total is None else total
    shown = ", ".join(names[:limit])
    return shown + (f" and {total - limit} more" if total > limit else "")


_INTEGER = re.compile(r"-?[0-9]+")


def class_order(names: Iterable[str]) -> list[str]:
    """Class names in label order: numerically when every name is an integer ("10" after "9"), else sorted.

    The same classes get the same ids however they are given (folders, label
    files, ImageNet's layout): folders ``0 1 2 10`` are labels 0, 1, 2, 3 in
    that order. Keras' ``image_dataset_from_directory`` sorts them as strings
    (``0 1 10 2``); the README says so. Ties ("7" and "007") keep string order.
    """
    names = list(names)
    if names and all(_INTEGER.fullmatch(name) for name in names):
        return sorted(names, key=lambda name: (int(name), name))
    return sorted(names)


def _class_warnings(src: str, found: Sequence[str], classes: Sequence[str], from_labels: bool) -> list[str]:
    warnings = []
    folded: dict[str, list[str]] = {}
    for name in found:
        folded.setdefault(name.casefold(), []).append(name)
    clashes = [names for names in folded.values() if len(names) > 1]
    if clashes:
        pairs = _few([" / ".join(names) for names in clashes])
        noun = "group of classes differs" if len(clashes) == 1 else "groups of classes differ"
        warnings.append(f"{len(clashes)} {noun} only in case ({pairs}): each is a class of its own here, but "
                        "they merge into one folder on a case-insensitive disk (macOS, Windows); rename or merge "
                        "them if they are one class")
    if len(found) == 1:
        warnings.append(f"{src} has a single class ({found[0]}): every record gets label 0. If {src}/{found[0]} "
                        "holds the class folders, pass it as --src")
    if from_labels:
        empty = [name for name in classes if name not in set(found)]
        if empty:
            noun = "class" if len(empty) == 1 else "classes"
            warnings.append(f"--labels names {len(empty)} {noun} with no images: {_few(empty)}")
    return warnings


def _no_images_message(src: str, stray: "_Stray", depth: int) -> str:
    """What was found instead of images in class folders, and the layout expected."""
    layout = f"expected {src}/<class>/<image> or {src}/<split>/<class>/<image>"
    # Only a hint for the message (formats are sniffed from content when converting).
    if stray.total():
        examples = sorted(path for _, _, paths in stray.folders() for path in paths)
        where = "at its top level" if depth == 1 else "directly in its split folders"
        return (f"{src} has no class folders: {stray.total()} files sit {where} ({_few(examples, 3, stray.total())}); {layout}. "
                f"Move each class's images into a folder named after the class")
    return f"{src} holds no images: {layout}"


_SPLIT_NAMES = record_schema.SPLIT_NAMES


