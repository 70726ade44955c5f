"""The version layout of a dataset that grows (``--update``, issue #59): names, the pointer, the sources table.

Both sides import it: the converter writes versions (:mod:`beam_jobs.update`), the reader opens one
(:func:`reader.info.dataset_info`). No TensorFlow, no Beam, no file system of its own: each side reads and
writes the bytes with its own (local, ``gs://``, ``s3://``).

Version 1 is the dataset folder as a conversion wrote it (``OUT/manifest.json``). Version N > 1 lives in
``OUT/versions/<N:05d>/``: its manifest, its sources table, the shards it wrote. ``OUT/versions/latest``
holds the latest version's number, written last: the one atomic step that publishes a version. No pointer:
the latest version is 1. A shard ``file`` in any version's manifest is relative to OUT. (docs/format.md,
"Versions".)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator, Optional, Sequence

import record_schema

if TYPE_CHECKING:
    import pyarrow as pa

FIRST_VERSION = 1
VERSIONS_DIR = "versions"
POINTER_FILE = f"{VERSIONS_DIR}/latest"
SOURCES_TABLE = "sources.parquet"
# What a row's size and modification time hold when the version did not record them (version 1).
UNKNOWN = -1
NO_ANNOTATION = 0  # a sources row's annotation digest when it has none (one label an image) or recorded none


def version_dir(version: int) -> str:
    """The folder, relative to OUT, that holds version ``version``'s own files ("" for version 1: OUT itself)."""
    _check(version)
    return "" if version == FIRST_VERSION else f"{VERSIONS_DIR}/{version:05d}"


def in_version(version: int, name: str) -> str:
    """``name`` (a file of version ``version``'s own) relative to OUT."""
    folder = version_dir(version)
    return f"{folder}/{name}" if folder else name


def manifest_path(version: int) -> str:
    """Version ``version``'s manifest, relative to OUT."""
    return in_version(version, record_schema.MANIFEST_FILE)


def pointer_text(version: int) -> str:
    """The pointer's body: the version's number and a newline."""
    _check(version)
    return f"{version}\n"


def parse_pointer(text: str, where: str) -> int:
    """The version a pointer's body names; ValueError naming ``where`` when it names none."""
    try:
        version = int(text.strip())
    except ValueError:
        version = 0
    if version <= FIRST_VERSION:
        raise ValueError(f"{where} should hold the latest version's number (2 or more), holds {text[:40]!r}: "
                         "the version pointer is damaged; write the number of the newest complete "
                         f"{VERSIONS_DIR}/<N>/manifest.json into it")
    return version


def folder_version(name: str) -> Optional[int]:
    """The version a ``versions/`` entry's name is the folder of (``00002`` -> 2), or None."""
    return int(name) if len(name) >= 5 and name.isdigit() and int(name) > FIRST_VERSION else None


def label_key(ids: "tuple[int, ...] | list[int]") -> int:
    """A record's class ids as the sources table's ``label``: its one id, or, for none or several (a multi-label
    record), a negative digest of the sorted ids below UNKNOWN (62 bits of BLAKE2b: equal sets, equal keys)."""
    if len(ids) == 1:
        return int(ids[0])
    text = ",".join(str(int(i)) for i in sorted(ids)).encode("ascii")
    return -2 - (int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 2)


# What a manifest may list under "requires": the features a reader must know to read the version right. "live":
# shard entries carry masks (docs/update.md), runs of a file's records the version reads. A reader refuses a version
# that requires one it does not know, rather than read it wrong (deleted records back, say).
LIVE = "live"
KNOWN_REQUIREMENTS: frozenset[str] = frozenset({LIVE})


def unknown_requirements(manifest: dict, where: str) -> Optional[str]:
    """Why a reader of this release cannot read the manifest at ``where``: the features it ``requires`` that this
    release does not know, named; None when it knows them all (or the manifest requires none)."""
    required = manifest.get("requires") or []
    unknown = sorted(str(name) for name in required if name not in KNOWN_REQUIREMENTS)
    if not unknown:
        return None
    return (f"{where} requires {', '.join(unknown)}, which this release does not know: it was written by a newer "
            "converter; install a release that reads it (pip install -U), or read an older version of the dataset")


