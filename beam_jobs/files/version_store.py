"""A dataset's versions (``--update``, issue #59): read one, publish one, list them, prune them (on disk).

In:  OUT (a local folder, held under the conversion's lock by the caller; or a prefix in S3 or GCS, unlocked: one
     run at a time is the caller's, as for a conversion) and the layout of :mod:`record_files.versions`.
Out: the latest version's manifest and sources; a new version published by writing its pointer last;
     the files no kept version lists, deleted (local OUT only).

A version's files are written whole into ``versions/<N>/`` before ``versions/latest`` names it, so a run
killed at any moment leaves the latest version whole; a version folder above the pointer is an interrupted
update's and is removed by the next run (:func:`remove_unpublished`). In an object store every read goes
through Beam's ``FileSystems`` (:mod:`beam_jobs.files.store_files`: a store's error names OUT), the version's
files are uploaded beside the shards the pipeline wrote there, and the pointer is one object written last:
the atomic step in S3 and GCS as a rename is on disk (docs/update.md).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Iterable, Iterator, Optional, Sequence

import record_schema
from beam_jobs import faults
from beam_jobs.files import filesystems, store_files
from beam_jobs.files.filesystems import FileSystems, is_local, local_path
from record_files import versions
from record_files.records_table import RecordsTable, TableError
from record_files.versions import SourceRow

logger = logging.getLogger(__name__)


class VersionError(RuntimeError):
    """OUT's versions cannot be read or changed as asked (a message naming the file or the flag)."""


@dataclasses.dataclass(frozen=True)
class Version:
    """One published version: its number and manifest."""

    number: int
    manifest: dict

    def shard_files(self) -> list[str]:
        """Every shard file this version reads, relative to OUT, in manifest order (splits in manifest order)."""
        return [shard["file"] for split in self.manifest["splits"].values() for shard in split["shards"]]

    def files(self) -> set[str]:
        """Every file of OUT this version lists or owns (shards, their indexes, tables), relative to OUT."""
        names = set()
        for split in self.manifest["splits"].values():
            for shard in split["shards"]:
                names.add(shard["file"])
                if shard.get("dali_index"):
                    names.add(shard["dali_index"])
            if split.get("records_table"):
                names.add(split["records_table"]["file"])
        return names


def _local_root(out: str, what: str) -> str:
    if not is_local(out):
        raise VersionError(f"--out {out!r}: {what} a dataset in an object store is not supported yet (local folders "
                           "only)")
    return local_path(out)


def latest_number(out: str) -> int:
    """The latest version's number (1 when OUT has no pointer)."""
    text = store_files.read_in(out, versions.POINTER_FILE)
    if text is None:
        return versions.FIRST_VERSION
    try:
        return versions.parse_pointer(text.decode("utf-8", "replace"),
                                      store_files.path_in(out, versions.POINTER_FILE))
    except ValueError as err:
        raise VersionError(str(err)) from None


def read(out: str, number: int) -> Version:
    """Version ``number``'s manifest."""
    path = store_files.path_in(out, versions.manifest_path(number))
    data = store_files.read_in(out, versions.manifest_path(number))
    if data is None:
        raise VersionError(f"{path} is missing: version {number} of {out} was pruned, or {out} is no "
                           "converted dataset")
    try:
        manifest = json.loads(data)
    except ValueError as err:
        raise VersionError(f"{path} is not valid JSON ({err})") from None
    unknown = versions.unknown_requirements(manifest, path)
    if unknown:  # an update would compose a version from what it cannot read right
        raise VersionError(unknown)
    return Version(number, manifest)


def existing(out: str) -> list[int]:
    """The versions whose manifests OUT holds, oldest first (each up to the pointer's)."""
    latest = latest_number(out)
    found = [versions.FIRST_VERSION] if store_files.exists_in(out, record_schema.MANIFEST_FILE) else []
    for name in store_files.names_in(out, versions.VERSIONS_DIR):
        number = versions.folder_version(name)
        if number is not None and number <= latest and store_files.exists_in(out, versions.manifest_path(number)):
            found.append(number)
    return found


