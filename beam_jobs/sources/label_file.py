"""A label file as the input: ``--annotations FILE`` lists each image's path, label and optionally split.

Kaggle competitions, Open Images and the exports of labelling tools ship
images plus a table. Accepted forms, all with the columns ``path`` and
``label`` and optionally ``split`` (``train``, ``validation``/``val``,
``test``; empty means ``train``):

* CSV or TSV with a header row (the delimiter is the one the header uses);
* JSON Lines: one object per line, ``{"path": ..., "label": ..., "split": ...}``.

A file that names these columns otherwise (a Kaggle CSV's ``image,breed``) is
read with ``--annotation-columns image,breed[,SPLIT]``, and ids listed without their
extension (Kaggle's ``train/<id>.jpg``) find their file (:func:`resolve_ids`).

Paths are relative to ``--src`` (the images' root), ``/``-separated, and may
not leave it. The same guarantees as class folders: label ids index the
sorted class names (numerically when every label is an integer, so ``"10"``
follows ``"9"``), or ``--labels``; a listed file that does not exist is
rejected as ``missing-file`` and counted, not fatal. A path listed twice, an
unknown split or a malformed line is an input error naming the line. Every file
under SRC that the label file does not list is skipped and named (``unlisted.account``).
"""

from __future__ import annotations

import collections
import csv
import hashlib
import io
import itertools
import json
import os
import posixpath
from typing import Iterable, Iterator, Mapping, Optional, Sequence

from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs import annotations, formats
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ANNOTATION_COLUMNS
from beam_jobs.planning import discover
from beam_jobs.planning.discover import InputError, InputPlan, plan_from_members
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.objects import annotated_plan
from record_schema import SPLIT_NAMES

COLUMNS = ANNOTATION_COLUMNS  # path, label, split


def plan(src: str, path: str, labels: Optional[Sequence[str]], val_fraction: float, seed: int,
         columns: Sequence[str] = COLUMNS, scratch: Optional[str] = None,
         archive: Optional[Mapping[str, str]] = None, refused: Sequence = ()) -> InputPlan:
    """The plan of the images ``path`` lists under ``src``; ``columns``: its names for path, label and split.

    Rows stream from the file; with a local ``scratch`` folder the images go
    there as they are read, and the launcher holds the classes, the folders of
    ids being resolved, and one hash range of paths at a time (checking that
    no path is listed twice).

    ``archive``: when SRC is an archive, its members (``{path: locator}``, as
    its extraction would place them): paths resolve among them, and a path
    that is not one is rejected as ``missing-file`` naming what the archive's
    root holds (held in memory: the member table, about 150 bytes a member).
    ``refused``: the archive's entries listed only to be rejected (``ImageRef``s).
    """
    found = _members(src, path, columns, scratch, archive)
    return plan_from_members(found, labels, val_fraction, seed, src, {}, what="labels", refused=refused)


def _members(src: str, path: str, columns: Sequence[str], scratch: Optional[str],
             archive: Optional[Mapping[str, str]], empty_label: bool = False) -> discover.Members:
    """Every row as ``(split, label cell, relpath, locator)``: ids resolved, each path listed once."""
    members = _ArchiveMembers(src, archive) if archive is not None else None
    resolver = _IdResolver(src, path, members)
    checker = _ListedOnce(path, scratch)

    def triples() -> Iterator[tuple[str, str, str, str]]:
        for line, relpath, label, split in read_rows(path, columns, empty_label=empty_label):
            relpath = resolver.resolve(line, relpath)
            checker.add(line, relpath)
            yield split, label, relpath, members.source(relpath) if members is not None else ""

    found = discover.collect_members(triples(), scratch)
    checker.check()
    if not found.counts:
        raise InputError(f"--annotations {path} lists no images")
    return found


def plan_multilabel(src: str, path: str, separator: str, labels: Optional[Sequence[str]], val_fraction: float,
                    seed: int, columns: Sequence[str] = COLUMNS, scratch: Optional[str] = None,
                    archive: Optional[Mapping[str, str]] = None, refused: Sequence = ()) -> InputPlan:
    """The plan of a multi-label file: each label cell holds class names separated by ``separator``.

    Planet's ``train_v2.csv`` (``image_name,tags``, tags space-separated) reads with
    ``--annotation-columns image_name,tags --label-separator ' '``. Class ids index the sorted names of
    every cell (or ``--labels``); a name listed twice in a cell counts once; an empty cell is an image of
    no class. Rows stream into ``scratch`` with their cell, then each image gets its ids
    (:class:`beam_jobs.annotations.Labels`).
    """
    found = _members(src, path, columns, scratch, archive, empty_label=True)

    def names_of(cell: str) -> list[str]:
        return sorted({name.strip() for name in cell.split(separator) if name.strip()})

    found_names = discover.class_order({name for _, cell in found.counts for name in names_of(cell)})
    if labels is not None:
        unknown = [name for name in found_names if name not in labels]
        if unknown:
            raise InputError(f"labels {unknown[:10]} are not in --labels; add them to the file or remove them")
    classes = tuple(labels) if labels is not None else tuple(found_names)
    if not classes:
        raise InputError(f"--annotations {path}: no label cell names a class (--label-separator {separator!r})")
    index = {name: i for i, name in enumerate(classes)}
    images = (annotated_plan.AnnotatedImage(split, relpath, annotations.Labels(tuple(sorted(index[n] for n in
                                                                                            names_of(cell)))), source)
              for split, cell, relpath, source in found.items)
    return annotated_plan.plan(src, images, classes, val_fraction, seed, {}, labels=None, refused=refused,
                               scratch=scratch, task=record_schema.TASK_MULTILABEL)


