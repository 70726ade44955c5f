"""What a converted dataset holds, read from its manifest.

The manifest is the only source of the shard list: a glob could pick up stale
shards of an earlier run or partial files, the manifest cannot.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import time
from typing import Optional, Union

import tensorflow as tf

import record_schema
from reader import storage
from record_files import staging as staging_names
from record_files import versions
from record_files.records_table import RecordsTable, TableError


class DatasetNotFoundError(FileNotFoundError):
    """The folder has no manifest.json: it is not a (complete) converted dataset."""


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file of a split."""

    path: str
    num_examples: int
    num_bytes: int
    sha256: str
    index_path: str = ""  # its record index ("offset size" per record, DALI's format); "" if it has none
    index_bytes: int = 0  # the index's size as written (0: unknown, a dataset written before sizes were recorded)
    # An extent: a masked version (manifest "live", docs/update.md) reads runs of a file, ``num_examples`` records
    # from ``first``; ``file_records`` the file's count (-1: whole). Bytes, SHA-256 and index stay the file's.
    first: int = 0
    file_records: int = -1

    @property
    def whole(self) -> bool:
        return self.first == 0 and self.file_records in (-1, self.num_examples)

    @property
    def records_in_file(self) -> int:
        return self.file_records if self.file_records >= 0 else self.num_examples


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """A split's records table (:mod:`record_files.records_table`) as the manifest lists it."""

    path: str
    num_rows: int
    num_bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its shards (in manifest order), label counts, its largest image side (None: unknown), and its
    records table (None: converted before records tables, or not by the converter)."""

    name: str
    num_examples: int
    num_bytes: int
    shards: tuple[ShardInfo, ...]
    label_counts: tuple[int, ...]
    max_side: Optional[int] = None
    records_table: Optional[TableInfo] = None

    @property
    def files(self) -> list[str]:
        """Each extent's file, in manifest order (a masked file once per run of it: see :attr:`masked`)."""
        return [shard.path for shard in self.shards]

    @property
    def masked(self) -> bool:
        """Some extent is a run of its file: its readers read extents (``records.read_segment``), not files."""
        return not all(shard.whole for shard in self.shards)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """A converted dataset: classes, splits, counts and shard files.

    Attributes:
      data_dir: the dataset folder.
      classes: class names; label i is ``classes[i]``.
      splits: split name -> :class:`SplitInfo`.
      manifest: the raw manifest, for anything else it records.
      all_jpeg: every record's image is a JPEG (true of every dataset the
        converter writes), so the pipelines decode without checking the format.
    """

    data_dir: str
    classes: tuple[str, ...]
    splits: dict[str, SplitInfo]
    manifest: dict
    all_jpeg: bool = False
    version: int = versions.FIRST_VERSION  # which version of a dataset that grows (--update) this is

    def version_file(self, name: str) -> str:
        """The path of ``name``, a file this version writes beside its manifest (``rejected.jsonl``,
        ``duplicates.jsonl``, ``croissant.json``...): in ``data_dir`` for version 1, ``versions/<N>/`` after."""
        return os.path.join(self.data_dir, versions.in_version(self.version, name))

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def object_classes(self) -> tuple[str, ...]:
        """The named classes in id order, without the background's id 0 and the ids a dataset leaves unused
        (COCO's 80 of ids 1-90): index i is what ``ObjectTargets(contiguous_ids=True)`` labels i, and their
        count is a KerasHub detector's ``num_classes``."""
        return tuple(name for name in self.classes if name)

    @property
    def keypoint_names(self) -> tuple[str, ...]:
        """The names of the K points each object's keypoints hold, in their order (COCO's person: ``nose``,
        ``left_eye``, ...; the manifest's ``keypoints``); empty for records without keypoints, or converted
        before the manifest recorded them. ``ObjectTargets(keypoints="auto")`` takes their count."""
        return tuple((self.manifest.get("keypoints") or {}).get("names", ()))

    @property
    def keypoint_flip(self) -> Optional[tuple[int, ...]]:
        """The points a horizontal flip swaps, as their names pair them (``left_eye`` with ``right_eye``): what
        ``ObjectTargets(keypoint_flip=...)`` takes; None where the names pair none up or none are recorded."""
        flip = (self.manifest.get("keypoints") or {}).get("flip")
        return tuple(flip) if flip else None

    @property
    def task(self) -> str:
        """What the records label: ``record_schema.TASK_CLASSIFICATION`` (one class), or ``TASK_OBJECTS`` (boxes)."""
        return self.manifest.get("task", record_schema.TASK_CLASSIFICATION)

    @property
    def converted(self) -> bool:
        """Written by the converter (labels in range are guaranteed), not foreign shards."""
        return bool(self.manifest)

    @property
    def fingerprint(self) -> str:
        """12 hex digits naming the dataset's content: equal whenever a reader would read the same bytes.

        Taken from what a reader reads, and only that: the record format, the
        classes and their text, and per split its counts and each shard's file
        name, record count, size and SHA-256. Not from when, where, how or by
        which runner the shards were made, so the same data reconverted into
        another folder, on another runner or another day is the same version,
        and any changed byte of any shard is another. For foreign shards
        (no manifest, no hashes): their paths, sizes and counts.
        Caches carry it in their file names and positions record it, so a cache
        or a position never outlives its data.
        """
        return _digest(self._content())

    @property
    def legacy_fingerprint(self) -> str:
        """The fingerprint as versions before the content fingerprint took it (the whole manifest).

        Positions saved under it still resume on the dataset they were saved
        on; caches named by it are rebuilt once under the new name.
        """
        if not self.manifest:
            return self.fingerprint
        return _digest(self.manifest)

    def _content(self) -> dict:
        if not self.manifest:
            return {name: [(s.path, s.num_bytes, s.num_examples) for s in split.shards]
                    for name, split in sorted(self.splits.items())}
        return versions.manifest_content(self.manifest)

    def is_version(self, fingerprint: str) -> bool:
        """``fingerprint`` names this dataset's content (now, or as the manifest-wide fingerprint did)."""
        return fingerprint in (self.fingerprint, self.legacy_fingerprint)

    def split(self, name: str) -> SplitInfo:
        """The split called ``name``; ``ValueError`` listing the splits there are otherwise."""
        name = record_schema.SPLIT_ALIASES.get(name, name)
        if name not in self.splits:
            raise ValueError(f"split {name!r} is not in {self.data_dir}; its splits are {sorted(self.splits)}")
        return self.splits[name]


