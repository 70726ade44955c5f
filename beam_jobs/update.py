"""``--update``: write what changed in SRC as a new version of OUT (issue #59).

In:  the conversion's options (the same flags as the conversion that made OUT), OUT's latest version.
Out: version N+1 in ``OUT/versions/<N+1>/``, published by its pointer written last
     (:mod:`beam_jobs.files.version_store`); or nothing, when nothing changed.

It lists SRC as a conversion does, compares it with the latest version (:mod:`beam_jobs.planning.changes`:
stamps, no bytes read), runs the conversion's own pipeline (:func:`beam_jobs.pipeline.launch.convert_into`) over
the images to convert only (new, changed, and the survivors of shards that lost a record), then composes
the version's manifest: the latest version's shards kept as they are, then the new ones. Class folders on
a local OUT for now; other sources are refused naming them. (docs/converter.md, "Updating a dataset".)
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import heapq
import json
import logging
import os
import shutil
import time
from typing import Optional, Sequence, Union

import record_schema
from beam_jobs import faults
from beam_jobs.files import filesystems, publish, version_store
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import AUTO, ConvertOptions
from beam_jobs.pipeline import beam_run, label_files, launch, run_plan
from beam_jobs.planning import changes as change_plan
from beam_jobs.planning import discover, resume
from beam_jobs.runtime import interrupt, runners, worker_start
from beam_jobs.sources.objects import coco
from beam_jobs.stages.manifest import ConvertSummary, publish_skipped
from record_files import versions
from record_files.records_table import RecordsTable
from record_files.versions import SourceRow

logger = logging.getLogger(__name__)

# The options whose change would change records already written: an update keeps them (flag -> what it is).
_FIXED = {"encode": "the image options (--max-side, --quality, --min-side, ...)", "seed": "--seed",
          "val_fraction": "--val-fraction", "labels_file": "--labels", "drop_leaks": "--drop-leaks",
          "synsets": "--synsets"}


class UpdateRefusedError(discover.InputError):
    """The update cannot be made as asked (another source than class folders, other options...)."""


@dataclasses.dataclass(frozen=True)
class UpdateSummary:
    """What an update did: the version written (None: nothing changed), its changes and the conversion's."""

    out: str
    version: Optional[int]
    previous: int
    changes: dict
    converted: Optional[ConvertSummary]
    elapsed_s: float

    def format(self) -> str:
        if self.version is None:
            return (f"nothing changed in SRC since version {self.previous} of {self.out}: no version written "
                    f"({self.elapsed_s:.1f} s)")
        counts = self.changes
        return "\n".join([
            f"published version {self.version} of {self.out} (was {self.previous})",
            f"  images:     {counts['added']} added, {counts['changed']} changed"
            + (f" ({counts['relabelled']} relabelled)" if counts.get("relabelled") else "")
            + f", {counts['deleted']} deleted, "
            f"{counts['unchanged']} unchanged",
            f"  shards:     {counts['reused_shards']} reused, {counts['new_shards']} new "
            f"({counts['compacted_shards']} that lost records compacted: {counts['recompacted']} records copied)",
            f"  elapsed:    {self.elapsed_s:.1f} s",
        ])


def run(options: ConvertOptions, pipeline_args: Sequence[str] = (), rehash: bool = False,
        show_progress: Union[None, bool, str] = None) -> UpdateSummary:
    """Update ``options.out`` to hold exactly ``options.src``: a new version, or nothing when nothing changed.

    Raises:
      UpdateRefusedError: SRC is not a source updates support yet, OUT holds no dataset, or an option that
        shapes the records differs from the latest version's (naming the flag).
      version_store.VersionError: OUT's versions cannot be read (naming the file).
      the exceptions of :func:`beam_jobs.pipeline.run`.
    """
    with interrupt.handled(), worker_start.stopped_after():  # no forkserver outlives the update
        return _run(options, pipeline_args, rehash, show_progress)


