"""Hugging Face datasets as they ship: Parquet files whose rows are images, read as a source of their own.

In:  the listing of SRC (its ``.parquet`` files: a Hub snapshot, the HF cache, a ``push_to_hub`` folder,
     or one file), and the options naming a config, the image column and the label column.
Out: the :class:`beam_jobs.planning.discover.InputPlan`: one ``ImageRef`` per row, labelled by the Hub's own
     ClassLabel ids, each row's bytes located by :func:`cell_locator` (file, row group, row, column);
     workers read them by :class:`CellReader`, a row group at a time.

The launcher reads each file's footer and two small columns (the label and
the image's ``path``), never an image: a row group is read whole only by the
worker validating it. What the Hub's names say is what we read:

- splits from file names: ``{split}-00000-of-00004.parquet`` (``push_to_hub``,
  under ``data/`` or a config folder) and ``{config}/{split}/0000.parquet``
  (the Hub's ``refs/convert/parquet`` branch, whose ``partial-{split}``
  folders hold a split cut at 5 GB and are refused);
- the image column: the one typed as the Hub's Image feature,
  ``struct<bytes: binary, path: string>`` (``--image-column`` when several);
- labels: a ClassLabel column, its names from the schema's ``huggingface``
  metadata or the snapshot's ``README.md``; label ids are the ClassLabel's,
  never re-sorted, so label 3 means what it means to ``datasets``.

A record's identity (its ``image/filename``, the key that orders it) is
``{split}/{path}`` when every row of the split has a distinct ``path``, else
``{split}/{row}``, the row's number in the split (files in name order): the
same data downloaded again, or cut into other files, gives the same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import posixpath
import re
from array import array
from typing import Iterator, Optional, Sequence

import record_schema
from beam_jobs import annotations
from beam_jobs.files.filesystems import FileSystems, open_for_ranges
from beam_jobs.planning import discover
from beam_jobs.planning.discover import InputError, InputPlan, Listing
from beam_jobs.sources import annotated_plan, archive_members, hub_annotations
from beam_jobs.stage_records import ImageRef

EXTENSIONS = (".parquet", ".arrow")  # Parquet (the Hub's files), Arrow (save_to_disk and the HF datasets cache)
SPLITS = {"train": "train", "validation": "validation", "valid": "validation", "val": "validation",
          "test": "test"}
_SHARDED = re.compile(r"^(?P<split>[^/]+?)-\d{5}-of-\d{5}\.parquet$")  # push_to_hub
_NUMBERED = re.compile(r"^\d+\.parquet$")  # refs/convert/parquet: {config}/{split}/0000.parquet
_LOCATOR = "q"  # a cell's locator kind, beside archive_members' "a", "w" and "!"


class CellError(archive_members.ArchiveError):
    """A row whose image cannot be had: ``reason`` is the rejection's (``missing-image``...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class ParquetFile:
    """One Parquet file of the dataset: where it is (relative to SRC), its split and config."""

    path: str
    split: str
    config: str


def is_parquet_file(src: str) -> bool:
    """SRC is one dataset file (``--src train-00000-of-00001.parquet``, ``data-00000-of-00001.arrow``)."""
    return src.lower().endswith(EXTENSIONS)


def parquet_files(listing: Listing) -> list[str]:
    """The Parquet and Arrow files of a listing, in name order (empty: SRC is no Hugging Face dataset).

    ``cache-*.arrow`` files (what ``Dataset.map`` leaves beside a saved dataset) are not the dataset.
    """
    return sorted(path for path, source in listing.entries() if not source and path.lower().endswith(EXTENSIONS)
                  and not posixpath.basename(path).startswith("cache-"))


