"""Each split's records table of version N+1, composed from the latest version's table and the new shards'.

In:  the comparison's :class:`beam_jobs.planning.changes.Changes` (which shards are reused whole, which lost
     records and which of theirs survive), the latest version's manifest and records tables, version N+1's
     split entries (:func:`beam_jobs.update.compose.version_manifest`: reused and masked shards, compacted ones,
     new ones, in that order) and the records tables the conversion of the changed images wrote into staging.
Out: ``<split>.records.parquet`` in staging (``versions/<N>/`` once published), one row a record the version
     reads, in its record order (:mod:`record_files.records_table`: ``shard`` is the shard's index in the
     version's split, ``index``/``offset`` its place in that shard's file), and the split entry's
     ``records_table`` (file, rows, bytes, SHA-256), as a conversion lists it.

Rows are never converted again: a reused shard's are the latest table's (a masked shard's: its live records
only), a compacted shard's survivors take their new places and offsets (its ``.idx``), a new shard's are the
conversion's. The footer's figures (:class:`record_files.record_stats.SplitStats`) are the latest table's, less
the records the version no longer reads (each read back from its shard by the offset its row gives, the
image never decoded: the cost follows the change, not N), plus the new shards'; the smallest and largest side
are taken from the rows written. Memory: one row group at a time, whatever N. The same SRC through the same
updates gives the same rows in the same row groups, so the same bytes.

A split whose latest version lists no records table (a version an update wrote before tables) gets none: the
readers scan it, as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa

import record_schema
from beam_jobs.files import publish, store_files
from beam_jobs.planning import changes as change_plan
from record_files import idx, records_table, tfrecord, versions
from record_files.record_stats import ObjectValues, SplitStats
from record_files.records_table import RecordsTable

logger = logging.getLogger(__name__)

_COUNTERS = ("images_by_class", "objects_by_class", "crowd_by_class", "difficult_by_class", "objects_per_image",
             "labels_per_image", "box_sizes", "formats", "channels")
_HISTOGRAMS = ("aspect_counts", "centres", "sides", "encoded_bytes")


def conversion_table(staging: str, split: str, listed: dict) -> str:
    """Where the conversion of the changed images keeps ``split``'s table (``listed``: its manifest entry): moved
    out of the version's name (which the version's own table takes) into staging's work folder the first time,
    so a resumed update finds it.

    Raises:
      RuntimeError: the file under the conversion's name is not the table it wrote (a version's table, from an
        update killed after its work folder was removed) and none was kept aside: nothing to compose from.
    """
    aside = os.path.join(publish.work_dir(staging), "update-" + record_schema.records_table_filename(split))
    written = os.path.join(staging, record_schema.records_table_filename(split))
    if not os.path.exists(aside) and os.path.exists(written):
        with open(written, "rb") as handle:
            if hashlib.file_digest(handle, "sha256").hexdigest() != listed["sha256"]:
                raise RuntimeError(f"{written} is not the records table the update's conversion wrote, and its "
                                   f"own is gone: remove {staging} and run the update again")
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        os.replace(written, aside)
    return aside


def write_tables(out: str, staging: str, found: change_plan.Changes, latest_manifest: dict, number: int,
                 converted: Optional[dict], renamed: dict, splits: dict[str, dict], task: str) -> None:
    """Write each split's table into staging and list it in its entry of ``splits`` (the version's manifest)."""
    folder = versions.version_dir(number)
    for split, entry in splits.items():
        before = latest_manifest["splits"].get(split, {})
        new_entry = (converted or {}).get("splits", {}).get(split, {})
        new_files = [f"{folder}/{shard['file']}" for shard in new_entry.get("shards", ())]
        if before.get("shards") and not before.get("records_table"):
            logger.info("split %s of the latest version lists no records table: version %d lists none either "
                        "(its readers scan it)", split, number)
            continue
        name = record_schema.records_table_filename(split)
        listed = new_entry.get("records_table")
        if new_files and not listed:
            logger.info("the conversion of split %s's changed images listed no records table: version %d lists "
                        "none for it (its readers scan it)", split, number)
            continue
        composer = _Split(out, staging, found, before, entry, renamed, new_files, split, task)
        groups = composer.groups(conversion_table(staging, split, listed) if new_files else None)  # aside first
        with open(os.path.join(staging, name), "wb") as handle:
            written = records_table.write_groups(groups, handle, split, composer.stats)
            handle.flush()
            os.fsync(handle.fileno())
        entry["records_table"] = {"file": f"{folder}/{name}", "num_rows": written.num_rows,
                                  "num_bytes": written.num_bytes, "sha256": written.sha256}


class _Split:
    """One split's rows, composed a row group at a time (:meth:`groups`), and its figures (:meth:`stats`)."""

    def __init__(self, out: str, staging: str, found: change_plan.Changes, before: dict, entry: dict,
                 renamed: dict, new_files: list[str], split: str, task: str) -> None:
        self.out, self.staging, self.found, self.split, self.task = out, staging, found, split, task
        self.before = before
        place = {shard["file"]: position for position, shard in enumerate(entry["shards"])}
        self.live = {shard["file"] for shard in entry["shards"] if "live" in shard}
        # Where each of the latest version's shards went: its place in this version, or its compacted file's.
        self.place = {shard["file"]: place[shard["file"]] for shard in before.get("shards", ())
                      if shard["file"] in place}
        # Where each compacted or merged shard's records went (its shard_moves.Move: file, base, survivors).
        self.compacted = {old: (place[move.file], move) for old, move in renamed.items() if move.file in place}
        self.new_places = [place[name] for name in new_files]
        self.removed = SplitStats(split)
        self.kept_stats = SplitStats(split)
        self.sides: list[int] = []  # the smallest and largest side of the rows written

    def groups(self, new_table: Optional[str]) -> Iterator[pa.Table]:
        """Reused and masked shards' rows, then compacted shards', then the new shards', as the manifest lists
        their shards."""
        if self.before.get("records_table"):
            name = self.before["records_table"]["file"]
            with store_files.open_in(self.out, name) as handle:  # OUT's, on disk or in a store
                table = RecordsTable(handle, store_files.path_in(self.out, name))
                self.kept_stats = table.stats(self.split)
                for group in table.row_groups():
                    yield self._noted(self._reused(group))
                for group in table.row_groups():
                    yield self._noted(self._compacted(group))
        if new_table:
            table = RecordsTable(new_table)
            self.kept_stats.merge(table.stats(self.split))
            for group in table.row_groups():
                shards = np.asarray(self.new_places, np.int64)[group.column("shard").to_numpy()]
                yield self._noted(_with(group, shard=shards))

    def _file(self, group: pa.Table) -> str:
        return self.before["shards"][int(group.column("shard")[0].as_py())]["file"]

    def _reused(self, group: pa.Table) -> pa.Table:
        """The rows of a group the version reads where they are; the rows of records it no longer reads (not
        kept, or not compacted) counted out of the figures."""
        if not group.num_rows:
            return group
        name = self._file(group)
        keep = self._kept(name, group)
        if name not in self.compacted:
            self._count_removed(name, group.filter(pa.array(~keep)))
        if name not in self.place:
            return group.slice(0, 0)
        return _with(group.filter(pa.array(keep)), shard=np.full(int(keep.sum()), self.place[name]))

    def _compacted(self, group: pa.Table) -> pa.Table:
        """The survivors of a compacted shard at their places in its new file, as its record index gives them."""
        name = self._file(group) if group.num_rows else ""
        if name not in self.compacted:
            return group.slice(0, 0)
        keep = self._kept(name, group)
        self._count_removed(name, group.filter(pa.array(~keep)))
        position, move = self.compacted[name]
        kept = group.filter(pa.array(keep))
        places = move.index_of(kept.column("index").to_numpy())
        offsets = np.asarray(self._offsets(move.file), np.uint64)[places]
        return _with(kept, shard=np.full(kept.num_rows, position), index=places, offset=offsets)

    def _kept(self, name: str, group: pa.Table) -> np.ndarray:
        """Which rows of the group (one shard's) the version reads."""
        index = group.column("index").to_numpy()
        if name in self.found.reused:
            return np.ones(len(index), bool)
        return np.isin(index, self.found.survivors.get(name, np.zeros(0, np.int64)))

    def _offsets(self, new_file: str) -> list[int]:
        path = os.path.join(self.staging, new_file.split("/", 2)[2])  # versions/<N>/compacted/... in staging
        with open(idx.index_filename(path), "rb") as handle:
            return [int(line.split()[0]) for line in handle.read().split(b"\n") if line]

    def _noted(self, group: pa.Table) -> pa.Table:
        if group.num_rows:
            widths, heights = group.column("width").to_numpy(), group.column("height").to_numpy()
            self.sides += [int(np.minimum(widths, heights).min()), int(np.maximum(widths, heights).max())]
        return group

    def _count_removed(self, name: str, rows: pa.Table) -> None:
        """Each row's record, read from its shard by its offset (features only), counted into ``removed``."""
        if not rows.num_rows:
            return
        with store_files.open_in(self.out, name) as handle:
            for offset in rows.column("offset").to_numpy():
                handle.seek(int(offset))
                (length,) = struct.unpack("<Q", handle.read(tfrecord.HEADER_BYTES)[:8])
                _count(self.removed, _features(handle.read(length)), self.task)

    def stats(self) -> SplitStats:
        """The version's figures: the latest table's, less what it no longer reads, plus the new shards'."""
        stats = self.kept_stats.finish()
        removed = self.removed.finish()
        stats.images -= removed.images
        for name in _COUNTERS:
            counter = getattr(stats, name)
            counter.subtract(getattr(removed, name))
            setattr(stats, name, +counter)  # drop the classes counted to 0, as a conversion never lists them
        for name in _HISTOGRAMS:
            getattr(stats, name).__isub__(getattr(removed, name))
        stats.min_side = min(self.sides[::2]) if self.sides else None
        stats.max_side = max(self.sides[1::2]) if self.sides else None
        return stats