def _run(options: ConvertOptions, pipeline_args: Sequence[str], rehash: bool,
         show_progress: Union[None, bool, str]) -> UpdateSummary:
    started = time.monotonic()
    out = options.out
    version_store.latest_number(out)  # refuses an OUT in an object store before anything else
    choice = runners.choose_runner(beam_run.worker_log_args(pipeline_args))
    if not choice.local:
        raise UpdateRefusedError(f"--update runs on the local runner only for now, not {choice.description}")
    FileSystems.set_options(choice.options)
    with publish.output_lock(out):
        faults.point("locked")
        publish.recover_and_clean(out)
        if not version_store.existing(out):
            raise UpdateRefusedError(f"--update: {out} holds no converted dataset to update; convert SRC into it "
                                     "first (the same command without --update)")
        version_store.remove_unpublished(out)
        latest = version_store.read(out, version_store.latest_number(out))
        _refuse_dropped(out, latest)
        _check_options(options, latest.manifest)
        scratch, staging = publish.new_scratch(out), None
        try:
            with interrupt.live_run(last_resort=lambda: resume.last_resort(staging, out, scratch)):
                plan = _plan(options, scratch)
                options = run_plan.near_distance_for(options, len(plan.refs))  # as converting all of SRC would
                found = change_plan.compare(plan.refs, options.src, plan.classes,
                                            version_store.iter_sources(out, latest), latest.manifest["classes"],
                                            options.val_fraction, options.seed, scratch, rehash)
                if found.nothing:
                    logger.info("nothing changed since version %d", latest.number)
                    return UpdateSummary(out, None, latest.number, found.counts(), None,
                                         time.monotonic() - started)
                staging = publish.new_staging(out)
                number = latest.number + 1
                converted, staging = _convert(options, plan, found, staging, choice, show_progress)
                compacted, renamed = _compact(out, staging, found, latest, number)
                manifest = _compose(options, plan, found, latest, number, converted, compacted, staging)
                label_files.write_card(staging, out, manifest, options.card)
                _write_sources(found, converted, staging, number, renamed)
            shutil.rmtree(scratch, ignore_errors=True)
            faults.point("before-commit")
            with interrupt.deferred():
                filesystems.remove_folder(publish.work_dir(staging))
                for split in record_schema.SPLITS:  # the new shards' rows are in the sources table now
                    _remove_if_there(os.path.join(staging, record_schema.records_table_filename(split)))
                version_store.publish(staging, out, number, manifest)
            faults.point("committed")
        except BaseException as err:
            if staging is not None and os.path.exists(staging) and not getattr(err, "kept_staging", None) \
                    and not resume.kept_on_stop(err, staging):
                publish.discard_staging(staging)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = ConvertSummary.from_manifest(out, manifest, time.monotonic() - started)
    return UpdateSummary(out, number, latest.number, manifest["changes"], summary, time.monotonic() - started)


def _refuse_dropped(out: str, latest: version_store.Version) -> None:
    """Refuse a latest version that left images out (``--drop-leaks``): they are in no sources table, so the
    update would take them for new images and convert them, undoing the drop (issue #59's review)."""
    manifest = latest.manifest
    dropped = manifest.get("duplicates", {}).get("num_dropped", 0)
    if manifest.get("options", {}).get("drop_leaks") or dropped:
        raise UpdateRefusedError(
            f"--update: version {latest.number} of {out} was converted with --drop-leaks ({dropped} image(s) "
            "dropped); an update cannot keep them dropped yet and would convert them back; convert SRC again "
            "with --overwrite (and --drop-leaks) instead")


def _check_options(options: ConvertOptions, manifest: dict) -> None:
    """Refuse options that would change how the records already written were made, naming the flag."""
    now = json.loads(json.dumps(options.to_json(), default=str))
    before = manifest.get("options", {})
    for key, flag in _FIXED.items():
        if key in before and before[key] != now.get(key):
            raise UpdateRefusedError(
                f"--update: {flag} is {now.get(key)!r} here but {before[key]!r} in the latest version of "
                f"{options.out}; an update keeps the options the records were written with (give the same, or "
                "convert again with --overwrite)")


def _plan(options: ConvertOptions, scratch: str) -> discover.InputPlan:
    """SRC's plan (listed once), refused unless it is class folders or a label file (``--annotations`` CSV, TSV
    or JSON Lines, one label an image: the sources updates support yet), naming the source it is read as."""
    given = [flag for flag, value in (("--label-member", options.label_member),
                                      ("--val-labels", options.val_labels), ("--config", options.config),
                                      ("--image-column", options.image_column),
                                      ("--label-column", options.label_column)) if value]
    if given:
        _refuse(options, f"the source {given[0]} names")
    if options.annotations and coco.is_coco_file(options.annotations):  # before a COCO file is read whole
        _refuse(options, f"an annotated dataset (COCO: --annotations {options.annotations})")
    if options.label_separator is not None:
        _refuse(options, "a multi-label file (--label-separator)")
    plan = run_plan.plan_inputs(options, scratch, None)
    if plan.task != record_schema.TASK_CLASSIFICATION:
        _refuse(options, f"an annotated dataset (COCO, YOLO, Pascal VOC, CVAT or masks beside images: task {plan.task!r})")
    if plan.provenance:
        _refuse(options, "a Parquet dataset (the Hub's)")
    if plan.archives or any(ref.source for ref in plan.refs):
        _refuse(options, "images inside archives")
    return plan


