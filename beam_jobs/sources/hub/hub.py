"""Hugging Face datasets as they ship: Parquet files whose rows are images, read as a source of their own.

In:  the listing of SRC (its ``.parquet`` files: a Hub snapshot, the HF cache, a ``push_to_hub`` folder,
     or one file), and the options naming a config, the image column and the label column.
Out: the :class:`beam_jobs.planning.discover.InputPlan`: one ``ImageRef`` per row, labelled by the Hub's own
     ClassLabel ids, each row's bytes located by :func:`hub_cells.cell_locator` (file, row group, row, column);
     workers read them by :class:`hub_cells.CellReader`, a row group at a time.

The launcher opens each file once and reads its footer and its small columns
(the label, the image's ``path``, an object column's frame and id), never an
image; the values wait in a scratch file until the rows are listed. A row group
is read whole only by the worker validating it, which keeps the file open for
its chunk. The source in parts, each readable alone:

- :mod:`hub_files`: the files and their splits and configs, as the Hub names them;
- :mod:`hub_columns`: the image column and the label column (a ClassLabel: label ids
  are the ClassLabel's, never re-sorted, so label 3 means what it means to ``datasets``);
- :mod:`hub_annotations`: a column of objects or of several labels instead;
- :mod:`hub_tables`: Parquet and Arrow files read by row groups;
- :mod:`hub_cells`: a row's locator and the workers' reader of its image;
- this module: the launcher's plan (the rows, their labels, what a refused file loses).

A record's identity (its ``image/filename``, the key that orders it) is
``{split}/{path}`` when every row of the split has a distinct ``path``, else
``{split}/{row}``, the row's number in the split (files in name order): the
same data downloaded again, or cut into other files, gives the same bytes. The manifest's
``source_parquet.names`` says which, per split (:data:`PATH_NAMES` or :data:`ROW_NAMES`): an update refuses a
split named by row numbers where renumbered rows would be mistaken for changed ones (beam_jobs/update/checks.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import pickle
import posixpath
import tempfile
from array import array
from typing import BinaryIO, Callable, Iterator, Optional, Sequence

import record_schema
from beam_jobs import annotations
from beam_jobs.planning import discover
from beam_jobs.planning.discover import InputError, InputPlan, Listing
from beam_jobs.planning.listing import SkippedFiles
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.hub import hub_annotations, hub_cells, hub_columns, hub_files, hub_tables
from beam_jobs.sources.objects import annotated_plan
from beam_jobs.stage_records import ImageRef


# How a split's records are named (see the module): by the rows' image paths, or by the rows' numbers.
PATH_NAMES, ROW_NAMES = "paths", "rows"


def row_name(split: str, number: int) -> str:
    """The record name of row ``number`` of ``split`` (files in name order) when the split is named by rows."""
    return f"{split}/{number:09d}"


@dataclasses.dataclass(frozen=True)
class _Rows:
    """What the launcher read of one file, opening it once: its footer, then per row group its small columns
    (the image's path, the label, and an object column's frame and id), spilled to ``spill`` for the plan."""

    file: hub_files.ParquetFile
    columns: hub_columns.Columns
    largest_group: int  # rows of its largest row group (record batch)
    num_rows: int  # rows of the file, from its footer
    spill: BinaryIO  # (group, [values of each column of small_columns()]) pickled a group at a time

    def small_columns(self) -> list[str]:
        return [f"{self.columns.image}.path", self.columns.label, *self.columns.extra]

    def groups(self) -> Iterator[tuple[int, list[list]]]:
        """The spilled groups, in order (read once more from the scratch file, not from the dataset)."""
        self.spill.seek(0)
        while True:
            try:
                yield pickle.load(self.spill)
            except EOFError:
                return


def plan(src: str, listing: Listing, labels: Optional[Sequence[str]], val_fraction: float, seed: int,
         config: Optional[str], image_column: Optional[str], label_column: Optional[str],
         scratch: Optional[str] = None, bbox_format: Optional[str] = None) -> InputPlan:
    """The plan of a Parquet dataset: a ref per row, labelled by the Hub's ClassLabel ids (see the module)."""
    if hub_files.is_dataset_file(src):  # one file: its name says its split
        found = [dataclasses.replace(hub_files.describe(posixpath.basename(src.rstrip("/"))), path="")]
    else:
        found = [hub_files.describe(path) for path in hub_files.parquet_files(listing)]
    files = hub_files.choose_config(found, config, src)
    skipped = SkippedFiles(listing.skipped, scratch)
    dropped = [f for f in files if f.split.lower() not in hub_files.SPLITS]
    if dropped:  # splits the converter does not write (imdb's "unsupervised"...): their files are skipped, named
        files = [f for f in files if f.split.lower() in hub_files.SPLITS]
        if not files:
            raise InputError(f"{src} holds the splits {sorted({f.split for f in dropped})} only; the converter "
                             "writes train, validation and test")
    chosen = {f.path for f in files}
    hub_files.account(listing, chosen, {f.path for f in dropped}, {f.path for f in found} - chosen
                      - {f.path for f in dropped}, skipped)
    readme = hub_columns.readme_class_names(src)
    refused: list[ImageRef] = []
    with contextlib.ExitStack() as spills:
        opened, footers, unique = _read_small_columns(src, files, refused, spills, scratch,
                                                      lambda schema, path: hub_columns.find_columns(
                                                          schema, path, image_column, label_column, readme))
        return dataclasses.replace(_plan_rows(src, files, opened, footers, unique, refused, labels, val_fraction,
                                              seed, skipped, scratch, bbox_format), skipped_files=skipped)


