"""The records table: per split, one small Parquet file of every record's place, classes, size and hashes.

File: ``OUT/<split>.records.parquet`` (:func:`record_schema.records_table_filename`), written once by the
converter (each shard writer writes its shard's rows, :mod:`beam_jobs.stages.join_tables` joins them per
split), published with the shards and listed in the manifest's split entry (``records_table``: file, rows,
bytes, SHA-256). One row a record, in record order (shard, then place in the shard):

=================  ====================  ==========================================================================
column             type                  value
=================  ====================  ==========================================================================
``shard``          uint32                the shard's index in the split (``<split>-SSSSS-of-NNNNN.tfrecord``)
``index``          uint32                the record's place in its shard, from 0
``offset``         uint64                where its frame starts in the shard (as its ``.idx`` line says)
``classes``        list<int32>           its ``image/class/label`` (one id; a multi-label record's ids), or each
                                         object's ``image/object/class/label`` in order; none for segmentation
``width``          uint32                ``image/width``
``height``         uint32                ``image/height``
``image_bytes``    uint32                the length of ``image/encoded``
``sha256``         fixed_size_binary(32) ``image/key/sha256`` as its 32 bytes
``perceptual_hash`` uint64, nullable     the stored pixels' 64-bit DCT hash (null: converted with
                                         ``--no-near-duplicates``)
``path``           string                ``image/filename``
=================  ====================  ==========================================================================

Its footer's key-value metadata: ``imgshards.records_table`` (:data:`VERSION`), ``imgshards.split``, and
``imgshards.stats``, the split's figures (:class:`record_files.record_stats.SplitStats` as JSON, summed from
its shards'), which the report draws without reading a row.

Why Parquet: any tool reads it (pyarrow, pandas, DuckDB, Spark) without Beam or TensorFlow, columnar (repeat
factors read ``classes`` alone: N small integers, not the shards), and in row groups of at most
:data:`ROW_GROUP` rows that never span two shards, so a reader streams it with one row group in memory. Written
deterministically: zstd, delta-coded ``index`` and ``offset``, the same schema and row groups every run, so the
same rows give the same bytes on every runner (the footer names pyarrow's version, as the file format asks: a
pyarrow of another version may write other bytes for the same rows). About 60 bytes a record (the two hashes
are 40 of them): 60 MB for 1M records, against the shards' 100 GB of photos.

Imports pyarrow and numpy only (``apache-beam`` brings pyarrow, and ``pip install .`` lists it): both sides
import this module, the converter to write and the reader to read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import BinaryIO, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from record_files.record_stats import SplitStats

VERSION = 1
ROW_GROUP = 65536  # rows a row group holds at most: about 4 MB, what a reader holds at once
VERSION_KEY, SPLIT_KEY, STATS_KEY = b"imgshards.records_table", b"imgshards.split", b"imgshards.stats"

SCHEMA = pa.schema([
    pa.field("shard", pa.uint32(), nullable=False),
    pa.field("index", pa.uint32(), nullable=False),
    pa.field("offset", pa.uint64(), nullable=False),
    pa.field("classes", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
    pa.field("width", pa.uint32(), nullable=False),
    pa.field("height", pa.uint32(), nullable=False),
    pa.field("image_bytes", pa.uint32(), nullable=False),
    pa.field("sha256", pa.binary(32), nullable=False),
    pa.field("perceptual_hash", pa.uint64(), nullable=True),
    pa.field("path", pa.string(), nullable=False),
])
COLUMNS = tuple(SCHEMA.names)
_DELTA = ("index", "offset")  # consecutive within a shard: delta-coded to a few bits a row
_WRITE_OPTIONS = {"compression": "zstd", "use_dictionary": [name for name in COLUMNS if name not in _DELTA],
                  "column_encoding": {name: "DELTA_BINARY_PACKED" for name in _DELTA}, "write_statistics": True}


class TableError(ValueError):
    """A records table that is not one, of another version, or not the file its manifest lists."""


@dataclasses.dataclass(frozen=True)
class TableFile:
    """A written table: its rows, size and SHA-256 (what the manifest lists)."""

    num_rows: int
    num_bytes: int
    sha256: str


class _Sink:
    """The file object pyarrow writes to: passes bytes on to ``handle``, counting and hashing them.

    ``handle`` only needs ``write`` (a Beam file system's, or a local file); it is not closed here.
    """

    def __init__(self, handle) -> None:
        self._handle, self._digest, self._size, self.closed = handle, hashlib.sha256(), 0, False

    def write(self, data) -> int:
        data = bytes(data)
        self._handle.write(data)
        self._digest.update(data)
        self._size += len(data)
        return len(data)

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def written(self, rows: int) -> TableFile:
        return TableFile(rows, self._size, self._digest.hexdigest())


def _metadata(split: str, stats: SplitStats) -> dict[bytes, bytes]:
    return {VERSION_KEY: str(VERSION).encode(), SPLIT_KEY: split.encode("utf-8"),
            STATS_KEY: json.dumps(stats.to_json(), sort_keys=True, separators=(",", ":")).encode("utf-8")}


class TableWriter:
    """A shard's rows, added in record order, streamed to ``handle`` as Parquet a row group at a time.

    Memory: one row group's rows (:data:`ROW_GROUP`), whatever the shard's size.
    """

    def __init__(self, handle, shard: int) -> None:
        self._sink = _Sink(handle)
        self._writer = pq.ParquetWriter(self._sink, SCHEMA, **_WRITE_OPTIONS)
        self._shard, self._rows = shard, 0
        self._columns: dict[str, list] = {name: [] for name in COLUMNS}

    def add(self, index: int, offset: int, classes: Sequence[int], width: int, height: int, image_bytes: int,
            sha256: bytes, perceptual_hash: Optional[int], path: str) -> None:
        """One record: its place in the shard, its class ids, stored size, image bytes, hashes and file name."""
        columns = self._columns
        for name, value in (("shard", self._shard), ("index", index), ("offset", offset), ("classes", classes),
                            ("width", width), ("height", height), ("image_bytes", image_bytes),
                            ("sha256", sha256), ("perceptual_hash", perceptual_hash), ("path", path)):
            columns[name].append(value)
        if len(columns["index"]) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        count = len(self._columns["index"])
        if count:
            self._writer.write_table(pa.table(self._columns, schema=SCHEMA), row_group_size=ROW_GROUP)
            self._rows += count
            self._columns = {name: [] for name in COLUMNS}

    def close(self, split: str, stats: SplitStats) -> TableFile:
        """The last rows and the footer (``stats``: the shard's figures); what was written."""
        self._flush()
        self._writer.add_key_value_metadata(_metadata(split, stats))
        self._writer.close()
        return self._sink.written(self._rows)


def join_tables(parts: Iterable[BinaryIO], handle, split: str) -> TableFile:
    """Shard tables, in shard order (each a file object open for reading), as one split table into ``handle``.

    Row groups are copied one at a time, as they are (so never two shards' in one); the footer's figures are
    the parts' summed. Memory: one row group and the figures.

    Raises:
      TableError: a part is not a records table of this version.
    """
    sink = _Sink(handle)
    writer = pq.ParquetWriter(sink, SCHEMA, **_WRITE_OPTIONS)
    stats, rows = SplitStats(split), 0
    for part in parts:
        table = RecordsTable(part)
        stats.merge(table.stats(split))
        for group in range(table.num_row_groups):
            batch = table.row_group(group)
            writer.write_table(batch, row_group_size=ROW_GROUP)
            rows += batch.num_rows
    writer.add_key_value_metadata(_metadata(split, stats))
    writer.close()
    return sink.written(rows)


def write_groups(groups: Iterable[pa.Table], handle, split: str, stats: Callable[[], SplitStats]) -> TableFile:
    """Row groups of this schema, each one shard's rows in record order, as a split table into ``handle``, its
    footer's figures what ``stats()`` gives once the last group is written. Each group is written as it comes
    (an empty one is skipped): the same groups give the same bytes. Memory: one group. (An update composes a version's table so: ``beam_jobs.update.tables``.)"""
    sink = _Sink(handle)
    writer = pq.ParquetWriter(sink, SCHEMA, **_WRITE_OPTIONS)
    rows = 0
    for group in groups:
        if group.num_rows:
            writer.write_table(group, row_group_size=ROW_GROUP)
            rows += group.num_rows
    writer.add_key_value_metadata(_metadata(split, stats()))
    writer.close()
    return sink.written(rows)


class RecordsTable:
    """A records table open for reading: its figures from the footer, its rows a row group at a time.

    ``source``: a local path or a file object open for reading (seekable: Parquet's footer is at its end).
    ``name`` names it in errors.

    Raises:
      TableError: not a Parquet file, or not a records table of this version.
    """

    def __init__(self, source, name: str = "") -> None:
        self.name = name or (source if isinstance(source, str) else getattr(source, "name", "records table"))
        try:
            self._file = pq.ParquetFile(source)
        except (pa.ArrowException, OSError) as err:
            raise TableError(f"{self.name} is not a records table: {err}") from None
        self._meta = self._file.metadata.metadata or {}
        version = self._meta.get(VERSION_KEY)
        if version != str(VERSION).encode():
            raise TableError(f"{self.name} is not a version-{VERSION} records table (found version "
                             f"{(version or b'none').decode('ascii', 'replace')})")
        if not self._file.schema_arrow.equals(SCHEMA):
            raise TableError(f"{self.name} does not have the records table's columns")

    @property
    def num_rows(self) -> int:
        return self._file.metadata.num_rows

    @property
    def num_row_groups(self) -> int:
        return self._file.num_row_groups

    def stats(self, split: str) -> SplitStats:
        """The split's figures the converter summed (:class:`record_files.record_stats.SplitStats`)."""
        try:
            return SplitStats.from_json(split, json.loads(self._meta[STATS_KEY]))
        except (KeyError, ValueError) as err:
            raise TableError(f"{self.name}: its footer has no figures of a split ({err})") from None

    def row_group(self, group: int, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """Row group ``group`` (``columns`` of it: all by default)."""
        return self._file.read_row_group(group, columns=list(columns) if columns else None)

    def row_groups(self, columns: Optional[Sequence[str]] = None) -> Iterator[pa.Table]:
        """Every row group in order, one in memory at a time."""
        for group in range(self.num_row_groups):
            yield self.row_group(group, columns)

    def class_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """Every record's class ids as flat ``values`` (int32) and row ``starts`` (int64, N + 1 of them):
        record i's are ``values[starts[i]:starts[i + 1]]``. N small integers and a few per object, never
        the shards' bytes: what repeat factors need."""
        column = self._file.read(columns=["classes"]).column("classes").combine_chunks()
        if column.offset:  # a sliced array's offsets start past 0: rebase them
            column = pa.concat_arrays([column])
        starts = column.offsets.to_numpy().astype(np.int64)
        values = column.values.to_numpy(zero_copy_only=False).astype(np.int32)
        return values[starts[0]:starts[-1]], starts - starts[0]