def _refuse(options: ConvertOptions, kind: str) -> None:
    raise UpdateRefusedError(f"--update supports class folders and label files only for now; {options.src} is read "
                             f"as {kind}: convert it again with --overwrite")


def _convert(options: ConvertOptions, plan: discover.InputPlan, found: change_plan.Changes, staging: str,
             choice: runners.RunnerChoice, show_progress) -> tuple[Optional[dict], str]:
    """Convert ``found.refs`` into ``staging`` as a conversion would; (its manifest, the staging folder used:
    a killed update's, when it resumes one). No refs (only deletions): labels and reports written, no pipeline."""
    counts = collections.Counter(ref.split for ref in found.refs)
    # Classes without an image to convert are not "empty": their records are in the shards reused.
    converting = {ref.label for ref in found.refs}
    narrowed = dataclasses.replace(plan, refs=found.refs, classes=found.classes, class_text=found.classes,
                                   split_counts=dict(counts), carved={}, unlisted=tuple(
                                       name for label, name in enumerate(found.classes) if label not in converting))
    if not found.refs:
        filesystems.write_text(FileSystems.join(staging, record_schema.LABELS_FILE),
                               "".join(name + "\n" for name in found.classes))
        for name in (record_schema.REJECTED_FILE, record_schema.DUPLICATES_FILE):
            filesystems.write_text(FileSystems.join(staging, name), "")
        return None, staging
    # The carve was the update's (a fixed threshold): the conversion of the new images carves nothing more.
    # Their shards are sized by their bytes (--shards auto), not by the count the whole dataset was cut into:
    # 120 new photos make one shard, not 64 of two images.
    rejected_before = len(found.rejected_kept)
    return launch.convert_into(dataclasses.replace(options, val_fraction=0.0, shards=AUTO), narrowed, staging,
                                 choice, show_progress, budget=(len(plan.refs), rejected_before))


# Where a version's compacted shards are, in its folder: their names are the split's shard names anew.
COMPACTED = "compacted"


def _compact(out: str, staging: str, found: change_plan.Changes, latest: version_store.Version,
             number: int) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Copy the survivors of each shard that lost a record, record by record (the same bytes: no image read,
    none converted), into a shard of their own in ``staging/compacted/``, in the latest version's shard order.

    Returns each split's new shard entries and each compacted shard's new file (both relative to OUT).
    """
    folder, entries, renamed = versions.version_dir(number), {}, {}
    for split, entry in latest.manifest["splits"].items():
        shards = [shard for shard in entry["shards"] if len(found.survivors.get(shard["file"], ()))]
        for position, shard in enumerate(shards):
            name = f"{COMPACTED}/{record_schema.shard_filename(split, position, len(shards))}"
            os.makedirs(os.path.join(staging, COMPACTED), exist_ok=True)
            copied = version_store.copy_records(out, shard, found.survivors[shard["file"]].tolist(),
                                                os.path.join(staging, name))
            entries.setdefault(split, []).append({
                "file": f"{folder}/{name}", "num_examples": copied.num_examples, "num_bytes": copied.num_bytes,
                "sha256": copied.sha256, "dali_index": f"{folder}/{name}.idx", "index_bytes": copied.index_bytes})
            renamed[shard["file"]] = f"{folder}/{name}"
    return entries, renamed


def _compose(options: ConvertOptions, plan: discover.InputPlan, found: change_plan.Changes,
             latest: version_store.Version, number: int, converted: Optional[dict], compacted: dict[str, list[dict]],
             staging: str) -> dict:
    """Version ``number``'s manifest: per split, the latest version's reused shards, the compacted ones, then
    the new ones."""
    folder = versions.version_dir(number)
    base = dict(converted) if converted else {}
    rejected = _merge_rejections(options.out, found, latest, staging)
    by_reason = collections.Counter(json.loads(line)["reason"] for line in rejected)
    splits = {}
    for split in record_schema.SPLITS:
        before = latest.manifest["splits"].get(split, {})
        reused = [shard for shard in before.get("shards", ()) if shard["file"] in found.reused]
        new = base.get("splits", {}).get(split, {})
        fresh = compacted.get(split, []) + [
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
        "changes": dict(found.counts(), reused_shards=len(found.reused),
                        new_shards=sum(len(s["shards"]) for s in splits.values()) - len(found.reused)),
        "sources_table": {"file": f"{folder}/{versions.SOURCES_TABLE}"},
    })
    return manifest


def _empty_manifest(plan: discover.InputPlan, latest: version_store.Version, staging: str) -> dict:
    """The fields a version without new shards takes from the latest version's manifest, made true of it: its
    own ``created``, SRC's skipped files now, and no duplicate groups (the update converted no image)."""
    manifest = {key: value for key, value in latest.manifest.items()
                if key not in ("version", "previous_version", "changes", "sources_table")}
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