def _plan_rows(src: str, files: Sequence[hub_files.ParquetFile], opened: list[_Rows], footers: dict[str, int],
               unique: dict[str, bool], refused: list[ImageRef], labels: Optional[Sequence[str]], val_fraction: float,
               seed: int, skipped: SkippedFiles, scratch: Optional[str], bbox_format: Optional[str]) -> InputPlan:
    """The plan of the rows read (see :func:`plan`); what the refused files lose is counted and named."""
    if not opened:
        raise InputError(f"{src} holds no readable Parquet file ({len(files)} found)")
    lost, warnings = lost_rows(src, files, opened, footers)
    warnings += hub_files.missing_from_sets(files, src)
    found_annotations = {r.columns.annotation for r in opened}
    if len(found_annotations) > 1:
        raise InputError(f"the Parquet files of {src} disagree on their annotation column: "
                         f"{sorted(str(a) for a in found_annotations)[:2]}")
    annotation = found_annotations.pop()
    if bbox_format is not None and (annotation is None or annotation.kind != hub_annotations.OBJECTS):
        raise InputError(f"--bbox-format reads a column of objects, but {src} has none")
    if annotation is not None:
        if labels is not None and tuple(labels) != annotation.names:
            raise InputError(f"--labels differs from the dataset's ClassLabel names {list(annotation.names)[:10]}: "
                             "the Hub's label ids are kept; drop --labels")
        task = record_schema.TASK_OBJECTS if annotation.kind == hub_annotations.OBJECTS else \
            record_schema.TASK_MULTILABEL
        images = _annotated(src, opened, unique, refused, hub_annotations.check_bbox_format(bbox_format))
        plan = annotated_plan.plan(src, images, annotation.names, val_fraction, seed, skipped, refused=refused,
                                   scratch=scratch, task=task)
        return _with_files(plan, src, opened, lost, warnings, unique)
    label_names = _label_names(opened, labels, src)
    members = discover.collect_members(_members(src, opened, label_names, unique, refused), scratch)
    if not members.counts:
        raise InputError(f"{src}: its Parquet files hold no rows with an image")
    plan = discover.plan_from_members(members, label_names, val_fraction, seed, src, skipped, what="labels",
                                      refused=refused)
    return _with_files(plan, src, opened, lost, warnings, unique)


def _with_files(plan: InputPlan, src: str, opened: Sequence["_Rows"], lost: int, warnings: Sequence[str],
                unique: dict[str, bool]) -> InputPlan:
    """``plan`` with its Parquet files' identities (a changed file is a changed input), what the manifest says of
    them (``source_parquet``: the files and the Hub revision they are, how each split's records are named), and
    the rows read at once."""
    files = hub_files.identities(src, [r.file.path for r in opened])
    names = {split: PATH_NAMES if every else ROW_NAMES for split, every in sorted(unique.items())}
    return dataclasses.replace(plan, archives=files,
                               provenance={"source_parquet": {"files": dict(files),
                                                              "revision": hub_files.revision(src) or None,
                                                              "names": names}},
                               read_unit=max(r.largest_group for r in opened), lost_inputs=lost,
                               warnings=tuple(warnings) + plan.warnings)