def iter_sources(out: str, version: Version) -> Iterator[SourceRow]:
    """The rows of :func:`sources_of` in path order, streamed from the sources table a row group at a time (for a
    version 1 converted before conversions wrote one, gathered from its records tables and sorted: its first
    update only)."""
    table = version.manifest.get("sources_table")
    if not table:
        yield from sorted(sources_of(out, version), key=lambda row: row.path)
        return
    try:
        with store_files.open_in(out, table["file"]) as handle:
            yield from versions.iter_sources(handle, store_files.path_in(out, table["file"]))
    except ValueError as err:
        raise VersionError(str(err)) from None


def sources_of(out: str, version: Version) -> list[SourceRow]:
    """Every image version ``version`` accounts for: its sources table, or for a version 1 that has none
    (converted before conversions wrote one) its records tables and ``rejected.jsonl``, unstamped (the update
    then compares by content)."""
    table = version.manifest.get("sources_table")
    if table:
        path, data = store_files.path_in(out, table["file"]), store_files.read_in(out, table["file"])
        if data is None:
            raise VersionError(f"{path} is missing: version {version.number} of {out} lists it")
        try:
            return versions.read_sources(data, path)
        except ValueError as err:
            raise VersionError(str(err)) from None
    rows = []
    for split, entry in version.manifest["splits"].items():
        if not entry.get("records_table"):
            raise VersionError(
                f"{out} was converted before records tables (#56): its split {split!r} has none, so --update cannot "
                "tell its images apart without reading every shard; convert it again once with --overwrite")
        files = [shard["file"] for shard in entry["shards"]]
        try:
            with store_files.open_in(out, entry["records_table"]["file"]) as handle:
                records = RecordsTable(handle, store_files.path_in(out, entry["records_table"]["file"]))
                for group in records.row_groups(("shard", "index", "sha256", "path", "classes")):
                    columns = group.to_pydict()
                    rows.extend(SourceRow(path, split, files[shard], index, versions.UNKNOWN, versions.UNKNOWN,
                                          sha.hex(), label=record_label(classes))
                                for shard, index, sha, path, classes in zip(columns["shard"], columns["index"],
                                                                            columns["sha256"], columns["path"],
                                                                            columns["classes"]))
        except (TableError, OSError) as err:
            raise VersionError(f"{out}: the records table of split {split!r} cannot be read ({err})") from None
    rejected = store_files.read_in(out, version.manifest.get("rejected_file", record_schema.REJECTED_FILE)) \
        if version.number == versions.FIRST_VERSION else None
    for line in (rejected or b"").decode("utf-8").split("\n"):
        if line.strip():
            item = json.loads(line)
            if "annotation" not in item:  # an image's rejection, not an object's
                rows.append(SourceRow(item["path"], "", "", -1, versions.UNKNOWN, versions.UNKNOWN, ""))
    return rows


def record_label(classes: Sequence[int]) -> int:
    """A records table's ``classes`` cell as a sources row's ``label``: its one class id, or a multi-label
    record's ids' key (:func:`record_files.versions.label_key`)."""
    return versions.label_key(classes)