def describe(path: str) -> ParquetFile:
    """Split and config of the file at ``path`` (relative to SRC), as the Hub names them.

    Raises:
      InputError: a ``partial-`` split (the Hub's conversion stopped at 5 GB).
    """
    parts = path.split("/")
    name = parts[-1]
    if name.lower().endswith(".arrow"):
        return _describe_arrow(path, parts)
    sharded = _SHARDED.match(name)
    if sharded:
        folder = parts[-2] if len(parts) >= 2 else ""
        return ParquetFile(path, sharded["split"], "" if folder in ("", "data") else folder)
    if _NUMBERED.match(name) and len(parts) >= 2:
        split = parts[-2]
        if split.startswith("partial-"):
            raise InputError(f"{path}: the split {split[len('partial-'):]!r} is truncated (the Hub converts a "
                             f"dataset to Parquet only up to 5 GB, into {split}/); download the dataset's own "
                             "files (its main branch) to convert all of it")
        return ParquetFile(path, split, parts[-3] if len(parts) >= 3 else "")
    stem = posixpath.splitext(name)[0]
    return ParquetFile(path, stem if stem.lower() in SPLITS else "train", "")


_ARROW_SAVED = re.compile(r"^data-\d{5}-of-\d{5}\.arrow$")  # save_to_disk: {split}/data-00000-of-00001.arrow
_ARROW_CACHED = re.compile(r"^.+?-(?P<split>[^-/]+?)(?:-\d{5}-of-\d{5})?\.arrow$")  # cache: NAME-{split}[-k-of-n].arrow


def _describe_arrow(path: str, parts: list[str]) -> ParquetFile:
    name = parts[-1]
    if _ARROW_SAVED.match(name):
        folder = parts[-2] if len(parts) >= 2 else ""
        return ParquetFile(path, folder if folder.lower() in SPLITS else "train", "")
    cached = _ARROW_CACHED.match(name)
    if cached and cached["split"].lower() in SPLITS:
        return ParquetFile(path, cached["split"], "")
    stem = posixpath.splitext(name)[0]
    return ParquetFile(path, stem if stem.lower() in SPLITS else "train", "")


def choose_config(files: Sequence[ParquetFile], config: Optional[str], src: str) -> list[ParquetFile]:
    """The files of one config: the one there is, or ``--config``'s."""
    configs = sorted({f.config for f in files})
    if config is not None:
        chosen = [f for f in files if f.config == config]
        if not chosen:
            raise InputError(f"--config {config!r}: {src} has no such config; its configs are {configs}")
        return chosen
    if len(configs) > 1:
        raise InputError(f"{src} holds several configs {configs}: pick one with --config NAME")
    return list(files)


@dataclasses.dataclass(frozen=True)
class Columns:
    """Which columns hold the image and the label, and the label's names (ClassLabel order)."""

    image: str
    label: str
    names: Optional[tuple[str, ...]]  # None: a plain column (strings, or integers named by --labels)
    integer_labels: bool
    annotation: Optional[hub_annotations.AnnotationColumn] = None  # objects or several labels, not one label
    extra: tuple[str, ...] = ()  # width, height and image_id, where the file has them (an object's frame and id)


