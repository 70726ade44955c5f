"""Discover the inputs: list SRC, find splits and classes, assign label ids.

Listing happens once, on the machine that launches the job (like TFDS and the
tensorflow/models scripts), because label ids need the global view: they are
indices into the sorted union of class names over all splits, so a class that
is missing from one split never shifts the ids of the others.

:func:`plan_inputs` is pure (relative paths in, plan out) and holds every rule;
:func:`list_tree` is the only part that touches a file system.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
from typing import Iterable, Mapping, NamedTuple, Optional, Sequence

from apache_beam.io.filesystems import FileSystems

import record_schema
from beam_jobs import formats

logger = logging.getLogger(__name__)

# Files that operating systems and tools leave in image folders.
SYSTEM_FILES = frozenset({"thumbs.db", "desktop.ini", ".ds_store"})


class InputError(ValueError):
    """SRC (or --labels) does not describe a dataset we can convert."""


class ImageRef(NamedTuple):
    """One listed input image: where it is and what it is labelled.

    ``relpath`` is relative to SRC, ``/``-separated. A NamedTuple, not a
    dataclass: millions of these are pickled between pipeline stages, and
    tuples pickle several times faster.
    """

    split: str
    relpath: str
    label: int


@dataclasses.dataclass(frozen=True)
class Listing:
    """What a walk of SRC found: file paths and folder paths, relative to SRC."""

    files: tuple[str, ...]
    dirs: tuple[str, ...] = ()
    # Reason -> count of entries the walk itself passed over (symlink loops...).
    skipped: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """The images to convert, their labels and what was skipped.

    Attributes:
      refs: every image to read, sorted by (split, relpath).
      classes: class names; label i is ``classes[i]``.
      skipped: reason -> count of files skipped without reading them.
      warnings: oddities worth telling the user that do not stop the run
        (a single class, classes without images, validation larger than train...).
    """

    refs: tuple[ImageRef, ...]
    classes: tuple[str, ...]
    skipped: Mapping[str, int]
    warnings: tuple[str, ...] = ()
    class_text: tuple[str, ...] = ()  # each class's text for the records (--synsets); default: its name

    def split_sizes(self) -> dict[str, int]:
        counts = collections.Counter(ref.split for ref in self.refs)
        return {split: counts[split] for split in record_schema.SPLITS if counts[split]}


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
) -> InputPlan:
    """Turn a listing of SRC into the plan of what to convert.

    Layout: when every top-level folder is a split name (train, validation or
    val, test), each holds class folders; otherwise SRC holds class folders and
    everything is the train split.

    Raises:
      InputError: no images, an empty class folder, a class missing from
        ``labels``, both ``val`` and ``validation``, or ``val_fraction`` on a
        tree that already has a validation split.
    """
    skipped: collections.Counter[str] = collections.Counter(listing.skipped)
    warnings: list[str] = []
    datasets = _dataset_folders(listing)
    for folder in datasets:
        warnings.append(f"{src}/{folder} is a converted dataset (it holds {record_schema.MANIFEST_FILE} and shards), "
                        "not a class: skipped. Point --src at the folder of images")
    inside = tuple(folder + "/" for folder in datasets)
    visible = []
    for path in listing.files:
        if path.startswith(inside):
            skipped["converted-dataset"] += 1
        elif not _skip_reason(path, skipped):
            visible.append(path)
    dirs = [d for d in listing.dirs if d not in datasets and not d.startswith(inside)]
    top_dirs = {path.split("/")[0] for path in visible if "/" in path}
    top_dirs |= {d.split("/")[0] for d in dirs if not _is_hidden(d)}
    split_layout = bool(top_dirs) and all(d.lower() in _SPLIT_NAMES for d in top_dirs)
    if split_layout and len({_SPLIT_NAMES[d.lower()] for d in top_dirs}) < len(top_dirs):
        raise InputError(f"{src} has split folders {sorted(top_dirs)} naming the same split twice")

    depth = 2 if split_layout else 1  # path parts before the file's class
    members: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    stray: dict[str, list[str]] = collections.defaultdict(list)  # folder -> images not in a class folder
    for path in visible:
        parts = path.split("/")
        if len(parts) <= depth:
            skipped["stray-file"] += 1
            if formats.has_image_extension(parts[-1]):
                stray["/".join(parts[:-1])].append(path)
            continue
        split = _SPLIT_NAMES[parts[0].lower()] if split_layout else "train"
        members[(split, parts[depth - 1])].append(path)

    class_dirs = {tuple(d.split("/")[:depth]) for d in dirs if len(d.split("/")) >= depth}
    for parts in sorted(class_dirs):
        if any(_is_hidden(part) for part in parts):
            continue
        split = _SPLIT_NAMES[parts[0].lower()] if split_layout else "train"
        if (split, parts[-1]) not in members:
            raise InputError(f"class folder {src}/{'/'.join(parts)} holds no images; remove it or add images")
    if not members:
        raise InputError(_no_images_message(src, visible, depth))
    for _, name in members:
        if display_path(name) != name:
            raise InputError(
                f"class folder {src}/{display_path(name)} has a name that is not valid UTF-8, so it cannot "
                "be a class name (class names are stored as text in every record); rename it"
            )
    plan = plan_from_members(members, labels, val_fraction, seed, src, skipped, what="class folders")
    warnings += [_stray_warning(src, folder, paths, depth) for folder, paths in sorted(stray.items())]
    return dataclasses.replace(plan, warnings=tuple(warnings) + plan.warnings)


def _dataset_folders(listing: Listing) -> list[str]:
    """Folders under SRC that hold a converted dataset (our manifest and shards): never classes.

    ``--src`` pointed at the folder above the images also finds the dataset
    written beside them (``<SRC>-tfrecords``), which must not become a class.
    """
    files = set(listing.files)
    found = []
    for folder in listing.dirs:
        if f"{folder}/{record_schema.MANIFEST_FILE}" in files and not any(folder.startswith(f + "/") for f in found):
            found.append(folder)
    prefixes = tuple(f + "/" for f in found)
    shards = {path.rpartition("/")[0] for path in listing.files if path.startswith(prefixes)
              and record_schema.parse_shard_filename(path.rpartition("/")[2])}
    return [folder for folder in found if folder in shards]


def _stray_warning(src: str, folder: str, paths: Sequence[str], depth: int) -> str:
    """Images skipped because they are not in a class folder: say where, how many, and the likely fix."""
    if not folder:
        return (f"{len(paths)} images at the top level of {src} were skipped ({_few(paths, 3)}): only "
                f"{src}/<class>/<image> is read. If {src} is one class's folder, pass the folder that holds "
                "the class folders as --src")
    message = (f"{len(paths)} images directly in {src}/{folder} were skipped ({_few(paths, 3)}): only "
               f"{src}/{folder}/<class>/<image> is read")
    if _SPLIT_NAMES.get(folder.lower()) == "validation":
        message += (f". If {src}/{folder} is ImageNet's flat validation folder, give its labels with --val-labels "
                    "(LOC_val_solution.csv, or imagenet_2012_validation_synset_labels.txt)")
    return message


def plan_from_members(
    members: Mapping[tuple[str, str], list[str]],
    labels: Optional[Sequence[str]],
    val_fraction: float,
    seed: int,
    src: str,
    skipped: Mapping[str, int],
    what: str = "classes",
) -> InputPlan:
    """The plan of every input source: ``(split, class name) -> relative paths`` in, refs with label ids out.

    Label ids index the sorted union of class names over all splits (or
    ``labels``), so a class missing from one split never shifts the others;
    ``val_fraction`` carves validation out of train; oddities become warnings.
    """
    members = {key: list(paths) for key, paths in members.items()}
    found = sorted({name for _, name in members})
    if labels is not None:
        unknown = [name for name in found if name not in labels]
        if unknown:
            raise InputError(f"{what} {unknown[:10]} are not in --labels; add them to the file or remove them")
        classes = tuple(labels)
    else:
        classes = tuple(found)
    label_of = {name: index for index, name in enumerate(classes)}
    warnings = _class_warnings(src, found, classes, labels is not None)

    if val_fraction > 0:
        if any(split != "train" for split, _ in members):
            raise InputError(f"--val-fraction needs a single-split input, but {src} already has splits {sorted({s for s, _ in members})}")
        single = sorted(name for (_, name), paths in members.items() if len(paths) < 2)
        if single:
            warnings.append(f"--val-fraction: classes {_few(single)} have a single image, which stays in train "
                            "(a class is split only when it has two or more images)")
        members = _carve_validation(members, val_fraction, seed)

    refs = sorted(
        (ImageRef(split, path, label_of[name]) for (split, name), paths in members.items() for path in paths),
        key=lambda ref: (record_schema.SPLITS.index(ref.split), ref.relpath),
    )
    sizes = collections.Counter(ref.split for ref in refs)
    for split in ("validation", "test"):
        if sizes["train"] and sizes[split] > sizes["train"]:
            warnings.append(f"split {split} has {sizes[split]} images, more than train's {sizes['train']}"
                            + (f" (--val-fraction {val_fraction:g})" if val_fraction > 0 else ""))
    return InputPlan(tuple(refs), classes, dict(sorted(skipped.items())), tuple(warnings))


def _few(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _class_warnings(src: str, found: Sequence[str], classes: Sequence[str], from_labels: bool) -> list[str]:
    warnings = []
    if len(found) == 1:
        warnings.append(f"{src} has a single class ({found[0]}): every record gets label 0. If {src}/{found[0]} "
                        "holds the class folders, pass it as --src")
    if from_labels:
        empty = [name for name in classes if name not in set(found)]
        if empty:
            noun = "class" if len(empty) == 1 else "classes"
            warnings.append(f"--labels names {len(empty)} {noun} with no images: {_few(empty)}")
    return warnings


def _no_images_message(src: str, visible: Sequence[str], depth: int) -> str:
    """What was found instead of images in class folders, and the layout expected."""
    layout = f"expected {src}/<class>/<image> or {src}/<split>/<class>/<image>"
    # Only a hint for the message (formats are sniffed from content when converting).
    stray = [path for path in visible if len(path.split("/")) <= depth and formats.has_image_extension(path)]
    if stray:
        where = "at its top level" if depth == 1 else "directly in its split folders"
        return (f"{src} has no class folders: {len(stray)} files sit {where} ({_few(stray, 3)}); {layout}. "
                f"Move each class's images into a folder named after the class")
    return f"{src} holds no images: {layout}"


_SPLIT_NAMES = {name: name for name in record_schema.SPLITS} | dict(record_schema.SPLIT_ALIASES)


def _is_hidden(part_or_path: str) -> bool:
    return any(part.startswith(".") for part in part_or_path.split("/"))


def _skip_reason(path: str, skipped: collections.Counter) -> bool:
    """Count and report files that are never read: hidden and system files."""
    name = path.rsplit("/", 1)[-1]
    if name.lower() in SYSTEM_FILES:
        skipped["system-file"] += 1
        return True
    if _is_hidden(path):
        skipped["hidden"] += 1
        return True
    return False


def _carve_validation(
    members: dict[tuple[str, str], list[str]], fraction: float, seed: int
) -> dict[tuple[str, str], list[str]]:
    """Move ``round(n * fraction)`` images of each class to validation.

    Stratified per class and deterministic: within a class, the images with the
    smallest keyed hash go to validation. Every class with two or more images
    keeps at least one image in each split; a class with one image stays in
    train (validating on a class never trained on measures nothing).
    """
    carved: dict[tuple[str, str], list[str]] = {}
    for (_, name), paths in members.items():
        ordered = sorted(paths, key=lambda path: keyed_hash(seed, "validation-carve/" + path))
        # At least one image on each side; a class with a single image stays in train.
        count = min(max(round(len(ordered) * fraction), 1), len(ordered) - 1)
        if count:
            carved[("validation", name)] = ordered[:count]
        carved[("train", name)] = ordered[count:]
    return carved


def display_path(relpath: str) -> str:
    """``relpath`` as valid text: bytes of a name that is not UTF-8 become ``\\xNN`` escapes.

    On POSIX a file name is bytes; Python lists one that is not UTF-8 with
    surrogate escapes, which no text format (JSON, Beam's string coder, a
    record's UTF-8 ``image/filename``) can hold. Such a file is still read by
    its real name; reports and records name it like this (``caf\\xe9.jpg``).
    """
    try:
        relpath.encode("utf-8")
        return relpath
    except UnicodeEncodeError:
        return relpath.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def keyed_hash(seed: int, key: str) -> bytes:
    """128-bit keyed BLAKE2b of ``key`` salted with ``seed``: stable everywhere."""
    return hashlib.blake2b(
        key.encode("utf-8", "surrogatepass"), digest_size=16, key=seed.to_bytes(8, "little")
    ).digest()


def list_tree(src: str) -> Listing:
    """List every file and folder under ``src``, relative and ``/``-separated.

    Local folders are walked following symbolic links; a link back to a folder
    already walked (a loop, or a second route to the same folder) is skipped
    and counted, so a loop cannot hang the listing or duplicate images. Other
    file systems (``gs://``, ``s3://``...) are listed through Beam's
    ``FileSystems``.

    Raises:
      InputError: ``src`` does not exist or is not a folder.
    """
    if FileSystems.get_scheme(src) in (None, "file"):
        return _list_local(src)
    return _list_remote(src)


def _list_local(src: str) -> Listing:
    root = src[len("file://"):] if src.startswith("file://") else src
    if not os.path.isdir(root):
        raise InputError(f"--src {src!r} is not a folder" if os.path.exists(root) else f"--src {src!r} does not exist")
    files: list[str] = []
    dirs: list[str] = []
    skipped: collections.Counter[str] = collections.Counter()
    seen = {_identity(root)}
    stack = [("", root)]
    while stack:
        rel, path = stack.pop()
        try:
            entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        except OSError as err:
            raise InputError(f"folder {path!r} under --src could not be listed: {err}") from err
        for entry in entries:
            child = f"{rel}{entry.name}"
            try:
                is_dir = entry.is_dir()  # follows symbolic links
                is_file = not is_dir and entry.is_file()
            except OSError:
                skipped["unreadable-entry"] += 1
                continue
            if is_dir:
                identity = _identity(entry.path)
                if identity in seen:
                    skipped["repeated-folder-link"] += 1
                    continue
                seen.add(identity)
                dirs.append(child)
                stack.append((child + "/", entry.path))
            elif is_file:
                files.append(child)
            else:
                skipped["not-a-regular-file"] += 1  # dangling links, sockets, fifos
    return Listing(tuple(sorted(files)), tuple(sorted(dirs)), dict(skipped))


def _identity(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _list_remote(src: str) -> Listing:
    base = src.rstrip("/") + "/"
    matches = FileSystems.match([base + "**"])[0].metadata_list
    if not matches:
        raise InputError(f"--src {src!r} holds no files (or does not exist)")
    files = sorted(meta.path[len(base):] for meta in matches if not meta.path.endswith("/"))
    return Listing(tuple(files))


def iter_refs_jsonl(refs: Sequence[ImageRef], chunk: int) -> Iterable[str]:
    """Lines of the input list handed to the pipeline: one JSON array of up to ``chunk`` images per line.

    Chunks, not single images, are the pipeline's elements: Beam's per-element
    cost (tens of microseconds per step in Python) would otherwise rival the
    per-image work.
    """
    for start in range(0, len(refs), chunk):
        yield json.dumps([[r.split, r.relpath, r.label] for r in refs[start:start + chunk]]) + "\n"


def refs_from_jsonl(line: str) -> list[ImageRef]:
    """Inverse of one line of :func:`iter_refs_jsonl`."""
    return [ImageRef(split, relpath, label) for split, relpath, label in json.loads(line)]