def _read_small_columns(src: str, files: Sequence[hub_files.ParquetFile], refused: list[ImageRef],
                        spills: contextlib.ExitStack, scratch: Optional[str],
                        find_columns: Callable[..., hub_columns.Columns]
                        ) -> tuple[list[_Rows], dict[str, int], dict[str, bool]]:
    """Open each file once and read its footer and small columns, before any row is listed.

    A file damaged before its footer, or past it, is refused whole (never listed in part); a usage error
    (an Arrow file in an object store, no image column) is raised, never taken for damage. Returns the
    readable files, the row counts of the files whose footer could be read (what a refused one held), and
    per split whether every row has a distinct path (the records' identity, see the module).
    """
    every_path: dict[str, bool] = {}
    digests: dict[str, array] = {}
    footers: dict[str, int] = {}
    readable = []
    for file in files:
        split = hub_files.SPLITS[file.split.lower()]
        with contextlib.ExitStack() as opening:
            try:
                table = opening.enter_context(hub_tables.open_table(src, file.path))
                groups = table.group_rows()
            except hub_tables.ArrowNotLocalError:
                raise
            except hub_tables.read_errors() as err:
                refused.append(_refused_file(src, file, err))
                continue
            footers[file.path] = sum(groups)
            columns = find_columns(table.schema, file.path)
            rows = _Rows(file, columns, max(groups, default=0), sum(groups),
                         spills.enter_context(tempfile.TemporaryFile(dir=scratch)))
            try:
                every = _spill_groups(table, rows, digests.setdefault(split, array("Q")))
            except hub_tables.read_errors() as err:
                refused.append(_refused_file(src, file, err))
                continue
        every_path[split] = every_path.get(split, True) and every
        readable.append(rows)
    return readable, footers, {split: every and _distinct(digests[split]) for split, every in every_path.items()}


def _label_names(opened: Sequence[_Rows], labels: Optional[Sequence[str]], src: str) -> Optional[list[str]]:
    """The names of the label ids: the ClassLabel's (the same in every file), ``--labels``, or None (sorted text)."""
    names = {r.columns.names for r in opened}
    if len(names) > 1:
        raise InputError(f"the Parquet files of {src} disagree on the label names: {sorted(map(str, names))[:2]}")
    found = names.pop()
    if found is not None:
        if labels is not None and list(labels) != list(found):
            raise InputError(f"--labels differs from the dataset's ClassLabel names {list(found)[:10]}: the Hub's "
                             "label ids are kept; drop --labels")
        return list(found)
    if any(r.columns.integer_labels for r in opened) and labels is None:
        raise InputError(f"the label column of {src} holds integers without names: give them with --labels FILE "
                         "(line i names label i)")
    return list(labels) if labels is not None else None


