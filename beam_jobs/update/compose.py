"""What version N+1 holds, composed in its staging folder: compacted shards, manifest, rejections, sources table.

In:  the comparison's :class:`beam_jobs.planning.changes.Changes`, the latest version (its manifest, shards,
     ``rejected.jsonl``), and the manifest and records tables the conversion of the changed images wrote into
     staging (None when only deletions: no pipeline ran).
Out: in staging, ``compacted/`` (:mod:`beam_jobs.update.shard_moves`: the shards masked, compacted or merged),
     ``rejected.jsonl`` and ``sources.parquet``; the version's manifest (a dict; written by
     :func:`beam_jobs.files.version_store.publish`).

The latest version's shards that lost nothing are listed as they are (reused, not copied): a version's
manifest names files of earlier versions' folders. (docs/format.md, "Versions".)
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import heapq
import json
import logging
import os
import shutil
from typing import Optional

import record_schema
from beam_jobs.files import publish, store_files, version_store
from beam_jobs.options import ConvertOptions
from beam_jobs.planning import changes as change_plan
from beam_jobs.planning import discover
from beam_jobs.stages.manifest import publish_skipped
from beam_jobs.pipeline import budgets, label_files
from beam_jobs.update import kept_hashes, tables
from beam_jobs.update.shard_moves import Move, compact  # noqa: F401  (the launcher calls compose.compact)
from record_files import croissant, versions
from record_files.records_table import RecordsTable
from record_files.versions import SourceRow

logger = logging.getLogger(__name__)


def write_tables(out: str, staging: str, found: change_plan.Changes, latest: version_store.Version, number: int,
                 converted: Optional[dict], renamed: dict[str, Move], manifest: dict) -> None:
    """Each split's records table of the version, into staging, listed in ``manifest``'s split entries
    (:func:`beam_jobs.update.tables.write_tables`). After :func:`version_manifest`, before the card."""
    tables.write_tables(out, staging, found, latest.manifest, number, converted, renamed, manifest["splits"],
                        latest.manifest.get("task", record_schema.TASK_CLASSIFICATION))


def write_card(staging: str, out: str, manifest: dict, card) -> None:
    """The version's ``croissant.json`` into staging, as a conversion writes it; none for a version that masks
    records (:func:`record_files.croissant.refuse_masked` says why, and the update logs it: the version is
    published all the same, readable by the reader and its records tables)."""
    try:
        croissant.refuse_masked(manifest)
    except croissant.MaskedVersionError as err:
        logger.warning("%s", err)
        return
    label_files.write_card(staging, out, manifest, card)


def version_manifest(options: ConvertOptions, plan: discover.InputPlan, found: change_plan.Changes,
             latest: version_store.Version, number: int, converted: Optional[dict], compacted: dict[str, list[dict]],
             staging: str) -> dict:
    """Version ``number``'s manifest: per split, the latest version's reused shards, the compacted ones, then
    the new ones."""
    folder = versions.version_dir(number)
    base = dict(converted) if converted else {}
    rejected = _merge_rejections(options.out, found, latest, staging)
    by_reason = collections.Counter(json.loads(line)["reason"] for line in rejected)
    splits = {}
    # The shards this update masked (an earlier version's masked shard reused as it is is not one).
    masked = {shard["file"]: shard for entries in compacted.values() for shard in entries
              if "live" in shard and shard["file"] not in found.reused}
    for split in record_schema.SPLITS:
        before = latest.manifest["splits"].get(split, {})
        # Reused and masked shards stay where their files were (the latest version's order, as :func:`compact`
        # lists them), then the compacted and merged ones.
        files_before = {shard["file"] for shard in before.get("shards", ())}
        reused = [shard for shard in compacted.get(split, []) if shard["file"] in files_before]
        new = base.get("splits", {}).get(split, {})
        fresh = [shard for shard in compacted.get(split, []) if shard["file"] not in files_before] + [
            dict(shard, file=f"{folder}/{shard['file']}",
                 **({"dali_index": f"{folder}/{shard['dali_index']}"} if shard.get("dali_index") else {}))
            for shard in new.get("shards", ())]
        if not reused and not fresh:
            continue
        labels = list(new.get("label_counts", [0] * len(found.classes)))
        labels += [0] * (len(found.classes) - len(labels))
        for (where, label), count in found.kept_labels.items():
            if where == split:
                labels[label] += count
        old = before if reused else {}
        reencoded = collections.Counter(old.get("reencoded_by_reason", {}))
        reencoded.update(new.get("reencoded_by_reason", {}))
        splits[split] = {
            "num_examples": sum(s["num_examples"] for s in reused + fresh),
            "num_bytes": sum(s["num_bytes"] for s in reused + fresh),
            "num_shards": len(reused) + len(fresh),
            "label_counts": labels,
            # Counted per split, not per shard, in earlier versions: with shards compacted, upper bounds.
            "num_reencoded": sum(reencoded.values()),
            "reencoded_by_reason": dict(sorted(reencoded.items())),
            "max_side": max(old.get("max_side", 0), new.get("max_side", 0)),
            "num_grayscale": old.get("num_grayscale", 0) + new.get("num_grayscale", 0),
            **({"num_objects": sum(labels)} if "num_objects" in before or "num_objects" in new else {}),
            "num_small": old.get("num_small", 0) + new.get("num_small", 0),
            "shards": reused + fresh,
        }
    manifest = dict(base) if base else _empty_manifest(plan, latest, staging)
    manifest.update({
        "classes": list(found.classes),
        "class_text": list(found.classes),
        "num_classes": len(found.classes),
        "splits": splits,
        "num_listed": len(plan.refs),
        "num_rejected": len(rejected),
        "rejected_by_reason": dict(sorted(by_reason.items())),
        "options": options.to_json(),
        "version": number,
        "previous_version": latest.number,
        "changes": _changes(found, latest, splits, masked),
        "sources_table": {"file": f"{folder}/{versions.SOURCES_TABLE}"},
    })
    manifest["duplicates"] = dict(manifest.get("duplicates", {}), **_merge_drops(options.out, found, latest, staging))
    manifest.pop("requires", None)  # the latest version's, when no shard entry it kept was new
    if any("live" in shard for entry in splits.values() for shard in entry["shards"]):
        manifest["requires"] = [versions.LIVE]  # a reader that does not know masks refuses, not reads them back
    return manifest


def _changes(found: change_plan.Changes, latest: version_store.Version, splits: dict, masked: dict[str, dict]) -> dict:
    """The manifest's ``changes``: the comparison's counts, with the shards that lost records told apart into
    masked (reused, their survivors listed) and compacted (their survivors copied), and the small shards that
    lost none but were merged (``merged_shards``); ``recompacted`` counts every record copied."""
    counts = found.counts()
    listed = {shard["file"] for entry in splits.values() for shard in entry["shards"]}
    before = {shard["file"]: shard for entry in latest.manifest["splits"].values() for shard in entry["shards"]}
    gone = [name for name in found.survivors if name not in listed]  # lost records; their survivors copied
    merged = [name for name in before if name in found.reused and name not in listed]  # lost none; copied
    return dict(counts, reused_shards=sum(name in found.reused for name in listed), masked_shards=len(masked),
                masked_records=sum(shard["file_records"] - shard["num_examples"] for shard in masked.values()),
                compacted_shards=len(gone), merged_shards=len(merged),
                recompacted=sum(len(found.survivors[name]) for name in gone)
                + sum(before[name]["num_examples"] for name in merged),
                new_shards=sum(name not in before for name in listed))


def _empty_manifest(plan: discover.InputPlan, latest: version_store.Version, staging: str) -> dict:
    """The fields a version without new shards takes from the latest version's manifest, made true of it: its
    own ``created``, SRC's skipped files now, its archives' identities now (a deleted member changed its tar: the
    next update reads that tar's members by their bytes while the recorded identity is another), and no
    duplicate groups (the update converted no image)."""
    manifest = {key: value for key, value in latest.manifest.items()
                if key not in ("version", "previous_version", "changes", "sources_table", "source_archives")}
    if plan.archives and not plan.provenance:  # as a conversion's manifest records them (stages/manifest.py)
        manifest["source_archives"] = dict(plan.archives)
    manifest.update(publish_skipped(plan, staging))
    manifest.update({
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "num_skipped": sum(plan.skipped.values()), "skipped_by_reason": dict(plan.skipped),
        "skipped_examples": dict(sorted(plan.skipped_files.examples.items())) if plan.skipped_files else {},
        "duplicates": {key: _none_of(key, value) for key, value in manifest.get("duplicates", {}).items()},
    })
    return manifest


def _none_of(key: str, value):
    """A duplicates field of the latest version's manifest as it reads when no image was searched: counts 0,
    lists empty, no dropped file; the file's name and the threshold kept."""
    if key in ("dropped_file", "dropped_sha256"):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        return value
    return 0 if isinstance(value, int) else []


def missing_before(out: str, latest: version_store.Version) -> frozenset[str]:
    """The images the latest version rejected as ``missing-file`` (its ``rejected.jsonl``): the rejections an
    update keeps while the file is still missing (:func:`beam_jobs.planning.changes.compare`). Few: a set."""
    items = [json.loads(line) for line in _rejected_lines(out, latest)]
    return frozenset(item["path"] for item in items if item.get("reason") == "missing-file" and "annotation" not in item)


def _merge_drops(out: str, found: change_plan.Changes, latest: version_store.Version, staging: str) -> dict:
    """The version's ``dropped.jsonl`` (written into staging) and the manifest's fields for it: the latest
    version's lines of images still left out (unchanged in SRC: their sources rows say no record, as a
    rejected image's) and the update's own (``--drop-leaks``: the new images near a kept or new training
    image), sorted as a conversion sorts them."""
    lines: list[str] = []
    before = store_files.read_in(out, versions.in_version(latest.number, record_schema.DROPPED_FILE)) \
        if latest.manifest.get("duplicates", {}).get("dropped_file") and found.rejected_kept else None
    lines += [line for line in (before or b"").decode("utf-8").split("\n")
              if line.strip() and json.loads(line)["path"] in found.rejected_kept]
    mine = os.path.join(staging, record_schema.DROPPED_FILE)
    lines += _own_lines(staging, record_schema.DROPPED_FILE)
    if not lines:
        if os.path.exists(mine):
            os.remove(mine)
        return {"num_dropped": 0, "dropped_file": None, "dropped_sha256": None}
    lines.sort(key=lambda line: (json.loads(line)["split"], json.loads(line)["path"]))
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    with open(mine, "wb") as handle:
        handle.write(data)
    return {"num_dropped": len(lines), "dropped_file": record_schema.DROPPED_FILE,
            "dropped_sha256": hashlib.sha256(data).hexdigest()}


def dropped_paths(staging: str) -> set[str]:
    """The paths of the update's own ``dropped.jsonl`` (few: the images ``--drop-leaks`` left out)."""
    own = os.path.join(publish.work_dir(staging), "update-" + record_schema.DROPPED_FILE)
    if not os.path.exists(own):
        return set()
    with open(own, encoding="utf-8") as handle:
        return {json.loads(line)["path"] for line in handle if line.strip()}


def _rejected_lines(out: str, latest: version_store.Version) -> list[str]:
    """The latest version's ``rejected.jsonl`` lines (OUT on disk or in a store; none when it has none)."""
    data = store_files.read_in(out, versions.in_version(latest.number, record_schema.REJECTED_FILE))
    return [line for line in (data or b"").decode("utf-8").split("\n") if line.strip()]


def _kept_rejections(out: str, found: change_plan.Changes, latest: version_store.Version) -> list[str]:
    """The latest version's ``rejected.jsonl`` lines the version keeps: those of rejected images still in SRC
    unchanged, and the rejected objects of the images whose records it keeps (an object's line names its image
    and ``annotation``: its record is kept without it). Memory: the lines (few); the kept rows are streamed,
    only when an object was rejected."""
    lines = [(json.loads(line), line) for line in _rejected_lines(out, latest)]
    objects = {item["path"] for item, _ in lines if "annotation" in item}
    kept = {row.path for row, _ in found.unchanged if row.file and row.path in objects} if objects else set()
    return [line for item, line in lines
            if (item["path"] in kept if "annotation" in item else item["path"] in found.rejected_kept)]


def version_budget(out: str, found: change_plan.Changes, latest: version_store.Version, listed: int,
                   kept: kept_hashes.KeptRecords) -> budgets.VersionBudget:
    """What the version keeps, for ``--max-bad-fraction`` to judge the update's conversion over the version:
    SRC's images, the rejected images it keeps (not those ``--drop-leaks`` left out), the kept records'
    objects (from their table rows) and their rejected objects (:class:`beam_jobs.pipeline.budgets.VersionBudget`)."""
    kept_lines = [json.loads(line) for line in _kept_rejections(out, found, latest)]
    objects = latest.manifest.get("task") == record_schema.TASK_OBJECTS
    return budgets.VersionBudget(
        images_listed=listed,
        images_rejected=sum("annotation" not in item for item in kept_lines),
        objects_kept=kept.objects() if objects else 0,
        objects_rejected=sum("annotation" in item for item in kept_lines))


def _merge_rejections(out: str, found: change_plan.Changes, latest: version_store.Version,
                      staging: str) -> list[str]:
    """The version's ``rejected.jsonl`` (written into staging): the latest version's lines it keeps
    (:func:`_kept_rejections`), and the update's own, sorted as a conversion sorts them."""
    lines = _kept_rejections(out, found, latest)
    mine = os.path.join(staging, record_schema.REJECTED_FILE)
    lines += _own_lines(staging, record_schema.REJECTED_FILE)
    lines.sort()
    with open(mine, "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return lines


def write_sources(found: change_plan.Changes, converted: Optional[dict], staging: str, number: int,
                   renamed: dict[str, Move]) -> None:
    """The version's sources table, into staging: the unchanged rows (a compacted or merged shard's survivors at
    their new places), merged in path order with each new record's row (from the update's records tables, which are then
    removed: a version's splits list no table yet) and each image the update rejected. Streamed: the unchanged
    rows are read back from the comparison's spill file, never held."""
    new = _new_rows(found, converted, staging, number)
    new.sort(key=lambda row: row.path)
    kept = (_moved(row, renamed[row.file]) if row.file in renamed else row for row, _ in found.unchanged)
    versions.write_sources(os.path.join(staging, versions.SOURCES_TABLE),
                           heapq.merge(kept, new, key=lambda row: row.path))


def _moved(row: SourceRow, move: Move) -> SourceRow:
    """``row``, a survivor of a compacted or merged shard, at its place in the shard it was copied into."""
    return dataclasses.replace(row, file=move.file, index=int(move.index_of(row.index)))


def _new_rows(found: change_plan.Changes, converted: Optional[dict], staging: str, number: int) -> list[SourceRow]:
    """Each new record's row and each image the update rejected: as many as the images it converted."""
    rows = []
    folder = versions.version_dir(number)
    for split, entry in (converted or {}).get("splits", {}).items():
        table = entry.get("records_table")
        if not table:
            continue
        files = [f"{folder}/{shard['file']}" for shard in entry["shards"]]
        path = tables.conversion_table(staging, split, table)  # the version's own table takes its name
        for group in RecordsTable(path).row_groups(("shard", "index", "sha256", "path", "classes")):
            columns = group.to_pydict()
            for shard, index, sha, name, classes in zip(columns["shard"], columns["index"], columns["sha256"],
                                                        columns["path"], columns["classes"]):
                size, mtime = found.stamps[name]
                rows.append(SourceRow(name, split, files[shard], index, size, mtime, sha.hex(),
                                      found.source_sha256(name), version_store.record_label(classes),
                                      found.digests.get(name, versions.NO_ANNOTATION)))
    with open(os.path.join(staging, record_schema.REJECTED_FILE), encoding="utf-8") as handle:
        # (an object's rejection names an image whose record holds the rest of its objects: not left out)
        left_out = [item["path"] for item in map(json.loads, handle) if "annotation" not in item]
    # The images --drop-leaks left out: no record, as a rejected image (the next update keeps them out while
    # they are unchanged; their lines carried to its dropped.jsonl).
    for path in sorted(set(left_out) | dropped_paths(staging)):
        if path not in found.rejected_kept and path in found.stamps:
            size, mtime = found.stamps[path]
            rows.append(SourceRow(path, "", "", -1, size, mtime, "", found.source_sha256(path),
                                  annotation=found.digests.get(path, versions.NO_ANNOTATION)))
    return rows


def _own_lines(staging: str, name: str) -> list[str]:
    """The lines of the update's own conversion's ``name`` in staging (rejected.jsonl, dropped.jsonl), kept aside
    in the work folder the first time: staging's file is rewritten with the version's lines, and a resumed update
    composes the version again from the conversion's own."""
    mine = os.path.join(staging, name)
    own = os.path.join(publish.work_dir(staging), "update-" + name)
    if not os.path.exists(own):
        os.makedirs(os.path.dirname(own), exist_ok=True)
        if os.path.exists(mine):
            shutil.copyfile(mine, own + ".tmp")
        else:
            open(own + ".tmp", "w").close()
        os.replace(own + ".tmp", own)
    with open(own, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle if line.strip()]
