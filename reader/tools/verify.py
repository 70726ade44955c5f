"""``verify``: check a converted dataset end to end, record by record.

Checks that the manifest is there and well formed; every listed shard exists
and no unlisted ``{split}-*`` shard file sits beside them; every record's
length and data CRCs; every record parses with the required keys and a label
in range; the SHA-256 of ``image/encoded`` matches ``image/key/sha256``; every
image decodes (or ``sample`` per shard); and counts, bytes and checksums match
the manifest. Problems are reported per shard and record index; nothing stops
at the first one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Optional

import tensorflow as tf
from google.protobuf.message import DecodeError

import record_schema
from reader import storage
from reader.frames import file_sha256, framed_records
from reader.info import DatasetInfo, dataset_info, files_of_versions, latest_version, open_records_table
from record_files import idx, versions
from record_files.tfrecord import FrameError


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong: the file, the record index when there is one, and what."""

    file: str
    record: Optional[int]
    message: str

    def __str__(self) -> str:
        where = self.file if self.record is None else f"{self.file} record {self.record}"
        return f"{where}: {self.message}"


@dataclasses.dataclass
class Report:
    """What ``verify`` found."""

    data_dir: str
    shards_checked: int = 0
    records_checked: int = 0
    images_decoded: int = 0
    records_masked: int = 0  # records of shard files a masked version does not read (checked all the same)
    problems: list[Problem] = dataclasses.field(default_factory=list)
    named: str = ""  # how the output names it: with its version, for a dataset that grew (--update)

    @property
    def ok(self) -> bool:
        return not self.problems

    def damaged_files(self) -> list[str]:
        return sorted({problem.file for problem in self.problems})

    def format(self) -> str:
        # the version's records, as its manifest counts them; a masked file's other records are checked all the
        # same (its CRCs, size and SHA-256 are the file's) and said apart (the trial read them as the version's)
        masked = f" (and {self.records_masked} masked ones in its files: deleted by a version, checked too)" \
            if self.records_masked else ""
        head = (f"{self.named or self.data_dir}: {self.shards_checked} shards, "
                f"{self.records_checked - self.records_masked} records{masked}, {self.images_decoded} images "
                "decoded: ")
        if self.ok:
            return head + "OK"
        lines = [head + f"{len(self.problems)} problems in {len(self.damaged_files())} files"]
        lines += [f"  {problem}" for problem in self.problems]
        return "\n".join(lines)


def verify(data_dir: str, sample: Optional[int] = None, version: Optional[int] = None) -> Report:
    """Check ``data_dir`` (its latest version, or ``version``); ``sample`` decodes only the first N images of
    each shard.

    Raises:
      DatasetNotFoundError / ValueError: no manifest, or one that is malformed
        (nothing else can be checked without it).
    """
    info = dataset_info(data_dir, version=version)
    report = Report(data_dir, named=versions.named(data_dir, info.version, latest_version(data_dir)))
    _check_listing(info, report)
    for split in info.splits.values():
        table = _check_records_table(info, split, report)
        live = _live_records(split)  # a masked file's table rows are its live records' only
        for number, shard in enumerate(_shard_files(split, report)):
            rows = table and table.for_shard(number, shard.num_examples, live.get(shard.path))
            if storage.exists(shard.path):
                _check_shard(info, shard, sample, report, rows)
            elif table:
                rows.skip()
    return report


def _shard_files(split, report: Report) -> list:
    """The split's shard files, each once and whole: a masked version's runs of a file (its extents) are checked
    as the file they are runs of (every frame's CRCs, its count, size, SHA-256 and index, as written), and its
    records outside them are counted as masked (present, not the version's: docs/update.md)."""
    files: dict = {}
    for shard in split.shards:
        if shard.whole:
            files[shard.path] = shard
            continue
        if shard.path not in files:
            files[shard.path] = dataclasses.replace(shard, first=0, num_examples=shard.file_records, file_records=-1)
            report.records_masked += shard.file_records
        report.records_masked -= shard.num_examples
    return list(files.values())


def _live_records(split) -> dict[str, set[int]]:
    """Each masked file's records the version reads (its extents' runs), by path."""
    live: dict[str, set[int]] = {}
    for shard in split.shards:
        if not shard.whole:
            live.setdefault(shard.path, set()).update(range(shard.first, shard.first + shard.num_examples))
    return live