def _with(group: pa.Table, **columns: np.ndarray) -> pa.Table:
    """``group`` with ``columns`` replaced, each cast to the schema's type (by Arrow: ``to_pandas_dtype`` needs
    pandas, which a plain ``pip install .`` does not have)."""
    for name, values in columns.items():
        field = records_table.SCHEMA.field(name)
        group = group.set_column(group.schema.get_field_index(name), field,
                                 pa.array(np.asarray(values)).cast(field.type))
    return group


def _count(stats: SplitStats, feature: dict, task: str) -> None:
    """One record's features counted as the converter's writer and the report's scan count them."""
    ints = lambda key: feature.get(key, ())  # noqa: E731
    objects = None
    if task == record_schema.TASK_OBJECTS:
        objects = ObjectValues(*(ints(key) for key in (record_schema.OBJECT_LABEL, record_schema.OBJECT_IS_CROWD,
                                                       record_schema.OBJECT_DIFFICULT, record_schema.BBOX_XMIN,
                                                       record_schema.BBOX_YMIN, record_schema.BBOX_XMAX,
                                                       record_schema.BBOX_YMAX)))
        classes = list(objects.labels)
    elif task == record_schema.TASK_SEGMENTATION:
        classes = []
    else:
        classes = list(ints(record_schema.LABEL))
    first = lambda key, default: ints(key)[0] if ints(key) else default  # noqa: E731
    stats.add_image(first(record_schema.WIDTH, 0), first(record_schema.HEIGHT, 0),
                    first(record_schema.IMAGE_ENCODED, 0), first(record_schema.IMAGE_FORMAT, b"?"),
                    first(record_schema.CHANNELS, 0), task, classes, objects)


