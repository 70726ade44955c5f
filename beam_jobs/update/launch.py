"""``--update``'s launch: the stages of an update wired under OUT's lock (issue #59).

In:  the conversion's options (the same flags as the conversion that made OUT), OUT's latest version.
Out: version N+1 in ``OUT/versions/<N+1>/``, published by its pointer written last
     (:mod:`beam_jobs.files.version_store`); or nothing, when nothing changed.

The stages, in order, each a module: what is refused before anything is read, and SRC's plan
(:mod:`beam_jobs.update.checks`); SRC compared with the latest version (:mod:`beam_jobs.planning.changes`:
stamps, no bytes read); the conversion's own pipeline (:func:`beam_jobs.pipeline.launch.convert_into`) over the
images to convert only (new and changed), here; the version composed in staging: compacted shards, manifest,
rejections, sources table (:mod:`beam_jobs.update.compose`); published (:mod:`beam_jobs.files.version_store`).
This module wires them, under the lock, with a kill at any point leaving the latest version whole.

One path for OUT on disk and in a store (S3, GCS): the version's small files are composed in a staging folder on
the launcher's disk. The pipeline writes its shards into that folder for a local OUT; for OUT in a store it
writes them straight into ``OUT/versions/<N+1>/`` (the cluster's view: Dask or Dataflow workers cannot write
the launcher's disk), and its small files (tables, lists) are fetched into staging to be composed. A store has
no lock: one run at a time is the caller's, as for a conversion. (docs/update.md.)
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import time
from typing import Optional, Sequence, Union

from apache_beam.options.pipeline_options import GoogleCloudOptions

import record_schema
from beam_jobs import faults
from beam_jobs.files import filesystems, publish, store_files, version_store
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import AUTO, ConvertOptions
from beam_jobs.pipeline import beam_run, launch, run_plan
from beam_jobs.planning import changes as change_plan
from beam_jobs.planning import discover, resume, stable_ids
from beam_jobs.runtime import interrupt, runners, worker_start
from beam_jobs.sources import source_stamps
from beam_jobs.stages.manifest import ConvertSummary
from beam_jobs.update import checks, compose, kept_hashes, shard_moves
from beam_jobs.update.checks import UpdateRefusedError
from record_files import staging as staging_names
from record_files import versions

logger = logging.getLogger(__name__)


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
            *self._converted_lines(),
            f"  shards:     {counts['reused_shards']} reused, "
            + (f"{counts['masked_shards']} masked (hiding {counts['masked_records']} records in all), "
               if counts.get("masked_shards") else "")
            + f"{counts['new_shards']} new "
            f"({counts['compacted_shards']} that lost records compacted: {counts['recompacted']} records copied"
            + (f"; {counts['emptied_shards']} that lost every record dropped" if counts.get("emptied_shards") else "")
            + ")",
            f"  elapsed:    {self.elapsed_s:.1f} s",
        ])


    def _converted_lines(self) -> list[str]:
        """The version's records and rejections: an image added but rejected is in no record (its reason in the
        version's rejected.jsonl), which "added" alone did not say (the trial's finding)."""
        converted = self.converted
        if converted is None:
            return []
        return [f"  version:    {sum(converted.written.values())} records, {converted.rejected} rejected"
                + (f" (each with its reason in versions/{self.version:05d}/rejected.jsonl)" if converted.rejected else ""),
                # As a conversion's summary says it (review of #59, finding 7); an update drops either side of a
                # leak (a kept record never moves), so not only evaluation images.
                *([f"  dropped:    {converted.dropped} image{'s' if converted.dropped != 1 else ''} copying "
                   f"another split's (--drop-leaks; each with its partner in "
                   f"versions/{self.version:05d}/{record_schema.DROPPED_FILE})"] if converted.dropped else [])]


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
    # Any runner a conversion runs on (Dask: tests/converter/test_update_runners.py): the pipeline is the
    # conversion's own; the comparison, the kept records' files and the composition are the launcher's.
    choice = runners.choose_runner(beam_run.worker_log_args(pipeline_args))
    # OUT in a store is read from here on: its flags (--s3_endpoint_url, credentials) first, as a conversion's.
    FileSystems.set_options(choice.options)
    filesystems.gcs_anonymous_when_asked(choice.options.view_as(GoogleCloudOptions).no_auth)
    store_files.check_inputs_reachable(options)  # no credentials: at once, not after ~9 minutes of retries
    with publish.output_lock(out):  # none in a store (logged): one run at a time is the caller's
        faults.point("locked")
        latest = _latest(out)
        checks.refuse_dropped(out, latest)
        checks.check_options(options, latest.manifest)
        scratch, staging, publishing = publish.new_scratch(out), None, False
        try:
            with interrupt.live_run(last_resort=lambda: resume.last_resort(staging, out, scratch)):
                plan = checks.source_plan(options, scratch)
                checks.check_objects(options, plan, latest.manifest)
                checks.check_row_names(options, plan, out, latest)
                options = run_plan.near_distance_for(options, len(plan.refs))  # as converting all of SRC would
                found = _compare(options, plan, latest, scratch, rehash)
                if found.nothing:
                    logger.info("nothing changed since version %d", latest.number)
                    return UpdateSummary(out, None, latest.number, found.counts(), None,
                                         time.monotonic() - started)
                staging = publish.new_version_staging(out)
                number = latest.number + 1
                converted, staging = _convert(options, plan, found, latest, staging, number, choice, show_progress,
                                              kept_hashes.KeptRecords.of(out, latest.manifest, found))
                compacted, renamed = compose.compact(out, staging, found, latest, number)
                manifest = compose.version_manifest(options, plan, found, latest, number, converted, compacted, staging)
                compose.write_tables(options.out, staging, found, latest, number, converted, renamed, manifest)
                compose.write_card(staging, out, manifest, options.card)  # none for a masked version
                compose.write_sources(found, converted, staging, number, renamed)
            shutil.rmtree(scratch, ignore_errors=True)
            faults.point("before-commit")
            with interrupt.deferred():
                filesystems.remove_folder(publish.work_dir(staging))
                publishing = True  # from here the pointer may be written: the store's folder is the next run's
                version_store.publish(staging, out, number, manifest)
            faults.point("committed")
        except BaseException as err:
            if staging is not None and os.path.exists(staging) and not getattr(err, "kept_staging", None) \
                    and not resume.kept_on_stop(err, staging):
                publish.discard_staging(staging)
            if staging is not None and not publishing and not filesystems.is_local(out):
                _discard_remote(out, latest.number + 1)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = ConvertSummary.from_manifest(out, manifest, time.monotonic() - started)
    return UpdateSummary(out, number, latest.number, manifest["changes"], summary, time.monotonic() - started)


def _latest(out: str) -> version_store.Version:
    """OUT's latest version, once what killed runs left is cleaned (a conversion's staging, an update's version
    above the pointer); refused, naming OUT, when OUT holds no dataset or its store cannot be read."""
    with store_files.reading(out):  # a store's refusal (no credentials, no bucket) names OUT
        publish.recover_and_clean(out)
        if not version_store.existing(out):
            where = "" if filesystems.is_local(out) else " (nothing is there: check the bucket and the prefix)"
            raise UpdateRefusedError(f"--update: {out} holds no converted dataset to update{where}; convert SRC "
                                     "into it first (the same command without --update)")
        version_store.remove_unpublished(out)
        return version_store.read(out, version_store.latest_number(out))


def _discard_remote(out: str, number: int) -> None:
    """A failed update's shards in ``OUT/versions/<N>/`` (in a store), never published: removed now, as the next
    run would remove them (a warning when the store refuses: the next run does it)."""
    try:
        with store_files.reading(out):
            filesystems.remove_folder(store_files.path_in(out, versions.version_dir(number)))
    except store_files.StoreError as err:
        logger.warning("could not remove the unpublished version %d of %s: %s", number, out, err)


def _compare(options: ConvertOptions, plan: discover.InputPlan, latest: version_store.Version, scratch: str,
             rehash: bool) -> change_plan.Changes:
    """SRC's plan compared with the latest version (:func:`beam_jobs.planning.changes.compare`), warning of the
    labels it could not compare."""
    found = change_plan.compare(plan.refs, options.src, plan.classes, version_store.iter_sources(options.out, latest),
                                latest.manifest["classes"], options.val_fraction, options.seed, scratch, rehash,
                                compose.missing_before(options.out, latest),
                                by_class=plan.task == record_schema.TASK_CLASSIFICATION,
                                items=source_stamps.for_plan(options, plan, latest.manifest.get("source_archives")))
    for warning in (checks.unlabelled_warning(options, latest.number, found.unlabelled),
                    checks.unannotated_warning(options, latest.number, found.unannotated)):
        if warning:
            logger.warning(warning)
    return found


def _convert(options: ConvertOptions, plan: discover.InputPlan, found: change_plan.Changes,
             latest: version_store.Version, staging: str, number: int,
             choice: runners.RunnerChoice, show_progress,
             kept_records: kept_hashes.KeptRecords) -> tuple[Optional[dict], str]:
    """Convert ``found.refs`` into ``staging`` as a conversion would; (its manifest, the staging folder used:
    a killed update's, when it resumes one). No refs (only deletions): labels and reports written, no pipeline.
    ``kept_records``: the records the version keeps, which the conversion's duplicate searches compare the new
    images with (a new validation image near a kept training one is a leak). OUT in a store: the pipeline writes
    into ``OUT/versions/<number>/``, and its files but the shards are fetched into ``staging``."""
    counts = collections.Counter(ref.split for ref in found.refs)
    # The run's notes speak of the version: a class is "empty" when it has no record in the whole version, so one
    # without an image to convert, or with records kept (in the shards reused), is not (run_notes skips "unlisted").
    converting = {label for ref in found.refs for label in stable_ids.label_ids(ref)}
    kept = {label for (_, label), count in found.kept_labels.items() if count}
    ids = stable_ids.remap(found.classes, plan.classes)  # an object's listed class id -> the version's
    narrowed = dataclasses.replace(plan, refs=found.refs, classes=found.classes, class_text=found.classes,
                                   listed_objects={ids[label]: n for label, n in plan.listed_objects.items()},
                                   split_counts=dict(counts), carved={}, unlisted=tuple(
                                       name for label, name in enumerate(found.classes)
                                       if label not in converting or label in kept))
    if not found.refs:
        filesystems.write_text(FileSystems.join(staging, record_schema.LABELS_FILE),
                               "".join(name + "\n" for name in found.classes))
        for name in (record_schema.REJECTED_FILE, record_schema.DUPLICATES_FILE):
            filesystems.write_text(FileSystems.join(staging, name), "")
        return None, staging
    # The carve was the update's (stratified by the running totals): the conversion of the new images carves nothing.
    # Their shards are cut to the split's shard size in the latest version (shard_moves.target_bytes), not to the
    # count the whole dataset was cut into (120 new photos make one shard, not 64 of two images), nor by TFDS's
    # rule (a 10% update of a 64-shard dataset would add one file of up to 1 GiB beside shards of a few MB).
    # --max-bad-fraction judges the rejections over the version (kept, converted, rejected), not over the update's
    # few images: one bad object of three new images is not a third of the dataset's.
    budget = compose.version_budget(options.out, found, latest, len(plan.refs), kept_records)
    remote = not filesystems.is_local(options.out)
    target = store_files.path_in(options.out, versions.version_dir(number)) if remote else staging
    try:
        manifest, used = launch.convert_into(dataclasses.replace(options, val_fraction=0.0, shards=AUTO), narrowed,
                                             target, choice, show_progress, budget=budget, kept=kept_records,
                                             shard_bytes=_shard_sizes(latest))
    except beam_run.ConversionFailedError as err:
        if not remote or not err.kept_staging:
            raise
        # Its work is in versions/<N+1>/, which the next run removes (above the pointer): nothing is kept to resume.
        raise beam_run.ConversionFailedError(
            f"the update's conversion failed and nothing was published ({options.out} is unchanged): "
            f"{beam_run.first_line(err.__cause__ or err)}. An update of OUT in a store does not resume: the same "
            "command converts the changed images again") from err.__cause__
    if remote:
        _fetch_small_files(used, manifest, staging)
        return manifest, staging
    return manifest, used


def _shard_sizes(latest: version_store.Version) -> dict[str, float]:
    """Each split's shard size in the latest version (:func:`shard_moves.target_bytes`), which the update's new
    shards are cut to; a split new in this version is sized by TFDS's rule."""
    return {split: shard_moves.target_bytes(entry["shards"])
            for split, entry in latest.manifest["splits"].items() if entry["shards"]}


def _fetch_small_files(folder: str, manifest: dict, staging: str) -> None:
    """The files the pipeline wrote into ``folder`` (in a store) but its shards, their indexes and its work
    folder, copied into the local ``staging``, where the version is composed: records tables and lists of the
    images converted, labels (as many bytes as the change, not N)."""
    shards = {name for split in manifest["splits"].values() for shard in split["shards"]
              for name in (shard["file"], shard.get("dali_index"))}
    for name in store_files.list_files(folder):
        if name not in shards and name.split("/")[0] != staging_names.WORK:
            store_files.download(f"{folder.rstrip('/')}/{name}", os.path.join(staging, name))