def _features(schema) -> dict:
    """The Hub's features of a Parquet schema (its ``huggingface`` metadata), or {}."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        return json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}


def _is_image_type(field) -> bool:
    import pyarrow as pa

    kind = field.type
    if not pa.types.is_struct(kind):
        return False
    names = {kind.field(i).name: kind.field(i).type for i in range(kind.num_fields)}
    return set(names) == {"bytes", "path"} and pa.types.is_binary(names["bytes"]) or \
        set(names) == {"bytes", "path"} and pa.types.is_large_binary(names["bytes"])


def find_columns(schema, path: str, image_column: Optional[str], label_column: Optional[str],
                 readme_names: dict[str, tuple[str, ...]]) -> Columns:
    """The image and label columns of a file, as the flags or the Hub's features name them.

    Raises:
      InputError: naming the file, its columns and the flag to use.
    """
    features = _features(schema)
    fields = {field.name: field for field in schema}
    listed = ", ".join(f"{f.name} ({f.type})" for f in schema)
    images = [name for name, field in fields.items()
              if _is_image_type(field) or (features.get(name) or {}).get("_type") == "Image"]
    image = _pick("--image-column", image_column, images, fields, path, listed,
                  "image column (the Hub's Image feature, struct<bytes: binary, path: string>)")
    if image_column is not None and not _is_image_type(fields[image]):
        raise InputError(f"--image-column {image!r}: in {path} it is {fields[image].type}, not the Hub's Image "
                         "feature (struct<bytes: binary, path: string>)")
    class_labels = [name for name, spec in features.items() if (spec or {}).get("_type") == "ClassLabel"]
    class_labels += [name for name in readme_names if name in fields and name not in class_labels]
    annotated = {found.column: found for found in hub_annotations.find(features)}
    if label_column in annotated or (label_column is None and not class_labels and annotated):
        column = annotated[_pick("--label-column", label_column, list(annotated), fields, path, listed,
                                 "column of objects or of several labels")]
        extra = tuple(name for name in ("width", "height", "image_id") if name in fields)
        return Columns(image, column.column, column.names, True, column, extra)
    label = _pick("--label-column", label_column, class_labels, fields, path, listed,
                  "ClassLabel column (none in its huggingface metadata or the dataset's README.md)")
    spec = features.get(label) or {}
    names = tuple(spec["names"]) if spec.get("_type") == "ClassLabel" and spec.get("names") else \
        readme_names.get(label)
    import pyarrow as pa

    kind = fields[label].type
    if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"--label-column {label!r}: in {path} it is {kind}; a label column holds integers or text")
    return Columns(image, label, names, pa.types.is_integer(kind))


def _pick(flag: str, given: Optional[str], found: Sequence[str], fields: dict, path: str, listed: str,
          what: str) -> str:
    """The column ``flag`` names, or the one column found; an InputError naming the file and the flag otherwise."""
    if given is not None:
        if given not in fields:
            raise InputError(f"{flag} {given!r}: {path} has no such column; its columns are {listed}")
        return given
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError(f"{path} has no {what}; its columns are {listed}. Name one with {flag} NAME")
    raise InputError(f"{path} has several {what.split(' (')[0]}s {list(found)}: pick one with {flag} NAME")


def readme_class_names(src: str) -> dict[str, tuple[str, ...]]:
    """Column -> ClassLabel names from a Hub snapshot's ``README.md`` (its YAML's ``dataset_info``), or {}."""
    path = FileSystems.join(src, "README.md")
    try:
        with FileSystems.open(path) as handle:
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return {}
    if not text.startswith("---"):
        return {}
    import yaml

    try:
        card = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return {}
    infos = card.get("dataset_info") if isinstance(card, dict) else None
    found: dict[str, tuple[str, ...]] = {}
    for info in infos if isinstance(infos, list) else [infos] if isinstance(infos, dict) else []:
        for feature in info.get("features") or []:
            names = ((feature.get("dtype") or {}) if isinstance(feature.get("dtype"), dict) else {}) \
                .get("class_label", {}).get("names")
            if isinstance(names, dict):
                found.setdefault(feature.get("name"), tuple(str(names[k]) for k in sorted(names, key=int)))
    return found


def cell_locator(file: str, row_group: int, row: int, column: str) -> str:
    """The text that locates one row's image in ``file`` (relative to SRC)."""
    return f"{_LOCATOR}:{row_group}:{row}:{column}:{file}"


def is_cell(source: str) -> bool:
    return source.startswith(_LOCATOR + ":")


def parse_cell(source: str) -> tuple[str, int, int, str]:
    """``(file, row group, row, column)`` of a :func:`cell_locator`."""
    _, group, row, column, file = source.split(":", 4)
    return file, int(group), int(row), column