def _merge_rejections(out: str, found: change_plan.Changes, latest: version_store.Version,
                      staging: str) -> list[str]:
    """The version's ``rejected.jsonl`` (written into staging): the latest version's lines of rejected images
    still in SRC unchanged, and the update's own, sorted as a conversion sorts them."""
    still = found.rejected_kept
    lines: list[str] = []
    before = os.path.join(filesystems.local_path(out), versions.in_version(latest.number,
                                                                             record_schema.REJECTED_FILE))
    if still and os.path.exists(before):
        with open(before, encoding="utf-8") as handle:
            lines += [line.rstrip("\n") for line in handle if line.strip() and json.loads(line)["path"] in still]
    mine = os.path.join(staging, record_schema.REJECTED_FILE)
    # The conversion's own lines, kept aside the first time: a resumed update composes the version again.
    own = os.path.join(publish.work_dir(staging), "update-" + record_schema.REJECTED_FILE)
    if not os.path.exists(own):
        os.makedirs(os.path.dirname(own), exist_ok=True)
        if os.path.exists(mine):
            shutil.copyfile(mine, own + ".tmp")
        else:
            open(own + ".tmp", "w").close()
        os.replace(own + ".tmp", own)
    with open(own, encoding="utf-8") as handle:
        lines += [line.rstrip("\n") for line in handle if line.strip()]
    lines.sort()
    with open(mine, "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return lines


def _write_sources(found: change_plan.Changes, converted: Optional[dict], staging: str, number: int,
                   renamed: dict[str, str]) -> None:
    """The version's sources table, into staging: the unchanged rows (a compacted shard's survivors at their new
    places), merged in path order with each new record's row (from the update's records tables, which are then
    removed: a version's splits list no table yet) and each image the update rejected. Streamed: the unchanged
    rows are read back from the comparison's spill file, never held."""
    new = _new_rows(found, converted, staging, number)
    new.sort(key=lambda row: row.path)
    kept = (found.new_place(row, renamed[row.file]) if row.file in renamed else row for row, _ in found.unchanged)
    versions.write_sources(os.path.join(staging, versions.SOURCES_TABLE),
                           heapq.merge(kept, new, key=lambda row: row.path))


def _new_rows(found: change_plan.Changes, converted: Optional[dict], staging: str, number: int) -> list[SourceRow]:
    """Each new record's row and each image the update rejected: as many as the images it converted."""
    rows = []
    folder = versions.version_dir(number)
    for split, entry in (converted or {}).get("splits", {}).items():
        table = entry.pop("records_table", None)
        if not table:
            continue
        files = [f"{folder}/{shard['file']}" for shard in entry["shards"]]
        path = os.path.join(staging, table["file"])
        for group in RecordsTable(path).row_groups(("shard", "index", "sha256", "path", "classes")):
            columns = group.to_pydict()
            for shard, index, sha, name, classes in zip(columns["shard"], columns["index"], columns["sha256"],
                                                        columns["path"], columns["classes"]):
                size, mtime = found.stamps[name]
                rows.append(SourceRow(name, split, files[shard], index, size, mtime, sha.hex(),
                                      found.source_sha256(name), version_store.record_label(classes)))
    with open(os.path.join(staging, record_schema.REJECTED_FILE), encoding="utf-8") as handle:
        for line in handle:
            item = json.loads(line)
            if item["path"] not in found.rejected_kept and item["path"] in found.stamps:
                size, mtime = found.stamps[item["path"]]
                rows.append(SourceRow(item["path"], "", "", -1, size, mtime, "", found.source_sha256(item["path"])))
    return rows


def _remove_if_there(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)
