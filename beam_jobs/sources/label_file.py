"""A label file as the input: ``--annotations FILE`` lists each image's path, label and optionally split.

Kaggle competitions, Open Images and the exports of labelling tools ship
images plus a table. Accepted forms, all with the columns ``path`` and
``label`` and optionally ``split`` (``train``, ``validation``/``val``,
``test``; empty means ``train``):

* CSV or TSV with a header row (the delimiter is the one the header uses);
* JSON Lines: one object per line, ``{"path": ..., "label": ..., "split": ...}``.

A file that names these columns otherwise (a Kaggle CSV's ``image,breed``) is
read with ``--annotation-columns image,breed[,SPLIT]``.

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
import posixpath
from typing import Iterator, Optional, Sequence

from beam_jobs import discover
from beam_jobs.discover import InputError, InputPlan, plan_from_members
from beam_jobs.options import ANNOTATION_COLUMNS
from record_schema import SPLIT_ALIASES, SPLITS

COLUMNS = ANNOTATION_COLUMNS  # path, label, split


def plan(src: str, path: str, labels: Optional[Sequence[str]], val_fraction: float, seed: int,
         columns: Sequence[str] = COLUMNS) -> InputPlan:
    """The plan of the images ``path`` lists under ``src``; ``columns``: its names for path, label and split."""
    members: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    first_line: dict[str, int] = {}
    for line, relpath, label, split in read_rows(path, columns):
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