@dataclasses.dataclass(frozen=True)
class _Rows:
    """What the launcher reads of one file: its footer, then per row group the label and path columns."""

    file: ParquetFile
    columns: Columns
    largest_group: int = 0  # rows of its largest row group (record batch)
    num_rows: int = 0  # rows of the file, from its footer


def plan(src: str, listing: Listing, labels: Optional[Sequence[str]], val_fraction: float, seed: int,
         config: Optional[str], image_column: Optional[str], label_column: Optional[str],
         scratch: Optional[str] = None, bbox_format: Optional[str] = None) -> InputPlan:
    """The plan of a Parquet dataset: a ref per row, labelled by the Hub's ClassLabel ids (see the module)."""
    if is_parquet_file(src):  # one file: its name says its split
        found = [dataclasses.replace(describe(posixpath.basename(src.rstrip("/"))), path="")]
    else:
        found = [describe(path) for path in parquet_files(listing)]
    files = choose_config(found, config, src)
    skipped = dict(listing.skipped)
    dropped = [f for f in files if f.split.lower() not in SPLITS]
    if dropped:  # splits the converter does not write (imdb's "unsupervised"...): their files are counted
        files = [f for f in files if f.split.lower() in SPLITS]
        skipped["other-split"] = skipped.get("other-split", 0) + len(dropped)
        if not files:
            raise InputError(f"{src} holds the splits {sorted({f.split for f in dropped})} only; the converter "
                             "writes train, validation and test")
    readme = readme_class_names(src)
    refused: list[ImageRef] = []
    opened: list[_Rows] = []
    for file in files:
        try:
            with _open_table(src, file.path) as table:
                schema, groups = table.schema, table.group_rows()
        except _read_errors() as err:
            refused.append(_refused_file(src, file, err))
            continue
        opened.append(_Rows(file, find_columns(schema, file.path, image_column, label_column, readme),
                            max(groups, default=0), sum(groups)))
    footers = {rows.file.path: rows.num_rows for rows in opened}  # files whose footer could be read
    opened, unique = _read_small_columns(src, opened, refused)
    if not opened:
        raise InputError(f"{src} holds no readable Parquet file ({len(files)} found)")
    lost, warnings = lost_rows(src, files, opened, footers)
    warnings += missing_from_sets(files, src)
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
        return dataclasses.replace(plan, archives=_identities(src, [r.file.path for r in opened]),
                                   hub_revision=revision(src), read_unit=max(r.largest_group for r in opened),
                                   lost_inputs=lost, warnings=tuple(warnings) + plan.warnings)
    label_names = _label_names(opened, labels, src)
    members = discover.collect_members(_members(src, opened, label_names, unique, refused), scratch)
    if not members.counts:
        raise InputError(f"{src}: its Parquet files hold no rows with an image")
    plan = discover.plan_from_members(members, label_names, val_fraction, seed, src, skipped, what="labels",
                                      refused=refused)
    return dataclasses.replace(plan, archives=_identities(src, [r.file.path for r in opened]),
                               hub_revision=revision(src), read_unit=max(r.largest_group for r in opened),
                               lost_inputs=lost, warnings=tuple(warnings) + plan.warnings)


def _read_small_columns(src: str, opened: list[_Rows], refused: list[ImageRef]) -> tuple[list[_Rows], dict[str, bool]]:
    """Read every file's label and path columns once, before any row is listed.

    A file damaged past its footer is refused whole (never listed in part).
    Returns the readable files and, per split, whether every row has a
    distinct path (the records' identity, see the module).
    """
    every_path: dict[str, bool] = {}
    digests: dict[str, array] = {}
    readable = []
    for rows in opened:
        split = SPLITS[rows.file.split.lower()]
        try:
            every = _path_digests(src, rows, digests.setdefault(split, array("Q")))
        except _read_errors() as err:
            refused.append(_refused_file(src, rows.file, err))
            continue
        every_path[split] = every_path.get(split, True) and every
        readable.append(rows)
    return readable, {split: every and _distinct(digests[split]) for split, every in every_path.items()}