def remove_unpublished(out: str) -> None:
    """Remove version folders above the pointer: an update killed before its pointer was written left them (in
    a store: every object under such a folder, the shards its pipeline wrote and the files it uploaded)."""
    latest = latest_number(out)
    above = sorted(number for number in map(versions.folder_version, store_files.names_in(out, versions.VERSIONS_DIR))
                   if number is not None and number > latest)
    # Only the one version after the pointer can be a killed update's. More means the pointer is not the one the
    # last update wrote (lost, or a copy of OUT cut short: a store's `sync` copies versions/latest after the
    # folders): deleting them would erase published versions, so refuse instead.
    if above and above != [latest + 1]:
        says = ("is missing (version 1)" if store_files.read_in(out, versions.POINTER_FILE) is None
                else f"says version {latest}")
        raise VersionError(
            f"--out {out!r}: the pointer {versions.POINTER_FILE} {says}, but versions "
            f"{', '.join(map(str, above))} are there, and only version {latest + 1} can be an interrupted update's: "
            f"nothing was removed. If OUT was copied in part, copy it again; if the pointer was lost, write the "
            f"number of the highest version whose folder holds a manifest.json into "
            f"{store_files.path_in(out, versions.POINTER_FILE)}")
    for number in above:
        logger.warning("removing %s: an interrupted update's version %d, never published",
                       versions.version_dir(number), number)
        with store_files.reading(out):
            filesystems.remove_folder(store_files.path_in(out, versions.version_dir(number)))