def live_runs(indices: Sequence[int]) -> list[list[int]]:
    """Ascending record indices as ``[first, count]`` runs of consecutive records: a mask's ``live``."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1][1] += 1
        else:
            runs.append([int(index), 1])
    return runs


def live_problem(manifest: dict, where: str) -> Optional[str]:
    """What is wrong with the masks of the manifest at ``where`` (None: nothing, or it has none): a shard entry's
    ``live`` must be ``[first, count]`` runs, ascending, disjoint, within its ``file_records``, counting its
    ``num_examples``; and a manifest with masks must require ``live``, so that no reader unaware of masks reads
    the records they hide (one without the requirement was written wrong: refused, not guessed at)."""
    masked = False
    for name, split in (manifest.get("splits") or {}).items():
        for shard in split.get("shards", ()):
            if "live" not in shard:
                continue
            masked = True
            problem = _runs_problem(shard["live"], shard.get("file_records"), shard.get("num_examples"))
            if problem:
                return f"{where}: split {name!r} shard {shard.get('file')!r}: its live runs {problem}"
    if masked and LIVE not in (manifest.get("requires") or []):
        return (f"{where} masks records (shard entries with 'live') but does not list requires: ['live']: an older "
                "reader would read the records it deletes; the manifest was not written by the converter")
    return None


def _runs_problem(runs, file_records, num_examples) -> Optional[str]:
    if not isinstance(file_records, int) or not isinstance(runs, list):
        return "need a list of runs and the file's record count (file_records)"
    end, total = 0, 0
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and all(isinstance(v, int) for v in run)):
            return f"hold {run!r}, not [first, count]"
        first, count = run
        if first < end or count < 1 or first + count > file_records:
            return f"are not ascending, disjoint and within the file's {file_records} records at {run}"
        end, total = first + count, total + count
    return None if total == num_examples else f"count {total} records, not its num_examples {num_examples}"


def digest(value: object) -> str:
    """12 hex digits of ``value``'s JSON (keys sorted): the fingerprints' hash."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def manifest_content(manifest: dict) -> dict:
    """What a reader reads, from a manifest, and only that (:attr:`reader.DatasetInfo.fingerprint` hashes it): the
    record format, the classes and their text, and per split its counts and each shard's file name, record count,
    size and SHA-256. Here, without TensorFlow, so that listing versions (``python -m converter versions``)
    loads none."""
    return {
        "format_version": manifest.get("format_version"),
        "features": manifest.get("features"),
        "classes": manifest.get("classes"),
        "class_text": manifest.get("class_text", manifest.get("classes")),
        "splits": {name: {"num_examples": split.get("num_examples"),
                          "label_counts": split.get("label_counts"),
                          "shards": [(s["file"], s["num_examples"], s["num_bytes"], s["sha256"])
                                     + ((s["live"],) if "live" in s else ())  # a mask: the records read
                                     for s in split.get("shards", ())]}
                   for name, split in sorted(manifest.get("splits", {}).items())},
    }


def named(data_dir: str, version: int, latest: int) -> str:
    """How a tool's output names the version it describes: ``data_dir`` alone for a dataset that never grew,
    else ``data_dir (version N of L)`` (``L`` the latest), so two versions' outputs are never mistaken."""
    return data_dir if latest == FIRST_VERSION else f"{data_dir} (version {version} of {latest})"


def missing_version(version: object, existing: list[int], data_dir: str) -> str:
    """Why ``version`` of ``data_dir`` cannot be read, naming it and the versions there are (``existing``, oldest
    first: pruned ones are not): the message of every caller that takes a version (the reader's ``version=``,
    the dataset commands' ``--version``)."""
    if not existing:
        there = "no version at all (it holds no converted dataset)"
    elif existing == list(range(existing[0], existing[-1] + 1)) and len(existing) > 2:
        there = f"versions {existing[0]} to {existing[-1]}"
    else:
        there = ("version " if len(existing) == 1 else "versions ") + ", ".join(map(str, existing))
    pruned = " (older versions were pruned)" if existing and existing[0] > FIRST_VERSION else ""
    return (f"version {version!r} of {data_dir} does not exist: it has {there}{pruned} "
            "(python -m converter versions lists them)")


def _check(version: int) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < FIRST_VERSION:
        raise ValueError(f"version must be an integer from {FIRST_VERSION}, got {version!r}")