def revision(src: str) -> str:
    """The Hub revision of a dataset in a snapshot folder (``.../snapshots/<commit sha>/...``), else ""."""
    found = re.search(r"/snapshots/([0-9a-f]{40})(?:/|$)", src.replace("\\", "/"))
    return found.group(1) if found else ""


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


class _ParquetTable:
    """A Parquet file read by row groups; each read a ranged one (its footer, then the columns asked for)."""

    def __init__(self, handle) -> None:
        import pyarrow.parquet as pq

        self._file = pq.ParquetFile(handle)
        self.schema = self._file.schema_arrow
        self.num_groups = self._file.metadata.num_row_groups

    def group_rows(self) -> list[int]:
        return [self._file.metadata.row_group(i).num_rows for i in range(self.num_groups)]

    def group(self, index: int, columns: Sequence[str]) -> list[list]:
        table = self._file.read_row_group(index, columns=list(columns))
        flat = table.flatten()  # a struct's field by its dotted name (image.path); a whole struct by its own
        return [(flat if "." in name else table).column(name).to_pylist() for name in columns]


class _ArrowTable:
    """An Arrow IPC file (``save_to_disk``'s, the HF cache's) mapped into memory: its record batches are the
    groups, read without a copy (only the pages of the columns asked for are read from disk)."""

    def __init__(self, source) -> None:
        import pyarrow as pa

        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            self.batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        else:
            self.batches = list(reader)
        self.schema = reader.schema
        self.num_groups = len(self.batches)

    def group_rows(self) -> list[int]:
        return [batch.num_rows for batch in self.batches]

    def group(self, index: int, columns: Sequence[str]) -> list[list]:
        batch, values = self.batches[index], []
        for name in columns:
            column, _, child = name.partition(".")
            array = batch.column(column)
            values.append((array.field(child) if child else array).to_pylist())
        return values


@contextlib.contextmanager
def _open_table(src: str, path: str) -> Iterator:
    """A Parquet or Arrow file of the dataset, open for reading by groups (row groups, record batches)."""
    full = _full(src, path)
    if not full.lower().endswith(".arrow"):
        with open_for_ranges(full) as handle:
            yield _ParquetTable(handle)
        return
    if FileSystems.get_scheme(full) not in (None, "file"):
        raise InputError(f"{full}: Arrow files are read from a local disk (they are mapped into memory); "
                         "copy the dataset's folder to one, or convert its Parquet files")
    import pyarrow as pa

    with pa.memory_map(full[len("file://"):] if full.startswith("file://") else full) as source:
        yield _ArrowTable(source)


def _row_groups(src: str, rows: _Rows, columns: Sequence[str]) -> Iterator[tuple[int, list[list]]]:
    """``(group, [values of each column])`` of a file, a group at a time (``image.path``: a struct's field)."""
    with _open_table(src, rows.file.path) as table:
        for group in range(table.num_groups):
            yield group, table.group(group, columns)


def _path_digests(src: str, rows: _Rows, digests: array) -> bool:
    """Append an 8-byte digest of each row's image path to ``digests``; False when a row has no path.

    Reads the file's path and label columns whole (raising what pyarrow raises
    for a damaged file). 8 bytes a row in an array: a million rows cost 8 MB.
    """
    every = True
    for _, (paths, _labels) in _row_groups(src, rows, [f"{rows.columns.image}.path", rows.columns.label]):
        for path in paths:
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
        split = SPLITS[rows.file.split.lower()]
        image = rows.columns.image
        for group, (paths, values) in _row_groups(src, rows, [f"{image}.path", rows.columns.label]):
            for row, (path, value) in enumerate(zip(paths, values)):
                number = numbers.get(split, 0)
                numbers[split] = number + 1
                relpath = f"{split}/{path.lstrip('/')}" if unique[split] else f"{split}/{number:09d}"
                locator = cell_locator(rows.file.path, group, row, image)
                name, problem = _class_name(value, names)
                if problem:
                    where = f"{rows.file.path or posixpath.basename(src)} row group {group} row {row}"
                    refused.append(ImageRef(split, relpath, 0, archive_members.refusal(problem[0], f"{where}: "
                                                                                       f"{problem[1]}")))
                    continue
                yield split, name, relpath, locator