def _spill_groups(table, rows: _Rows, digests: array) -> bool:
    """Read the file's small columns a group at a time into ``rows.spill``, and append an 8-byte digest of each
    row's image path to ``digests``; False when a row has no path.

    Raises what pyarrow raises for a damaged file. Memory: a group's columns, and 8 bytes a row in the array (a
    million rows cost 8 MB); the values wait on the scratch disk until the plan lists the rows.
    """
    every = True
    columns = rows.small_columns()
    for group in range(table.num_groups):
        values = table.group(group, columns)
        pickle.dump((group, values), rows.spill, protocol=pickle.HIGHEST_PROTOCOL)
        for path in values[0]:
            if not path:
                every = False
                continue
            digest = hashlib.blake2b(path.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            digests.append(int.from_bytes(digest, "little"))
    return every


def _distinct(digests: array) -> bool:
    import numpy as np

    values = np.frombuffer(digests, dtype=np.uint64) if len(digests) else np.zeros(0, np.uint64)
    return len(np.unique(values)) == len(values)


def _members(src: str, opened: Sequence[_Rows], names: Optional[Sequence[str]], unique: dict[str, bool],
             refused: list[ImageRef]) -> Iterator[tuple[str, str, str, str]]:
    """``(split, class name, relpath, locator)`` of every row; rows whose label cannot be had are refused."""
    numbers: dict[str, int] = {}
    for rows in opened:
        split = hub_files.SPLITS[rows.file.split.lower()]
        image = rows.columns.image
        for group, (paths, values, *_) in rows.groups():
            for row, (path, value) in enumerate(zip(paths, values)):
                number = numbers.get(split, 0)
                numbers[split] = number + 1
                relpath = f"{split}/{path.lstrip('/')}" if unique[split] else row_name(split, number)
                locator = hub_cells.cell_locator(rows.file.path, group, row, image)
                name, problem = _class_name(value, names)
                if problem:
                    where = f"{rows.file.path or posixpath.basename(src)} row group {group} row {row}"
                    refused.append(ImageRef(split, relpath, 0, archive_members.refusal(problem[0], f"{where}: "
                                                                                       f"{problem[1]}")))
                    continue
                yield split, name, relpath, locator


def _annotated(src: str, opened: Sequence[_Rows], unique: dict[str, bool], refused: list[ImageRef],
               bbox_format: str) -> Iterator[annotated_plan.AnnotatedImage]:
    """Every row with its objects or labels (:mod:`beam_jobs.sources.hub.hub_annotations`), named as ``_members`` names
    them; a row whose labels cannot be had is refused."""
    numbers: dict[str, int] = {}
    for rows in opened:
        split = hub_files.SPLITS[rows.file.split.lower()]
        image, column = rows.columns.image, rows.columns.annotation
        for group, (paths, values, *extra) in rows.groups():
            extras = [dict(zip(rows.columns.extra, row)) for row in zip(*extra)] if extra else [{}] * len(paths)
            for row, (path, value, more) in enumerate(zip(paths, values, extras)):
                number = numbers.get(split, 0)
                numbers[split] = number + 1
                relpath = f"{split}/{path.lstrip('/')}" if unique[split] else row_name(split, number)
                locator = hub_cells.cell_locator(rows.file.path, group, row, image)
                where = f"{rows.file.path or posixpath.basename(src)} row group {group} row {row}"
                if column.kind == hub_annotations.LABELS:
                    try:
                        value = hub_annotations.labels_of(value, column)
                    except ValueError as err:
                        refused.append(ImageRef(split, relpath, 0, archive_members.refusal(
                            "label-out-of-range", f"{where}: {err}")))
                        continue
                else:
                    width, height, image_id = more.get("width"), more.get("height"), more.get("image_id")
                    frame = (width, height) if isinstance(width, int) and isinstance(height, int) and width > 0 \
                        and height > 0 else annotations.STORED
                    source_id = str(image_id) if isinstance(image_id, int) else \
                        annotated_plan.derived_source_id(relpath)
                    value = hub_annotations.objects_of(value, column, bbox_format, frame, source_id, where)
                yield annotated_plan.AnnotatedImage(split, relpath, value, locator)


def _class_name(value, names: Optional[Sequence[str]]) -> tuple[str, Optional[tuple[str, str]]]:
    """A row's class name, or the rejection (reason, detail) of a row without a usable label."""
    if value is None or (isinstance(value, int) and value == -1):  # datasets' "no label" (test splits)
        return "", ("missing-label", "the row has no label")
    if isinstance(value, int):
        if names is None or not 0 <= value < len(names):
            count = len(names) if names is not None else 0
            return "", ("label-out-of-range", f"label {value} is not one of the {count} ClassLabel names")
        return names[value], None
    return str(value), None


def lost_rows(src: str, files: Sequence[hub_files.ParquetFile], opened: Sequence[_Rows],
              footers: dict[str, int]) -> tuple[int, list[str]]:
    """The rows held by the files refused whole, beyond the one rejection each counts, and a warning naming each.

    A file whose footer was read held the rows it declares; one cut before its footer is counted by its
    share of its split's bytes (rows per byte of the split's readable files, or of all of them), so a
    lost half of a split fails the error budget instead of passing as one bad input.
    """
    readable = {rows.file.path for rows in opened}
    refused = [file for file in files if file.path not in readable]
    if not refused:
        return 0, []
    sizes = {file.path: hub_files.file_size(src, file.path) for file in files}
    rows_of = {rows.file.path: rows.num_rows for rows in opened}

    def rows_per_byte(split: Optional[str]) -> float:
        paths = [path for path in readable if split is None or hub_files.SPLITS[_split_of(files, path)] == split]
        total = sum(sizes[path] for path in paths)
        return sum(rows_of[path] for path in paths) / total if total else 0.0

    extra, warnings = 0, []
    for file in refused:
        split, name = hub_files.SPLITS[file.split.lower()], file.path or posixpath.basename(src.rstrip("/"))
        if file.path in footers:
            count, how = footers[file.path], "the rows its footer declares"
        else:
            rate = rows_per_byte(split) or rows_per_byte(None)
            count, how = max(1, round(sizes[file.path] * rate)), f"its {sizes[file.path]:,} bytes' share of the split"
        extra += count - 1
        warnings.append(f"{name} could not be read: the {split} split loses about {count} rows ({how}); each "
                        f"counts against --max-bad-fraction (see {record_schema.REJECTED_FILE})")
    return extra, warnings


def _split_of(files: Sequence[hub_files.ParquetFile], path: str) -> str:
    return next(file.split for file in files if file.path == path).lower()


def _refused_file(src: str, file: hub_files.ParquetFile, err: BaseException) -> ImageRef:
    name = file.path or posixpath.basename(src.rstrip("/"))
    return ImageRef(hub_files.SPLITS[file.split.lower()], name, 0, archive_members.refusal(
        "corrupt-parquet", f"{name}: not a readable Parquet file: {hub_tables.first_line(err)}"))