class _TableRows:
    """A split's records table read alongside its shards: each record checked against its row (its place, offset,
    class ids, size, image bytes, SHA-256 and path), a row group in memory at a time; the first difference is
    a problem, and the rest of the split's rows are not compared (they may only be shifted)."""

    def __init__(self, table, name: str, task: str) -> None:
        self._rows = (row for group in table.row_groups() for row in group.to_pylist())
        self.name, self._task, self.done = name, task, False
        self._shard, self._left, self._live = 0, 0, None

    def for_shard(self, number: int, records: int, live: Optional[set[int]] = None) -> "_TableRows":
        """The rows of shard ``number``, of ``records`` records; ``live``: a masked file's records that have one."""
        self._shard, self._left, self._live = number, records if live is None else len(live), live
        return self

    def skip(self) -> None:
        for _ in range(self._left):
            next(self._rows, None)
        self._left = 0

    def check(self, index: int, offset: int, data: bytes, report: Report) -> None:
        if self.done or (self._live is not None and index not in self._live):
            return
        row, self._left = next(self._rows, None), self._left - 1
        problem = "has fewer rows than the records" if row is None else _row_problem(
            row, self._shard, index, offset, data, self._task)
        if problem:
            report.problems.append(Problem(self.name, None, f"{problem} (shard {self._shard} record {index}); the "
                                           "report and repeat factors would read wrong figures: convert again"))
            self.done = True


def _check_records_table(info: DatasetInfo, split, report: Report) -> Optional[_TableRows]:
    """The split's records table, when the manifest lists one: there, its size and SHA-256 the manifest's, a
    records table of this version with a row per record; its rows, to check against the records as they are
    read (None: no table, or one already found wrong)."""
    table = split.records_table
    if table is None:
        return None
    name = os.path.basename(table.path)
    if not storage.exists(table.path):
        report.problems.append(Problem(name, None, "records table listed in the manifest but missing"))
        return None
    if storage.size(table.path) != table.num_bytes or file_sha256(table.path) != table.sha256:
        report.problems.append(Problem(name, None, "records table differs from the manifest (size or SHA-256)"))
        return None
    try:
        return _TableRows(open_records_table(split), name, info.task)
    except ValueError as err:
        report.problems.append(Problem(name, None, str(err)))
        return None


def _row_problem(row: dict, shard: int, index: int, offset: int, data: bytes, task: str) -> Optional[str]:
    """How a records table's row differs from the record it stands for, or None."""
    try:
        features = tf.train.Example.FromString(data).features.feature
    except DecodeError:
        return None  # the record's own problem, reported as such
    ints = lambda key: list(features[key].int64_list.value) if key in features else []  # noqa: E731
    first = lambda key: (features[key].bytes_list.value or [b""])[0] if key in features else b""  # noqa: E731
    classes = [] if task == record_schema.TASK_SEGMENTATION else ints(
        record_schema.OBJECT_LABEL if task == record_schema.TASK_OBJECTS else record_schema.LABEL)
    expected = {"shard": shard, "index": index, "offset": offset, "classes": classes,
                "width": (ints(record_schema.WIDTH) or [0])[0], "height": (ints(record_schema.HEIGHT) or [0])[0],
                "image_bytes": len(first(record_schema.IMAGE_ENCODED)),
                "sha256": first(record_schema.SHA256).decode("ascii", "replace"),
                "path": first(record_schema.FILENAME).decode("utf-8", "replace")}
    found = {**row, "sha256": row["sha256"].hex()}
    wrong = [key for key, value in expected.items() if found.get(key) != value]
    return f"its row differs from the record in {', '.join(wrong)}" if wrong else None


def _check_listing(info: DatasetInfo, report: Report) -> None:
    listed = {os.path.basename(s.path) for split in info.splits.values() for s in split.shards}
    if info.version > 1 or info.manifest.get("version"):  # a dataset that grows: its other versions' shards too
        listed |= files_of_versions(info.data_dir)
    for split in info.splits.values():
        for shard in split.shards:
            if not storage.exists(shard.path):
                report.problems.append(Problem(os.path.basename(shard.path), None, "listed in the manifest but missing"))
    for name in storage.listdir(info.data_dir):
        parsed = record_schema.parse_shard_filename(name)
        if parsed is not None and name not in listed:
            report.problems.append(Problem(name, None, "shard file not listed in the manifest (stale or foreign)"))


def _check_shard(info: DatasetInfo, shard, sample: Optional[int], report: Report,
                 table: Optional[_TableRows] = None) -> None:
    name = os.path.basename(shard.path)
    report.shards_checked += 1
    count = 0
    frames = []  # (offset, size) of every record: what its record index must say
    try:
        for index, (offset, size, data) in enumerate(framed_records(shard.path)):
            count += 1
            frames.append((offset, size))
            decode = sample is None or index < sample
            problem = check_record(data, info.num_classes, decode, info.task)
            if table is not None:
                table.check(index, offset, data, report)
            report.records_checked += 1
            report.images_decoded += int(decode and problem is None)
            if problem is not None:
                report.problems.append(Problem(name, index, problem))
    except FrameError as err:
        report.problems.append(Problem(name, err.record, f"{err.args[0]}; the rest of the shard is unreadable"))
        frames = None  # its index cannot be checked against records that cannot be read
    if table is not None:
        table.skip()  # the rows of records that could not be read
    size = storage.size(shard.path)
    if count != shard.num_examples:
        report.problems.append(Problem(name, None, f"{count} records, the manifest says {shard.num_examples}"))
    if size != shard.num_bytes:
        report.problems.append(Problem(name, None, f"{size} bytes, the manifest says {shard.num_bytes}"))
    if shard.sha256 and file_sha256(shard.path) != shard.sha256:
        report.problems.append(Problem(name, None, "SHA-256 differs from the manifest"))
    if frames is not None:
        _check_record_index(info, shard, frames, report)


