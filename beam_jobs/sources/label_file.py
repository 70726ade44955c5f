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
unknown split or a malformed line is an input error naming the line.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import os
import posixpath
from typing import Iterator, Optional, Sequence

from apache_beam.io.filesystems import FileSystems

from beam_jobs import discover, formats
from beam_jobs.discover import InputError, InputPlan, plan_from_members
from beam_jobs.options import ANNOTATION_COLUMNS
from record_schema import SPLIT_ALIASES, SPLITS

COLUMNS = ANNOTATION_COLUMNS  # path, label, split


def plan(src: str, path: str, labels: Optional[Sequence[str]], val_fraction: float, seed: int,
         columns: Sequence[str] = COLUMNS) -> InputPlan:
    """The plan of the images ``path`` lists under ``src``; ``columns``: its names for path, label and split."""
    rows = list(read_rows(path, columns))
    resolved = resolve_ids(src, path, [(line, relpath) for line, relpath, _, _ in rows])
    members: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    first_line: dict[str, int] = {}
    for line, relpath, label, split in rows:
        relpath = resolved.get(relpath, relpath)
        if relpath in first_line:
            raise InputError(f"--annotations {path} lists {relpath!r} twice: lines {first_line[relpath]} and {line}")
        first_line[relpath] = line
        members[(split, label)].append(relpath)
    if not members:
        raise InputError(f"--annotations {path} lists no images")
    names = {name for _, name in members}
    if labels is None and all(name.lstrip("-").isdigit() for name in names):
        labels = sorted(names, key=int)  # numeric labels keep their order: "10" after "9"
    return plan_from_members(members, labels, val_fraction, seed, src, {}, what="labels")


def resolve_ids(src: str, path: str, listed: Sequence[tuple[int, str]]) -> dict[str, str]:
    """Paths listed without their extension (a Kaggle ``id``) -> the one image file each names.

    Kaggle's dog-breed release lists ``id`` for ``train/<id>.jpg``. A listed
    path whose name has no image extension and that names no file resolves to
    the single file in its folder named that path plus an image extension; each
    such folder is listed once. Paths with an extension are taken as written.

    Raises:
      InputError: two files could be meant (``x.jpg`` and ``x.png``), naming both.
    """
    extensions = formats.image_extensions()
    wanted: dict[str, dict[str, int]] = collections.defaultdict(dict)  # folder -> name -> line
    for line, relpath in listed:
        folder, _, name = relpath.rpartition("/")
        if not formats.has_image_extension(name):
            wanted[folder][name] = line
    resolved = {}
    for folder, names in wanted.items():
        present = _names_in(src, folder)
        candidates: dict[str, list[str]] = collections.defaultdict(list)
        for entry in present:
            stem, dot, extension = entry.rpartition(".")
            if dot and stem in names and extension.lower() in extensions:
                candidates[stem].append(entry)
        prefix = folder + "/" if folder else ""
        for name, found in candidates.items():
            if name in present:
                continue
            if len(found) > 1:
                both = " and ".join(sorted(prefix + entry for entry in found)[:2])
                raise InputError(f"--annotations {path} line {names[name]} lists {prefix + name!r}, which could be "
                                 f"{both}; list the file with its extension")
            resolved[prefix + name] = prefix + found[0]
    return resolved


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


def read_rows(path: str, columns: Sequence[str] = COLUMNS) -> Iterator[tuple[int, str, str, str]]:
    """``(line number, relative path, label, split)`` of every row, checked."""
    text = discover.read_flag_file("--annotations", path)
    stripped = text.lstrip()
    path_key, label_key, split_key = columns
    rows = _json_lines(path, text) if stripped.startswith("{") else _delimited(path, text, columns)
    for line, row in rows:
        yield line, _relpath(path, line, row.get(path_key)), _label(path, line, row.get(label_key)), \
            _split(path, line, row.get(split_key))


def _json_lines(path: str, text: str) -> Iterator[tuple[int, dict]]:
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as err:
            raise InputError(f"--annotations {path} line {number} is not valid JSON: {err}") from err
        if not isinstance(row, dict):
            raise InputError(f"--annotations {path} line {number} is not a JSON object")
        yield number, row


def _delimited(path: str, text: str, columns: Sequence[str]) -> Iterator[tuple[int, dict]]:
    header_line = text.splitlines()[0] if text.strip() else ""
    delimiter = "\t" if "\t" in header_line else ","
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
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
    name = SPLIT_ALIASES.get(name, name)
    if name not in SPLITS:
        raise InputError(f"--annotations {path} line {line}: split {value!r} is not one of train, validation "
                         "(or val), test")
    return name