_digest = versions.digest


def dataset_info(data_dir: str, version: Optional[int] = None) -> DatasetInfo:
    """Read the manifest of ``data_dir``'s latest version, or of ``version`` (a dataset that grows: ``--update``).

    The latest is the version ``versions/latest`` names (docs/format.md, "Versions"); a dataset never updated
    has version 1 only, ``data_dir/manifest.json``.

    Raises:
      DatasetNotFoundError: no manifest (not converted, or a conversion never finished), or ``version`` pruned.
      ValueError: a manifest of an unknown format version or malformed; ``version`` beyond the latest.
    """
    if not storage.is_s3(data_dir) and tf.io.gfile.exists(data_dir) and not tf.io.gfile.isdir(data_dir):
        raise DatasetNotFoundError(
            f"{data_dir} is a file, not a dataset folder: pass the folder that holds {record_schema.MANIFEST_FILE} "
            f"({os.path.dirname(data_dir) or '.'}). Shards without a manifest are read with "
            "reader.build_dataset(reader.foreign_dataset_info({'train': [...]}), ...)")
    version = _chosen_version(data_dir, version)  # after: a file has no version pointer under it to read
    path = os.path.join(data_dir, versions.manifest_path(version))
    try:
        body = storage.read_bytes(path)
    except (FileNotFoundError, tf.errors.NotFoundError):
        kept = "".join(f"; {work.describe()}" for work in kept_work(data_dir))
        raise DatasetNotFoundError(_not_found_message(data_dir) + kept) from None
    try:
        manifest = json.loads(body.decode("utf-8"))
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    layout = manifest.get("format_version")
    if layout != record_schema.FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {layout!r}; this reader reads version {record_schema.FORMAT_VERSION}"
        )
    unknown = versions.unknown_requirements(manifest, path) or versions.live_problem(manifest, path)
    if unknown:
        raise ValueError(unknown)
    try:
        splits = {name: _split_info(data_dir, name, raw) for name, raw in manifest["splits"].items()}
        return DatasetInfo(data_dir, tuple(manifest["classes"]), splits, manifest, all_jpeg=True, version=version)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path} is malformed (missing or bad {err})") from err