@dataclasses.dataclass(frozen=True)
class SourceRow:
    """One image of SRC a version accounts for: where its record is, and its file's stamp when it was read.

    ``file``: the shard holding its record, relative to OUT ("" for a rejected image); ``index``: the
    record's place in it (-1 for a rejected one); ``size``, ``mtime_ns``: its source file's (UNKNOWN when
    not recorded); ``sha256``: the stored image's hex SHA-256 (``image/key/sha256``; "" for a rejected one);
    ``source_sha256``: the source file's hex SHA-256 as the version read it ("" when not recorded: version 1,
    tables written before the column). ``--update --rehash`` compares a file with it: a re-encoded image's
    stored bytes are not its source's. ``label``: the class id its record holds, or for a multi-label record
    its ids' :func:`label_key` (UNKNOWN for a rejected image, and in tables written before the column): an image
    a label file labels otherwise now is a changed image, though its bytes are the same (ids are stable across
    versions, so an id compares as its name would). ``annotation``: an object image's annotation digest
    (:data:`NO_ANNOTATION` for none, and in tables written before the column): 63 bits of BLAKE2b of its
    objects as SRC gives them, ids the version's: an image whose boxes changed is a changed image.
    """

    path: str
    split: str
    file: str
    index: int
    size: int
    mtime_ns: int
    sha256: str
    source_sha256: str = ""
    label: int = UNKNOWN
    annotation: int = NO_ANNOTATION

    @property
    def stamped(self) -> bool:
        return self.size != UNKNOWN and self.mtime_ns != UNKNOWN


# pyarrow is imported by the functions that read or write a sources table only: the layout's names are read by
# commands that should start fast (``card``, ``--version``), and pyarrow takes half a second to import.
_COLUMNS = ("path", "split", "file", "index", "size", "mtime_ns", "sha256", "source_sha256", "label", "annotation")


@functools.cache
def _schema() -> "pa.Schema":
    import pyarrow as pa

    types = {"index": pa.int64(), "size": pa.int64(), "mtime_ns": pa.int64(), "label": pa.int64(),
             "annotation": pa.int64()}
    return pa.schema([(name, types.get(name, pa.string())) for name in _COLUMNS])


# The columns of tables written before ``source_sha256``, ``label`` and ``annotation`` (still read: the missing
# columns then read as their defaults, "", UNKNOWN and NO_ANNOTATION).
_READABLE = tuple(list(_COLUMNS[:len(_COLUMNS) - less]) for less in range(4))


def sources_bytes(rows: Iterable[SourceRow]) -> bytes:
    """The sources table's bytes: the rows sorted by path (so the same rows give the same bytes), zstd."""
    import pyarrow.parquet as pq

    table = _table(sorted(rows, key=lambda row: row.path))
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", row_group_size=_ROW_GROUP)
    return sink.getvalue()


# Rows a row group of the sources table holds: what write_sources and iter_sources hold in memory at once (about
# 700 bytes a row as Python objects: 11 MB).
_ROW_GROUP = 16384


def write_sources(path: str, rows: Iterable[SourceRow]) -> None:
    """Write the sources table of ``rows``, given sorted by path, a row group at a time: the bytes
    :func:`sources_bytes` gives for the same rows, in memory flat in their number.

    Raises ValueError naming the first row out of order (the table is sorted so the same rows give the same
    bytes, and an update merge-joins it with SRC's listing)."""
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, _schema(), compression="zstd") as writer:
        batch: list[SourceRow] = []
        last = None
        for row in rows:
            if last is not None and row.path <= last:
                raise ValueError(f"{path}: sources rows out of order ({row.path!r} after {last!r})")
            last = row.path
            batch.append(row)
            if len(batch) == _ROW_GROUP:
                writer.write_table(_table(batch), row_group_size=_ROW_GROUP)
                batch = []
        if batch or last is None:
            writer.write_table(_table(batch), row_group_size=_ROW_GROUP)


def _table(rows: list[SourceRow]) -> "pa.Table":
    import pyarrow as pa

    return pa.Table.from_pydict({name: [getattr(row, name) for row in rows] for name in _COLUMNS}, schema=_schema())


def iter_sources(source: "str | BinaryIO", where: str = "") -> Iterator[SourceRow]:
    """The rows of the sources table at ``source`` (a path, or a seekable file object such as a store's, named by
    ``where``), in its order (by path), a row group at a time; ValueError naming it when it is not one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = where or source
    try:
        table = pq.ParquetFile(source)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{path} is not a sources table ({err})") from err
    names = table.schema_arrow.names
    if names not in _READABLE:
        raise ValueError(f"{path} has the columns {names}, not a sources table's {list(_COLUMNS)}")
    for group in range(table.num_row_groups):
        columns = table.read_row_group(group).to_pydict()
        yield from (SourceRow(*values) for values in zip(*(columns[name] for name in names)))


def read_sources(data: bytes, where: str) -> list[SourceRow]:
    """The rows of a sources table's bytes; ValueError naming ``where`` when they are not one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{where} is not a sources table ({err})") from err
    if table.schema.names not in _READABLE:
        raise ValueError(f"{where} has the columns {table.schema.names}, not a sources table's {list(_COLUMNS)}")
    columns = table.to_pydict()
    return [SourceRow(*values) for values in zip(*(columns[name] for name in table.schema.names))]