def publish(staging: str, out: str, number: int, manifest: dict, sources: Optional[bytes] = None) -> None:
    """Make ``staging`` version ``number`` of OUT: its files into ``versions/<N>/``, then the pointer, last.
    ``sources``: the sources table's bytes, or None when staging holds it already (written as a stream).
    ``staging`` is on the launcher's disk whatever OUT is; for OUT in a store see :func:`_publish_remote`."""
    if sources is not None:
        _write_whole(os.path.join(staging, versions.SOURCES_TABLE), sources)
    else:
        _fsync_file(os.path.join(staging, versions.SOURCES_TABLE))
    _write_whole(os.path.join(staging, record_schema.MANIFEST_FILE),
                 (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    if not is_local(out):
        _publish_remote(staging, out, number, manifest)
        return
    target = os.path.join(local_path(out), versions.version_dir(number))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.exists(target):  # an interrupted update's, never published (the caller holds the lock)
        shutil.rmtree(target)
    os.rename(staging, target)
    _fsync_folder(os.path.dirname(target))
    faults.point("version-moved")  # whole in versions/<N>, unpublished: the next run removes it, and redoes it
    write_pointer(out, number)


def _publish_remote(staging: str, out: str, number: int, manifest: dict) -> None:
    """OUT in a store: staging's files uploaded into ``versions/<N>/``, beside the new shards the pipeline wrote
    there; what else the pipeline left there deleted (its work folder, the conversion's own tables and lists, which
    the version's replace), so the folder holds what a local publish renames; then the pointer, one object
    written last. Killed before the pointer: version N-1 stays the latest, and the next run removes the folder
    (:func:`remove_unpublished`)."""
    folder = store_files.path_in(out, versions.version_dir(number))
    names = store_files.list_files(staging)
    prefix = versions.version_dir(number) + "/"
    keep = set(names) | {name[len(prefix):] for name in Version(number, manifest).files() if name.startswith(prefix)}
    with store_files.reading(out):
        for name in names:
            store_files.upload(os.path.join(staging, name), f"{folder}/{name}")
        stale = [f"{folder}/{name}" for name in store_files.list_files(folder) if name not in keep]
        if stale:
            FileSystems.delete(stale)
        shutil.rmtree(staging, ignore_errors=True)  # uploaded: a kill from here leaves nothing on the launcher's disk
        faults.point("version-moved")  # whole in versions/<N>, unpublished: the next run removes it, and redoes it
        write_pointer(out, number)


def write_pointer(out: str, number: int) -> None:
    """``versions/latest`` := ``number``, atomically: a temporary file renamed over it (in a store: one object
    written whole, which readers see whole or not at all)."""
    if not is_local(out):
        with store_files.reading(out):
            filesystems.write_text(store_files.path_in(out, versions.POINTER_FILE), versions.pointer_text(number))
        return
    pointer = os.path.join(local_path(out), versions.POINTER_FILE)
    _write_whole(pointer + ".tmp", versions.pointer_text(number).encode("ascii"))
    os.replace(pointer + ".tmp", pointer)
    _fsync_folder(os.path.dirname(pointer))


def _write_whole(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_file(path: str) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class Pruned:
    """What :func:`prune` removed: the versions, and the files (relative to OUT) with their bytes."""

    versions: tuple[int, ...]
    files: tuple[str, ...]
    num_bytes: int


def prune(out: str, keep: int) -> Pruned:
    """Delete the versions older than the ``keep`` latest, and every file that no kept version lists.

    Version 1's own files (its manifest, labels, reports) go with it when it is pruned; files that are no
    version's (a user's, a report) are never touched.
    """
    if keep < 1:
        raise VersionError(f"--keep {keep}: keep at least the latest version (1)")
    root = _local_root(out, "pruning the versions of")
    numbers = existing(out)
    if not numbers:
        raise VersionError(f"{out} holds no converted dataset (no {record_schema.MANIFEST_FILE}, no versions)")
    kept, dropped = numbers[-keep:], numbers[:-keep]
    if not dropped:
        return Pruned((), (), 0)
    needed: set[str] = set()
    for number in kept:
        needed |= read(out, number).files()
    doomed: set[str] = set()
    for number in dropped:
        doomed |= {name for name in read(out, number).files() if name not in needed}
    if versions.FIRST_VERSION in dropped:
        doomed |= {name for name in _first_version_own_files(root) if name not in needed}
    num_bytes = sum(os.path.getsize(os.path.join(root, name)) for name in doomed
                    if os.path.exists(os.path.join(root, name)))
    # The manifests go first: a version is gone before any of its shards is, never half there.
    for number in dropped:
        path = os.path.join(root, versions.manifest_path(number))
        if os.path.exists(path):
            os.remove(path)
    for name in sorted(doomed):
        path = os.path.join(root, name)
        if os.path.exists(path):
            os.remove(path)
    for number in [*dropped, *_pruned_before(root, numbers)]:
        num_bytes += _sweep(root, versions.version_dir(number), needed)
    return Pruned(tuple(dropped), tuple(sorted(doomed)), num_bytes)


def _sweep(root: str, folder: str, needed: set[str]) -> int:
    """Delete a dropped version's own files (sources table, labels, reports, its compacted shards) that no kept
    version reads, then its folders left empty, deepest first; returns the bytes freed."""
    if not folder or not os.path.isdir(os.path.join(root, folder)):
        return 0
    freed = 0
    for parent, _, names in os.walk(os.path.join(root, folder), topdown=False):
        for name in names:
            path = os.path.join(parent, name)
            if os.path.relpath(path, root).replace(os.sep, "/") not in needed:
                freed += os.path.getsize(path)
                os.remove(path)
        if not os.listdir(parent):
            os.rmdir(parent)
    return freed


def _pruned_before(root: str, numbers: Sequence[int]) -> list[int]:
    """Version folders up to the latest version whose manifest is gone: what a prune that was stopped left (it
    removes a version's manifest first). Folders past the pointer are an update's still to publish: kept."""
    folder = os.path.join(root, versions.VERSIONS_DIR)
    latest = max(numbers) if numbers else 0
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        number = versions.folder_version(name)
        if number is not None and number < latest and number not in numbers:
            found.append(number)
    return found


def _first_version_own_files(root: str) -> Iterable[str]:
    """Version 1's files besides its shards: what a conversion writes at OUT's top (its manifest already gone)."""
    names = {record_schema.LABELS_FILE, record_schema.LABEL_MAP_FILE, record_schema.REJECTED_FILE,
             record_schema.SKIPPED_FILE, record_schema.DUPLICATES_FILE, record_schema.DROPPED_FILE, "croissant.json",
             versions.SOURCES_TABLE,
             *record_schema.TFDS_METADATA_FILES, *record_schema.REPORT_FILES}
    return [name for name in names if os.path.isfile(os.path.join(root, name))]


def live_files(out: str) -> Optional[set[str]]:
    """The files the latest version reads (None when OUT has no version)."""
    numbers = existing(out)
    return read(out, numbers[-1]).files() if numbers else None