def latest_version(data_dir: str) -> int:
    """The number of ``data_dir``'s latest version: what ``versions/latest`` holds, 1 without it."""
    pointer = os.path.join(data_dir, versions.POINTER_FILE)
    try:
        return versions.parse_pointer(storage.read_bytes(pointer).decode("utf-8", "replace"), pointer)
    except (FileNotFoundError, tf.errors.NotFoundError):
        return versions.FIRST_VERSION


def version_numbers(data_dir: str) -> list[int]:
    """The versions of ``data_dir`` whose manifests are there (not pruned), oldest first."""
    return [number for number in range(versions.FIRST_VERSION, latest_version(data_dir) + 1)
            if storage.exists(os.path.join(data_dir, versions.manifest_path(number)))]


def files_of_versions(data_dir: str) -> set[str]:
    """The shard files (relative to ``data_dir``) that any version of it not pruned reads."""
    files = set()
    for number in version_numbers(data_dir):
        manifest = json.loads(storage.read_bytes(os.path.join(data_dir, versions.manifest_path(number))))
        files.update(shard["file"] for split in manifest["splits"].values() for shard in split["shards"])
    return files


def _chosen_version(data_dir: str, version: Optional[int]) -> int:
    """``version`` checked against the latest (None: the latest)."""
    latest = latest_version(data_dir)
    if version is None:
        return latest
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= latest:
        raise ValueError(versions.missing_version(version, version_numbers(data_dir), data_dir))
    if version != latest and not storage.exists(os.path.join(data_dir, versions.manifest_path(version))):
        raise DatasetNotFoundError(versions.missing_version(version, version_numbers(data_dir), data_dir))
    return version


def _not_found_message(data_dir: str) -> str:
    """Why ``data_dir`` is not a dataset, and the command that makes one."""
    base = f"{data_dir} has no {record_schema.MANIFEST_FILE}, so it is not a complete converted dataset"
    if any(char in data_dir for char in "*?[") and not storage.isdir(data_dir):
        return (f"{data_dir} is a pattern, not a dataset folder: pass the folder that holds "
                f"{record_schema.MANIFEST_FILE}, or read shards by pattern with "
                f"reader.build_dataset(reader.foreign_dataset_info({{'train': {data_dir!r}}}), ...)")
    if not storage.isdir(data_dir):
        return (f"{data_dir} does not exist. Convert a folder of images into it with: "
                f"python -m converter --src IMAGE_FOLDER --out {data_dir}")
    entries = storage.listdir(data_dir)
    if any(record_schema.parse_shard_filename(name) for name in entries):
        return base + " (its shards are there: a conversion into it did not finish, or it was written by " \
            "another tool; shards without a manifest are read with reader.build_dataset(reader.foreign_dataset_info(...), ...))"
    if entries:
        return (base + f"; it looks like a folder of images. Convert it with: python -m converter --src "
                f"{data_dir} (the dataset is written beside it, to {data_dir.rstrip('/')}-tfrecords), "
                "then read that folder")
    return base + f". Convert a folder of images into it with: python -m converter --src IMAGE_FOLDER --out {data_dir}"


@dataclasses.dataclass(frozen=True)
class KeptWork:
    """A stopped conversion's staging folder for ``data_dir``, kept for the same command to resume."""

    path: str
    num_bytes: int
    age_s: float

    def describe(self) -> str:
        hours = self.age_s / 3600
        age = f"{hours:.1f} h" if hours >= 1 else f"{self.age_s / 60:.0f} min"
        return (f"a stopped conversion's finished work is kept in {self.path} ({self.num_bytes / 1e6:.1f} MB, "
                f"{age} old): the command that was stopped resumes from it; deleting that folder discards it")


def kept_work(data_dir: str) -> list[KeptWork]:
    """Staging folders that stopped conversions into ``data_dir`` kept (beside it, or inside it in an object store)."""
    data_dir = data_dir.rstrip("/")
    if storage.is_s3(data_dir) or "://" in data_dir:
        candidates = [f"{data_dir}/{name}" for name in _listing(data_dir)
                      if staging_names.is_remote_staging(name)]
    else:
        parent, name = os.path.split(os.path.abspath(data_dir))
        candidates = [os.path.join(parent, entry) for entry in sorted(_listing(parent))
                      if staging_names.is_sibling(entry, name)]
    found = []
    for path in candidates:
        if storage.exists(f"{path}/{staging_names.RESUME_RECORD_PATH}"):
            num_bytes, newest = storage.tree_size(path)
            found.append(KeptWork(path, num_bytes, max(0.0, time.time() - newest)))
    return found