def _annotated(src: str, opened: Sequence[_Rows], unique: dict[str, bool], refused: list[ImageRef],
               bbox_format: str) -> Iterator[annotated_plan.AnnotatedImage]:
    """Every row with its objects or labels (:mod:`beam_jobs.sources.hub_annotations`), named as ``_members`` names
    them; a row whose labels cannot be had is refused."""
    numbers: dict[str, int] = {}
    for rows in opened:
        split = SPLITS[rows.file.split.lower()]
        image, column = rows.columns.image, rows.columns.annotation
        for group, (paths, values, *extra) in _row_groups(src, rows, [f"{image}.path", rows.columns.label,
                                                                      *rows.columns.extra]):
            extras = [dict(zip(rows.columns.extra, row)) for row in zip(*extra)] if extra else [{}] * len(paths)
            for row, (path, value, more) in enumerate(zip(paths, values, extras)):
                number = numbers.get(split, 0)
                numbers[split] = number + 1
                relpath = f"{split}/{path.lstrip('/')}" if unique[split] else f"{split}/{number:09d}"
                locator = cell_locator(rows.file.path, group, row, image)
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


def _identities(src: str, paths: Sequence[str]) -> dict[str, str]:
    """Each Parquet file's size and modification time: what resume compares, and the manifest names."""
    found = {}
    for path in paths:
        meta = FileSystems.match([_full(src, path)])[0].metadata_list[0]
        found[path or posixpath.basename(src)] = f"{meta.size_in_bytes} bytes, modified {meta.last_updated_in_seconds!r}"
    return found


def _full(src: str, path: str) -> str:
    return FileSystems.join(src, *path.split("/")) if path else src