def _check_record_index(info: DatasetInfo, shard, frames: list, report: Report) -> None:
    """The shard's record index (``.idx``, DALI's format), if the manifest names one, gives every record's
    offset and size. A missing or damaged one slows the reader's starts inside the shard, never breaks them."""
    if not shard.index_path:
        return
    index_name = os.path.basename(shard.index_path)
    fix = f"; rebuild it with: python -m converter reindex {info.data_dir}"
    try:
        text = storage.read_bytes(shard.index_path).decode("ascii", errors="replace")
    except (FileNotFoundError, tf.errors.NotFoundError):
        report.problems.append(Problem(index_name, None, "record index listed in the manifest but missing" + fix))
        return
    expected = idx.index_text(frames)
    if text != expected:
        report.problems.append(Problem(index_name, None,
                                       f"record index does not match {os.path.basename(shard.path)}'s records" + fix))


def check_record(data: bytes, num_classes: int, decode: bool,
                 task: str = record_schema.TASK_CLASSIFICATION) -> Optional[str]:
    """What is wrong with one serialized record of a dataset of ``task`` (the manifest's), or None."""
    try:
        example = tf.train.Example.FromString(data)
    except DecodeError as err:
        return f"not a tf.train.Example: {err}"
    features = example.features.feature
    objects = task in (record_schema.TASK_OBJECTS, record_schema.TASK_SEGMENTATION)
    missing = [key for key in (record_schema.OBJECT_FEATURES if objects else record_schema.FEATURES)
               if key not in features]
    if missing:
        return f"missing keys {missing}"
    image = features[record_schema.IMAGE_ENCODED].bytes_list.value
    problem = _object_problem(features, num_classes) if objects else _label_problem(
        features, num_classes, several=task == record_schema.TASK_MULTILABEL)
    if problem is not None:
        return problem
    if len(image) != 1:
        return "image/encoded must hold exactly one value"
    declared = features[record_schema.SHA256].bytes_list.value
    if not declared or hashlib.sha256(image[0]).hexdigest().encode() != declared[0]:
        return "SHA-256 of image/encoded does not match image/key/sha256"
    if decode:
        try:
            pixels = tf.io.decode_jpeg(image[0], channels=0)  # as stored: 1 channel for grayscale
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as err:
            return f"image does not decode: {err.message.splitlines()[0]}"
        height = features[record_schema.HEIGHT].int64_list.value[0]
        width = features[record_schema.WIDTH].int64_list.value[0]
        channels = features[record_schema.CHANNELS].int64_list.value[0]
        if tuple(pixels.shape) != (height, width, channels):
            return f"image decodes to {tuple(pixels.shape)}, the record says ({height}, {width}, {channels})"
    return None


def _label_problem(features, num_classes: int, several: bool) -> Optional[str]:
    """One label in range; or, in a multi-label dataset, each label once, in order, in range, with its text."""
    labels = features[record_schema.LABEL].int64_list.value
    if not several and len(labels) != 1:
        return "image/class/label must hold exactly one value"
    if several and (list(labels) != sorted(set(labels))
                    or len(features[record_schema.LABEL_TEXT].bytes_list.value) != len(labels)):
        return "image/class/label must list each label once, in order, with its text in image/class/text"
    outside = [label for label in labels if not 0 <= label < num_classes]
    if outside:
        return f"label {outside[0]} is outside 0..{num_classes - 1}"
    return None


_PER_OBJECT = [key for key, kind in record_schema.OBJECT_FEATURES.items() if kind.endswith("_list")]


def _object_problem(features, num_classes: int) -> Optional[str]:
    """Every per-object list has an entry per object; classes in range; boxes inside [0, 1] and not empty."""
    def values(key):
        feature = features[key]
        return feature.float_list.value or feature.int64_list.value or feature.bytes_list.value

    lengths = {key: len(values(key)) for key in _PER_OBJECT + [record_schema.OBJECT_MASK] if key in features}
    if len(set(lengths.values())) > 1:
        return f"per-object lists differ in length: {lengths}"
    labels = features[record_schema.OBJECT_LABEL].int64_list.value
    outside = [label for label in labels if not 0 <= label < num_classes]
    if outside:
        return f"object classes {outside[:5]} are outside 0..{num_classes - 1}"
    corners = [features[key].float_list.value for key in (record_schema.BBOX_XMIN, record_schema.BBOX_YMIN,
                                                          record_schema.BBOX_XMAX, record_schema.BBOX_YMAX)]
    for index, (x0, y0, x1, y1) in enumerate(zip(*corners)):
        if not (0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1):
            return f"object {index}'s box ({x0}, {y0}, {x1}, {y1}) is not inside [0, 1] with some area"
    return None