class _ListedOnce:
    """Finds a path listed twice, naming both lines, in memory bounded by one hash range of paths.

    Without scratch, a dict. With it, ``(path, line)`` go to one of
    ``RANGES`` files by a hash of the path, and each file is checked alone
    (datatrove's exact dedup, in miniature): a duplicate always lands in one file.
    """

    RANGES = 64

    def __init__(self, label_file: str, scratch: Optional[str]) -> None:
        self._file, self._scratch = label_file, scratch
        self._seen: dict[str, int] = {}
        self._handles: list = []
        self._paths: list[str] = []
        if scratch is not None:
            self._paths = [discover.scratch_file(scratch, f"listed-once-{r:02d}") for r in range(self.RANGES)]
            self._handles = [open(p, "w", encoding="utf-8", errors="surrogatepass") for p in self._paths]

    def add(self, line: int, relpath: str) -> None:
        if not self._handles:
            self._record(self._seen, line, relpath)
            return
        digest = hashlib.blake2b(relpath.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        self._handles[digest[0] % self.RANGES].write(f"{line}\t{relpath}\n")

    def _record(self, seen: dict[str, int], line: int, relpath: str) -> None:
        if relpath in seen:
            first, second = sorted((seen[relpath], line))
            raise InputError(f"--annotations {self._file} lists {relpath!r} twice: lines {first} and {second}")
        seen[relpath] = line

    def check(self) -> None:
        for handle in self._handles:
            handle.close()
        for path in self._paths:
            seen: dict[str, int] = {}
            with open(path, encoding="utf-8", errors="surrogatepass") as handle:
                for row in handle:
                    line, _, relpath = row.rstrip("\n").partition("\t")
                    self._record(seen, int(line), relpath)
            os.remove(path)


class _IdResolver:
    """Paths listed without their extension (a Kaggle ``id``) -> the one image file each names.

    Kaggle's dog-breed release lists ``id`` for ``train/<id>.jpg``. A listed
    path whose name has no image extension and that names no file resolves to
    the single file in its folder named that path plus an image extension.
    Each such folder is listed once (the last few are kept), so memory follows
    the largest folder, not the file. Paths with an extension are taken as written.

    Raises:
      InputError: two files could be meant (``x.jpg`` and ``x.png``), naming both.
    """

    KEEP = 4  # folders whose listing is kept

    def __init__(self, src: str, label_file: str, archive: Optional["_ArchiveMembers"] = None) -> None:
        self._src, self._file, self._archive = src, label_file, archive
        self._extensions = formats.image_extensions()
        self._folders: "collections.OrderedDict[str, tuple[set[str], dict[str, list[str]]]]" = \
            collections.OrderedDict()

    def resolve(self, line: int, relpath: str) -> str:
        folder, _, name = relpath.rpartition("/")
        if formats.has_image_extension(name):
            return relpath
        present, by_stem = self._folder(folder)
        found = by_stem.get(name, [])
        if name in present or not found:
            return relpath
        prefix = folder + "/" if folder else ""
        if len(found) > 1:
            both = " and ".join(sorted(prefix + entry for entry in found)[:2])
            raise InputError(f"--annotations {self._file} line {line} lists {prefix + name!r}, which could be "
                             f"{both}; list the file with its extension")
        return prefix + found[0]

    def _folder(self, folder: str) -> tuple[set[str], dict[str, list[str]]]:
        if folder in self._folders:
            self._folders.move_to_end(folder)
            return self._folders[folder]
        present = self._archive.names_in(folder) if self._archive is not None else _names_in(self._src, folder)
        by_stem: dict[str, list[str]] = collections.defaultdict(list)
        for entry in present:
            stem, dot, extension = entry.rpartition(".")
            if dot and extension.lower() in self._extensions:
                by_stem[stem].append(entry)
        self._folders[folder] = (present, dict(by_stem))
        if len(self._folders) > self.KEEP:
            self._folders.popitem(last=False)
        return self._folders[folder]


class _ArchiveMembers:
    """An archive's members as the label file sees them: sources by path, names by folder, and the miss message."""

    def __init__(self, src: str, members: Mapping[str, str]) -> None:
        self._src, self._members = src, members
        self._folders: dict[str, set[str]] = collections.defaultdict(set)
        for member in members:
            folder, _, name = member.rpartition("/")
            self._folders[folder].add(name)

    def names_in(self, folder: str) -> set[str]:
        return self._folders.get(folder, set())

    def source(self, relpath: str) -> str:
        """The member's locator, or a ``missing-file`` refusal saying what was looked for and what the root holds."""
        if relpath in self._members:
            return self._members[relpath]
        top = sorted(self._folders.get("", set()) | {f.split("/")[0] + "/" for f in self._folders if f})
        root = ", ".join(top[:5]) + (f" and {len(top) - 5} more" if len(top) > 5 else "")
        hint = ""
        if len(top) == 1 and top[0].endswith("/") and not relpath.startswith(top[0]):
            hint = f"; every member sits under {top[0]}: list paths as {top[0]}{relpath}"
        archive = posixpath.basename(self._src.rstrip("/"))
        return archive_members.refusal("missing-file", f"listed, but {archive} has no member {relpath} "
                                       f"(its root holds {root or 'nothing'}){hint}")


def resolve_ids(src: str, path: str, listed: Sequence[tuple[int, str]]) -> dict[str, str]:
    """``{listed path: file}`` for the listed paths that name a file only without its extension."""
    resolver = _IdResolver(src, path)
    resolved = {relpath: resolver.resolve(line, relpath) for line, relpath in listed}
    return {relpath: target for relpath, target in resolved.items() if target != relpath}


def _names_in(src: str, folder: str) -> set[str]:
    """Names of the files in ``src/folder`` (empty when it does not exist: those images are missing-file)."""
    base = FileSystems.join(src, *folder.split("/")) if folder else src
    if FileSystems.get_scheme(base) in (None, "file"):
        local = base[len("file://"):] if base.startswith("file://") else base
        try:
            return set(os.listdir(local))
        except OSError:
            return set()
    prefix = base.rstrip("/") + "/"
    try:
        matches = FileSystems.match([prefix + "*"])[0].metadata_list
    except OSError:
        return set()
    return {meta.path[len(prefix):] for meta in matches if "/" not in meta.path[len(prefix):]}


def read_rows(path: str, columns: Sequence[str] = COLUMNS,
              empty_label: bool = False) -> Iterator[tuple[int, str, str, str]]:
    """``(line number, relative path, label, split)`` of every row, checked; streamed from the file.

    ``empty_label``: a row without a label is one of no class ("" is its label), not an error."""
    path_key, label_key, split_key = columns
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
            first = next((line for line in text if line.strip()), "")  # JSON Lines or a header?
    except (OSError, ValueError) as err:  # Beam raises BeamIOError (an IOError) or decode errors
        raise InputError(f"--annotations {path!r} could not be read: {err}") from err
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
            rows = _json_lines(path, text) if first.lstrip().startswith("{") else _delimited(path, text, columns)
            for line, row in rows:
                label = row.get(label_key)
                label = "" if empty_label and label in (None, "") else _label(path, line, label)
                yield line, _relpath(path, line, row.get(path_key)), label, _split(path, line, row.get(split_key))
    except UnicodeDecodeError as err:
        raise InputError(f"--annotations {path!r} could not be read: {err}") from err


def _json_lines(path: str, text: Iterable[str]) -> Iterator[tuple[int, dict]]:
    for number, raw in enumerate(text, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as err:
            raise InputError(f"--annotations {path} line {number} is not valid JSON: {err}") from err
        if not isinstance(row, dict):
            raise InputError(f"--annotations {path} line {number} is not a JSON object")
        yield number, row


def _delimited(path: str, text: Iterable[str], columns: Sequence[str]) -> Iterator[tuple[int, dict]]:
    lines = iter(text)
    header_line = next(lines, "")
    delimiter = "\t" if "\t" in header_line else ","
    reader = csv.reader(itertools.chain([header_line], lines), delimiter=delimiter)
    header = next(reader, None)
    if header is None or not set(columns[:2]) <= {name.strip() for name in header}:
        other = "" if tuple(columns) == COLUMNS else " (as --annotation-columns names them)"
        raise InputError(f"--annotations {path}: the first line must be a header naming the columns "
                         f"{columns[0]!r} and {columns[1]!r} (and optionally {columns[2]!r}){other}; found {header}")
    names = [name.strip() for name in header]
    for row in reader:
        number = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise InputError(f"--annotations {path} line {number} has {len(row)} fields; the header has {len(names)}")
        yield number, dict(zip(names, row))


def _relpath(path: str, line: int, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"--annotations {path} line {line} has no path")
    relpath = value.strip().replace("\\", "/")
    normal = posixpath.normpath(relpath)
    if relpath.startswith("/") or "://" in relpath or normal == ".." or normal.startswith("../"):
        raise InputError(f"--annotations {path} line {line}: path {value!r} must be relative to --src and stay "
                         "inside it")
    return normal


def _label(path: str, line: int, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise InputError(f"--annotations {path} line {line} has no label")
    return str(value).strip()


def _split(path: str, line: int, value: object) -> str:
    name = str(value).strip().lower() if value not in (None, "") else "train"
    split = SPLIT_NAMES.get(name)
    if split is None:
        raise InputError(f"--annotations {path} line {line}: split {value!r} is not one of train, validation "
                         "(or val, valid), test")
    return split