def lost_rows(src: str, files: Sequence[ParquetFile], opened: Sequence[_Rows],
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
    sizes = {file.path: _size(src, file.path) for file in files}
    rows_of = {rows.file.path: rows.num_rows for rows in opened}

    def rows_per_byte(split: Optional[str]) -> float:
        paths = [path for path in readable if split is None or SPLITS[_split_of(files, path)] == split]
        total = sum(sizes[path] for path in paths)
        return sum(rows_of[path] for path in paths) / total if total else 0.0

    extra, warnings = 0, []
    for file in refused:
        split, name = SPLITS[file.split.lower()], file.path or posixpath.basename(src.rstrip("/"))
        if file.path in footers:
            count, how = footers[file.path], "the rows its footer declares"
        else:
            rate = rows_per_byte(split) or rows_per_byte(None)
            count, how = max(1, round(sizes[file.path] * rate)), f"its {sizes[file.path]:,} bytes' share of the split"
        extra += count - 1
        warnings.append(f"{name} could not be read: the {split} split loses about {count} rows ({how}); each "
                        f"counts against --max-bad-fraction (see {record_schema.REJECTED_FILE})")
    return extra, warnings


def _split_of(files: Sequence[ParquetFile], path: str) -> str:
    return next(file.split for file in files if file.path == path).lower()


def _size(src: str, path: str) -> int:
    return FileSystems.match([_full(src, path)])[0].metadata_list[0].size_in_bytes


def missing_from_sets(files: Sequence[ParquetFile], src: str) -> list[str]:
    """A warning for each file that a set's names say exists (``train-00001-of-00003.parquet``) and is missing."""
    sets: dict[tuple[str, str, int], set[int]] = {}
    for file in files:
        folder, _, name = file.path.rpartition("/")
        match = re.match(r"^(?P<split>.+?)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<ext>\.parquet|\.arrow)$", name)
        if match:
            key = (folder, match["split"], int(match["count"]), match["ext"])
            sets.setdefault(key, set()).add(int(match["index"]))
    warnings = []
    for (folder, split, count, ext), present in sorted(sets.items()):
        for index in sorted(set(range(count)) - present):
            missing = posixpath.join(folder, f"{split}-{index:05d}-of-{count:05d}{ext}")
            warnings.append(f"{missing} is missing from {src}: its set names {count} files and {len(present)} are "
                            f"there, so the {split} split is converted without that file's rows")
    return warnings


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged Parquet file raises: pyarrow's own errors (some are not ValueErrors), and I/O's."""
    import pyarrow.lib

    return (OSError, ValueError, EOFError, pyarrow.lib.ArrowException)


def _refused_file(src: str, file: ParquetFile, err: BaseException) -> ImageRef:
    name = file.path or posixpath.basename(src.rstrip("/"))
    return ImageRef(SPLITS[file.split.lower()], name, 0, archive_members.refusal(
        "corrupt-parquet", f"{name}: not a readable Parquet file: {_first_line(err)}"))


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


class CellReader:
    """Reads rows' images for one chunk of work: each row group's image column read once, then served row by row.

    A part lists a file's rows in order, so a chunk reads each row group once
    (by ranged reads: only that column's chunks). Memory: one row group's images.
    """

    def __init__(self, src: str, local_paths: bool = False) -> None:
        self._src, self._local_paths = src, local_paths
        self._group: tuple[Optional[tuple[str, int, str]], list, list] = (None, [], [])

    def read(self, source: str) -> bytes:
        """The image bytes of the row ``source`` locates.

        Raises:
          CellError: the row has no image (``missing-image``), or its file cannot be read (``corrupt-parquet``).
        """
        file, group, row, column = parse_cell(source)
        if self._group[0] != (file, group, column):
            self._group = ((file, group, column), *self._load(file, group, column))
        images, paths = self._group[1], self._group[2]
        if row >= len(images):
            raise CellError("corrupt-parquet", f"{file} row group {group} has no row {row}")
        if images[row] is not None:
            return images[row]
        return self._beside(file, paths[row], group, row)

    def _load(self, file: str, group: int, column: str) -> tuple[list, list]:
        try:
            with _open_table(self._src, file) as table:
                images, paths = table.group(group, [f"{column}.bytes", f"{column}.path"])
        except _read_errors() as err:
            raise CellError("corrupt-parquet", f"{file} row group {group}: {_first_line(err)}") from err
        return images, paths

    def _beside(self, file: str, path: Optional[str], group: int, row: int) -> bytes:
        """A row whose bytes are null: the file its ``path`` names beside the Parquet file (``datasets`` writes those)."""
        where = f"{file or posixpath.basename(self._src)} row group {group} row {row}"
        if path and path.startswith("/"):  # datasets' to_parquet of local image files: their absolute paths
            if not self._local_paths:
                raise CellError("missing-image", f"{where}: no image bytes, only the absolute path {path!r}; "
                                "pass --local-paths to read it from this machine")
            try:
                with open(path, "rb") as handle:
                    return handle.read()
            except OSError as err:
                raise CellError("missing-image", f"{where}: no image bytes, and {path} cannot be read: "
                                f"{err.strerror}") from None
        if not path or ".." in path.split("/"):
            raise CellError("missing-image", f"{where}: no image bytes" + (f" and the path {path!r} is not "
                                                                         "relative to its file" if path else ""))
        folder = posixpath.dirname(file)
        target = _full(self._src, posixpath.join(folder, path) if folder else path)
        try:
            with FileSystems.open(target) as handle:
                return handle.read()
        except OSError:
            raise CellError("missing-image", f"{where}: no image bytes, and {path} is not beside the file") from None
