"""Version 1's sources table: a conversion writes an update's table, so the first update compares as later ones do.

In:  SRC's plan (each image's relative path, and an object image's annotation as SRC gives it), the manifest the
     pipeline's outcome built (its classes, each split's shards and records table, in staging), staging's
     ``rejected.jsonl``, and the time the run started.
Out: ``sources.parquet`` in staging (:func:`record_files.versions.write_sources`; published with the rest of the
     dataset or not at all) and the manifest's ``sources_table`` entry, as an update's.

Each row is what an update records of an image (:class:`record_files.versions.SourceRow`): its record's place and
stored SHA-256 and class ids (the records table's, as :func:`beam_jobs.files.version_store.sources_of` read them
before), an object image's annotation digest (:func:`beam_jobs.planning.stable_ids.stable_ref`, the update's own
function, ids the version's), and its file's size and modification time, stat'ed here (no byte read). A stamp
is recorded only for a file whose ctime is older than the run's start: one changed during the run may hold
other bytes than its record, so its row is left unstamped and the next update compares its bytes. The source
SHA-256 is left "" (a re-encoded image's is kept in the work files only): ``--update --rehash`` then compares a
pass-through image by its stored SHA-256 and converts a re-encoded one again, once, as against older versions 1.

Memory: flat in N beyond the plan the launcher holds already: the rows are sorted by path on local disk
(:class:`beam_jobs.files.external_sort.ExternalSort`) and written a row group at a time. Deterministic: the same
SRC (its files untouched during the runs) gives the same rows, so the same bytes on every runner.
(docs/update.md, "Version 1's sources table".)
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import tempfile

import record_schema
from beam_jobs.files import external_sort, filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.planning import stable_ids
from beam_jobs.planning.discover import InputPlan, display_path
from beam_jobs.sources.source_stamps import SourceStamps
from record_files import versions
from record_files.records_table import RecordsTable
from record_files.versions import NO_ANNOTATION, UNKNOWN, SourceRow

# What an entry of the sort is, after its path and a NUL: the plan's (stamp, digest) sorts first, then the record's
# row or the rejection.
_PLANNED, _RECORD, _REJECTED = b"0", b"1", b"2"


def write_first(src: str, plan: InputPlan, manifest: dict, staging: str, scratch: str, started_ns: int) -> dict:
    """Write version 1's sources table into ``staging`` (``scratch``: a local folder of the launcher's, for the
    sort) and return ``manifest`` with its ``sources_table`` entry."""
    order = external_sort.ExternalSort(scratch, "first-sources")
    _add_planned(order, src, plan, manifest["classes"], started_ns)
    _add_records(order, manifest, staging)
    _add_rejected(order, staging)
    target = os.path.join(staging, versions.SOURCES_TABLE)
    if filesystems.is_local(staging):
        versions.write_sources(filesystems.local_path(target), _rows(order.sorted()))
    else:  # written whole locally, then into staging (published with it)
        handle, local = tempfile.mkstemp(prefix="sources-", suffix=".parquet", dir=scratch)
        os.close(handle)
        versions.write_sources(local, _rows(order.sorted()))
        with open(local, "rb") as data, FileSystems.create(FileSystems.join(staging, versions.SOURCES_TABLE)) as out:
            shutil.copyfileobj(data, out, 1 << 20)
        os.remove(local)
    return dict(manifest, sources_table={"file": versions.SOURCES_TABLE})


def _entry(path: str, kind: bytes, value: tuple) -> bytes:
    return path.encode("utf-8") + b"\0" + kind + marshal.dumps(value)


def _add_planned(order: external_sort.ExternalSort, src: str, plan: InputPlan, classes, started_ns: int) -> None:
    """Each listed image's stamp (local items only: a file's, a member's, a Parquet row's file's) and annotation
    digest, under its path."""
    ids = stable_ids.remap(classes, plan.classes)  # identity by name: the version's classes are the plan's
    local = filesystems.is_local(src)
    # An image's semantic mask (only --masks and class masks give one) is part of its stamp, as in an update's.
    masks = plan.task in (record_schema.TASK_OBJECTS, record_schema.TASK_SEGMENTATION)
    items = SourceStamps(filesystems.local_path(src), plan.inflated, masks, plan.archives) if local else None
    for ref in plan.refs:
        # The annotation decoded once for its digest and its semantic mask (the stamp folds the mask's in).
        digest, mask = stable_ids.objects_digest(ref.annotation, ids) if ref.annotation else (NO_ANNOTATION, None)
        size = mtime = UNKNOWN
        # Unchanged since before the run (its file's, archive's, mask's ctime older than the run's start): the bytes
        # its record holds (ctime moves on every change, no call sets it back). One changed since, gone, or never
        # there (a label file's missing-file) is unstamped: the next update compares its bytes.
        stamp = items.stamp(ref, ctime_before=started_ns, class_mask=mask) if items is not None else None
        if stamp is not None:
            size, mtime = stamp
        if digest != NO_ANNOTATION or size != UNKNOWN:
            order.add(_entry(display_path(ref.relpath), _PLANNED, (size, mtime, digest)))


def _add_records(order: external_sort.ExternalSort, manifest: dict, staging: str) -> None:
    """Each record's place, stored SHA-256 and class ids, from its split's records table in staging."""
    for split, entry in manifest["splits"].items():
        table = entry.get("records_table")
        if not table:
            continue
        files = [shard["file"] for shard in entry["shards"]]
        with FileSystems.open(FileSystems.join(staging, table["file"])) as handle:
            records = RecordsTable(handle)
            for group in records.row_groups(("shard", "index", "sha256", "path", "classes")):
                columns = group.to_pydict()
                for shard, index, sha, path, classes in zip(columns["shard"], columns["index"], columns["sha256"],
                                                            columns["path"], columns["classes"]):
                    order.add(_entry(path, _RECORD, (split, files[shard], index, sha.hex(),
                                                     versions.label_key(classes))))


def _add_rejected(order: external_sort.ExternalSort, staging: str) -> None:
    """Each image the run rejected (not an object of an image it wrote)."""
    path = FileSystems.join(staging, record_schema.REJECTED_FILE)
    if not FileSystems.exists(path):
        return
    for line in filesystems.read_text(path).splitlines():
        if line.strip():
            item = json.loads(line)
            if "annotation" not in item:
                order.add(_entry(item["path"], _REJECTED, ()))


def _rows(entries) -> "iter[SourceRow]":
    """The sorted entries as rows, in path order: each record or rejection with its path's stamp and digest."""
    planned = None  # (path, (size, mtime, digest)) of the last planned entry
    for entry in entries:
        cut = entry.index(b"\0")
        path, kind, value = entry[:cut].decode("utf-8"), entry[cut + 1:cut + 2], marshal.loads(entry[cut + 2:])
        if kind == _PLANNED:
            planned = (path, value)
            continue
        size, mtime, digest = planned[1] if planned is not None and planned[0] == path else (UNKNOWN, UNKNOWN,
                                                                                             NO_ANNOTATION)
        if kind == _RECORD:
            split, file, index, sha, label = value
            yield SourceRow(path, split, file, index, size, mtime, sha, "", label, digest)
        else:
            yield SourceRow(path, "", "", -1, size, mtime, "", "", UNKNOWN, digest)