def _listing(folder: str) -> list[str]:
    try:
        return storage.listdir(folder)
    except (OSError, tf.errors.NotFoundError):
        return []


def _split_info(data_dir: str, name: str, raw: dict) -> SplitInfo:
    shards = tuple(extent for s in raw["shards"] for extent in _extents(data_dir, s))
    table = raw.get("records_table")
    return SplitInfo(name, raw["num_examples"], raw["num_bytes"], shards, tuple(raw.get("label_counts", ())),
                     raw.get("max_side"), TableInfo(os.path.join(data_dir, table["file"]), table["num_rows"],
                                                    table["num_bytes"], table["sha256"]) if table else None)


def _extents(data_dir: str, s: dict) -> list[ShardInfo]:
    """A manifest's shard entry as the extents a reader reads: the file, or each run its ``live`` lists."""
    whole = ShardInfo(os.path.join(data_dir, s["file"]), s["num_examples"], s["num_bytes"], s["sha256"],
                      os.path.join(data_dir, s["dali_index"]) if s.get("dali_index") else "", s.get("index_bytes", 0))
    if "live" not in s:
        return [whole]
    return [dataclasses.replace(whole, num_examples=count, first=first, file_records=s["file_records"])
            for first, count in s["live"]]


def open_records_table(split: SplitInfo) -> Optional[RecordsTable]:
    """``split``'s records table open for reading, its rows read as they are asked for; None when its manifest
    lists none (a dataset converted before records tables: its readers scan the shards instead).

    A local table is read a row group at a time; one in an object store (``s3://``, ``gs://``) is fetched whole
    first (about 60 bytes a record: 60 MB for 1M).

    Raises:
      ValueError: the table the manifest lists is missing, is not a records table of this version, or holds
        another number of rows than the split's records (naming it).
    """
    table = split.records_table
    if table is None:
        return None
    try:
        if "://" in table.path and not table.path.startswith("file://"):
            source = io.BytesIO(storage.read_bytes(table.path))
        else:
            source = table.path.removeprefix("file://")
        opened = RecordsTable(source, name=table.path)
    except (OSError, tf.errors.NotFoundError) as err:
        raise ValueError(f"{table.path}, the records table the manifest lists, cannot be read ({err}); "
                         "copy it beside the manifest, or remove the split's records_table entry to scan the shards") \
            from None
    except TableError as err:
        raise ValueError(str(err)) from None
    if opened.num_rows != split.num_examples or opened.num_rows != table.num_rows:
        raise ValueError(f"{table.path} holds {opened.num_rows} rows and split {split.name!r} has "
                         f"{split.num_examples} records: not the records table its manifest lists")
    return opened


def steps_per_epoch(data_dir: Union[str, DatasetInfo], split: str, global_batch_size: int,
                    drop_remainder: bool = True) -> int:
    """Batches in one epoch of ``split`` at ``global_batch_size``, from the manifest.

    ``data_dir``: a converted dataset's folder, or a :class:`DatasetInfo`
    (``foreign_dataset_info(...)`` for shards without a manifest).
    ``drop_remainder=True`` matches the training preset (static batch shape);
    use False for an eval pass that keeps the final partial batch.

    Raises:
      ValueError: the split is smaller than one batch (never returns 0, which
        Keras's ``fit`` would take as "no limit").
    """
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size!r}")
    info = data_dir if isinstance(data_dir, DatasetInfo) else dataset_info(data_dir)
    examples = info.split(split).num_examples
    data_dir = info.data_dir or "the shards"
    steps = examples // global_batch_size if drop_remainder else -(-examples // global_batch_size)
    if steps == 0:
        # Keras would read steps_per_epoch=0 as "no limit" and an infinite training set never ends.
        raise ValueError(
            f"split {split!r} of {data_dir} has {examples} examples, fewer than one batch of {global_batch_size}: "
            "an epoch would have 0 steps. Use a smaller batch size (or drop_remainder=False for a partial batch)"
        )
    return steps