_WANTED = {key.encode() for key in (
    record_schema.WIDTH, record_schema.HEIGHT, record_schema.IMAGE_ENCODED, record_schema.IMAGE_FORMAT,
    record_schema.CHANNELS, record_schema.LABEL, record_schema.OBJECT_LABEL, record_schema.OBJECT_IS_CROWD,
    record_schema.OBJECT_DIFFICULT, record_schema.BBOX_XMIN, record_schema.BBOX_YMIN, record_schema.BBOX_XMAX,
    record_schema.BBOX_YMAX)}


def _features(data: bytes) -> dict:
    """The features the figures need of a serialized ``tf.train.Example``, read from protobuf's wire format
    (no TensorFlow in the launcher): ints and floats as lists, ``image/encoded`` as its length, other bytes
    as themselves."""
    view, found = memoryview(data), {}
    for _, features in _fields(view):  # Example.features
        for _, entry in _fields(features):  # Features.feature: map entries {1: key, 2: Feature}
            key, value = b"", None
            for number, item in _fields(entry):
                key, value = (bytes(item), value) if number == 1 else (key, item)
            if key in _WANTED and value is not None:
                found[key.decode()] = _values(value, key == record_schema.IMAGE_ENCODED.encode())
    return found


def _values(feature: memoryview, lengths: bool) -> list:
    values: list = []
    for kind, listed in _fields(feature):  # Feature: 1 BytesList, 2 FloatList, 3 Int64List
        for _, item in _fields(listed):
            if kind == 1:
                values.append(len(item) if lengths else bytes(item))
            elif kind == 2:
                raw = bytes(item) if isinstance(item, memoryview) else struct.pack("<f", item)
                values += list(struct.unpack(f"<{len(raw) // 4}f", raw))
            else:
                values += _varints(item) if isinstance(item, memoryview) else [_signed(item)]
    return values


def _fields(view: memoryview) -> Iterator[tuple[int, object]]:
    """``(field number, value)`` of a message: a memoryview for length-delimited fields, an int for varints,
    a float for 32-bit ones (the only fixed width an Example holds)."""
    pos = 0
    while pos < len(view):
        key, pos = _varint(view, pos)
        number, wire = key >> 3, key & 7
        if wire == 2:
            size, pos = _varint(view, pos)
            yield number, view[pos:pos + size]
            pos += size
        elif wire == 0:
            value, pos = _varint(view, pos)
            yield number, value
        elif wire == 5:
            yield number, struct.unpack("<f", view[pos:pos + 4])[0]
            pos += 4
        else:
            raise ValueError(f"not a tf.train.Example: wire type {wire}")


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _varints(view: memoryview) -> list[int]:
    values, pos = [], 0
    while pos < len(view):
        value, pos = _varint(view, pos)
        values.append(_signed(value))
    return values


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
