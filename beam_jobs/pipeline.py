"""Launch the conversion: list, plan, run the Beam pipeline, check, and publish.

:func:`run` is what ``python -m converter`` calls. It holds the lock on OUT,
lists SRC, runs :class:`beam_jobs.transforms.ConvertImages` into a private
staging folder on any Beam runner, checks the error budget and that the
shards add up, builds the manifest and commits the dataset atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Iterator, Mapping, Optional, Sequence, Union

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.options.pipeline_options import GoogleCloudOptions

import record_schema
from beam_jobs import faults, sources
from beam_jobs.files import filesystems, publish, work_layout
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_records import WorkFileError
from beam_jobs.options import AUTO, DEFAULT_NEAR_DISTANCE, ConvertOptions
from beam_jobs.planning import carve, discover, resume
from beam_jobs.planning.shard import plan_shard_counts, shard_size_warning
from beam_jobs.runtime import interrupt, runners, worker_start
from beam_jobs.runtime.progress import PHASES, ProgressBars, choose_mode, read_progress
from beam_jobs.sources.archives import archive_scan, archives, compressed, member_reads
from beam_jobs.stages import list_parts, perceptual_hash
from beam_jobs.stages import join_tables
from beam_jobs.stages.count import PartCounts
from beam_jobs.stages.manifest import ConvertSummary, build_manifest, check_results, publish_skipped
from beam_jobs.stages.order_bucket import BucketCountError
from beam_jobs.stages.write import ShardResult, SourceChangedError
from beam_jobs.transforms import COUNTS_FILE, DUPLICATES_SUMMARY_FILE, ConvertImages
from record_files import croissant, dataset_card
from record_files import staging as staging_names
from record_files.dataset_card import DatasetCard

logger = logging.getLogger(__name__)


class ConversionFailedError(RuntimeError):
    """The Beam pipeline failed (a worker raised, a disk filled up...); nothing was published.

    ``kept_staging`` holds the finished work: the same command, run again once
    the cause is fixed, resumes from it (a run with other inputs or options removes it).
    """

    def __init__(self, message: str, kept_staging: Optional[str] = None) -> None:
        super().__init__(message)
        self.kept_staging = kept_staging


class TooManyRejectedError(RuntimeError):
    """More inputs were rejected than --max-bad-fraction allows; nothing was published."""


def run(
    options: ConvertOptions,
    pipeline_args: Sequence[str] = (),
    show_progress: Union[None, bool, str] = None,
) -> ConvertSummary:
    """Convert ``options.src`` into a published dataset at ``options.out``.

    Args:
      options: the conversion's own options.
      pipeline_args: Beam pipeline flags (``--runner``, ``--direct_num_workers``...).
      show_progress: True: tqdm bars; False: nothing; "auto" (the CLI's): bars on a terminal, else a
        progress line every 30 s and at each phase's end; None: bars for local runs whose stderr is a
        terminal, else nothing.

    Returns:
      What was written; the dataset is complete at ``options.out``.

    Raises:
      discover.InputError: SRC or --labels is unusable.
      publish.PublishError: OUT cannot be (over)written.
      TooManyRejectedError: the error budget was exceeded; nothing published.
      ConversionFailedError: the pipeline failed (disk full, an input changed
        during the run...); nothing published. Its ``kept_staging`` holds the
        finished work the same call resumes from (None when the work was stale).
      interrupt.Interrupted: SIGINT, SIGTERM or SIGHUP stopped the run (in the main
        thread); nothing published unless ``published`` says the commit had begun.
    """
    with interrupt.handled(), worker_start.stopped_after():  # no forkserver outlives the run (a notebook's kernel)
        return _run(options, pipeline_args, show_progress)


def _run(options: ConvertOptions, pipeline_args: Sequence[str], show_progress: Union[None, bool, str]) -> ConvertSummary:
    started = time.monotonic()
    choice = runners.choose_runner(_with_worker_log_level(pipeline_args))
    if runners.starts_workers(choice):  # their Beam is imported while SRC is listed (docs/design.md)
        worker_start.start_for(options.src, pipeline_args, downsizing=options.encode.max_side is not None)
    # The launcher lists SRC and publishes OUT itself: object stores need the
    # pipeline's flags (--s3_endpoint_url, credentials) before any path is touched.
    FileSystems.set_options(choice.options)
    filesystems.gcs_anonymous_when_asked(choice.options.view_as(GoogleCloudOptions).no_auth)
    out = options.out
    with publish.output_lock(out):
        faults.point("locked")
        publish.recover_and_clean(out)
        resume.check_out(out, options.overwrite)
        scratch, staging = publish.new_scratch(out), None
        try:
            with interrupt.live_run(last_resort=lambda: resume.last_resort(staging, out, scratch)):
                leftovers = publish.leftover_stagings(out)
                staging = publish.new_staging(out)  # before the plan: the workers may read the tars' headers into it
                plan = _plan(options, scratch, _archive_scanner(options, staging, choice))
                options = _near_distance_for(options, len(plan.refs))
                choice = runners.sized_for(choice, _work_of(options, plan))
                part_size = list_parts.choose_part_size(len(plan.refs), options.part_size, plan.read_unit)
                layout = work_layout.plan_layout(publish.work_dir(staging), plan.split_sizes(), part_size,
                                                 _near_bands(options))
                record = resume.record_for(options, plan, part_size,
                                           list_parts.write_parts(layout, plan.refs, part_size))
                resumed = resume.choose(leftovers, record)
                if resumed:  # continue there: this run's parts are the same as the ones it holds
                    publish.discard_staging(staging)
                    staging = resumed
                else:
                    resume.save(layout.work, record)  # from here on, a killed run can be resumed
                compressed.place_inflated(plan.inflated, publish.work_dir(staging))
                manifest, processed = _convert(options, plan, record, staging, bool(resumed), choice, show_progress)
                _write_card(staging, out, manifest, _card_of(options.card, plan.stated_license))
            # The plan's lists are read by now: a run killed while it publishes leaves no scratch behind (in
            # /tmp when OUT is in an object store).
            shutil.rmtree(scratch, ignore_errors=True)
            faults.point("before-commit")
            with interrupt.deferred():  # a signal now takes effect once the dataset is whole
                publish.commit(staging, out, manifest)
            faults.point("committed")
        except BaseException as err:
            if staging is not None and not getattr(err, "kept_staging", None) and not resume.kept_on_stop(err, staging):
                try:
                    publish.discard_staging(staging)
                except (OSError, BeamIOError) as err:
                    logger.warning("could not remove %s: %s", staging, err)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    _remove_quietly(_rejected_report_path(out))
    return ConvertSummary.from_manifest(out, manifest, time.monotonic() - started, *(processed or (None, None)))


def convert_into(options: ConvertOptions, plan: discover.InputPlan, staging: str, choice: runners.RunnerChoice,
                 show_progress: Union[None, bool, str], budget: Optional[tuple[int, int]] = None) -> tuple[dict, str]:
    """Run the conversion of ``plan`` into ``staging`` under OUT's lock, as :func:`run` does, without
    publishing: for :mod:`beam_jobs.update`, which converts the changed images and composes a version.

    Returns the manifest built and the staging folder that holds the work: a killed run's with the same
    work (resumed, ``staging`` removed), else ``staging``. ``budget``: (images listed, rejected already) of the
    whole dataset, which ``--max-bad-fraction`` weighs the run's rejections against (default: the plan alone).
    """
    leftovers = [path for path in publish.leftover_stagings(options.out) if path != staging]
    choice = runners.sized_for(choice, _work_of(options, plan))
    part_size = list_parts.choose_part_size(len(plan.refs), options.part_size, plan.read_unit)
    layout = work_layout.plan_layout(publish.work_dir(staging), plan.split_sizes(), part_size, _near_bands(options))
    record = resume.record_for(options, plan, part_size, list_parts.write_parts(layout, plan.refs, part_size))
    resumed = resume.choose(leftovers, record)
    if resumed:
        publish.discard_staging(staging)
        staging = resumed
    else:
        resume.save(layout.work, record)
    manifest, _ = _convert(options, plan, record, staging, bool(resumed), choice, show_progress, budget)
    return manifest, staging


def _plan(options: ConvertOptions, scratch: str, scanner: archives.Scanner) -> discover.InputPlan:
    """List SRC into ``scratch`` and plan the conversion; log what was skipped and any warnings."""
    plan = sources.plan_inputs(options, scratch, scanner)
    if plan.skipped:
        logger.info("skipped without reading: %s", plan.skipped)
    for warning in plan.warnings:
        logger.warning("%s", warning)
    return plan


# Past this many images, no run is small enough for one process: their bytes are not looked at.
_SIZED_UP_TO = 5_000


def _work_of(options: ConvertOptions, plan: discover.InputPlan) -> runners.Work:
    """The run's work, as the rule that runs small runs in one process weighs it (runners.sized_for)."""
    count = len(plan.refs)
    stored = member_reads.input_bytes(options.src, plan.refs, _SIZED_UP_TO) if count <= _SIZED_UP_TO else 0
    return runners.Work(count, stored if count <= _SIZED_UP_TO else count * member_reads.UNKNOWN_ITEM_BYTES,
                        downsizing=options.encode.max_side is not None)


def _archive_scanner(options: ConvertOptions, staging: str, choice: runners.RunnerChoice) -> archives.Scanner:
    """Reads the headers of SRC's tars on the run's workers, into the staging folder (see --archive-scan)."""
    folder = FileSystems.join(publish.work_dir(staging), "member-tables")

    def run(build) -> None:
        try:
            with beam.Pipeline(runner=choice.runner, options=choice.options) as scan:
                build(scan)
        except Exception:
            interrupt.raise_if_received()  # a worker that died of the user's Ctrl-C or SIGTERM is the stop
            raise

    return lambda units: archive_scan.scan_on_workers(units, folder, run, options.archive_scan)


def _convert(
    options: ConvertOptions,
    plan: discover.InputPlan,
    record: resume.RunRecord,
    staging: str,
    resumed: bool,
    choice: runners.RunnerChoice,
    show_progress: Union[None, bool, str],
    budget: Optional[tuple[int, int]] = None,
) -> tuple[dict, Optional[int]]:
    """Run the pipeline into ``staging`` (a killed run's, when ``resumed``).

    Returns the manifest to commit and, for a resumed run, how many images this run processed (the
    summary's rate counts those, not the ones the stopped run had done) and how many the stopped run had
    validated; None when it processed them all.
    """
    work = publish.work_dir(staging)
    planned = None if options.shards == AUTO else plan_shard_counts(plan.split_sizes(), options.shards)
    layout = work_layout.plan_layout(work, plan.split_sizes(), record.part_size, _near_bands(options))
    if resumed:
        _log_resume(layout)
    filesystems.write_text(FileSystems.join(staging, record_schema.LABELS_FILE), "".join(c + "\n" for c in plan.classes))
    if plan.task in (record_schema.TASK_OBJECTS, record_schema.TASK_SEGMENTATION):
        filesystems.write_text(FileSystems.join(staging, record_schema.LABEL_MAP_FILE), label_map(plan.classes))
    faults.point("listed")

    progress = choose_mode(show_progress, choice.local, sys.stderr)
    with ProgressBars(work, len(plan.refs), enabled=progress, parts=layout.num_parts), _private_tempdir(work):
        try:
            with beam.Pipeline(runner=choice.runner, options=choice.options) as pipeline:
                _ = (
                    pipeline
                    # Create spreads its elements over the workers itself (a Reshuffle inside,
                    # or partitions on Dask), so no further reshuffle is needed.
                    | "ListParts" >> beam.Create(range(layout.num_parts), reshuffle=True)
                    | "ConvertImages" >> ConvertImages(options, staging, plan.classes, plan.class_text or plan.classes,
                                                       planned, layout, plan.task)
                )
        except Exception as err:  # runners re-raise worker errors as assorted types; name the outcome
            # A worker that died of the user's Ctrl-C or SIGTERM (sent to the whole group) is the stop.
            interrupt.raise_if_received()
            failed = f"the conversion failed and nothing was published ({options.out} is unchanged): {_first_line(err)}"
            if not _work_is_sound(err):
                raise ConversionFailedError(failed) from err
            # Kept, as a killed run's is: what failed (a full disk, a lost connection, a worker's memory) is
            # usually fixed without touching the inputs, and hours of finished work should survive it.
            raise ConversionFailedError(
                f"{failed}. Its finished work is kept in {staging}: the same command resumes from it once the cause "
                "is fixed (a run with other inputs or options removes it, as may you)", kept_staging=staging) from err

    faults.point("pipeline-done")
    counts = PartCounts.from_json(filesystems.read_text(FileSystems.join(work, COUNTS_FILE)))
    _log_rejections(FileSystems.join(staging, record_schema.REJECTED_FILE))
    listed, already = budget or (len(plan.refs), 0)
    # (Rejected already: counted as the lost inputs are, as rejected and as listed.)
    _check_error_budget(options, listed - already, counts.rejected_by_reason(), staging, plan.lost_inputs + already)
    if plan.task == record_schema.TASK_OBJECTS:
        _check_object_budget(options, counts, staging)
        _warn_about_assumed_frames(counts)
    results = _read_results(work)
    check_results(results, counts.accepted_per_split())
    _warn_about_empty_classes(plan, results, went_with_images=sum(counts.objects_of_rejected.values()))
    if options.val_fraction > 0 and plan.task == record_schema.TASK_CLASSIFICATION:  # objects: carved unstratified
        for warning in carve.unstratified(plan.classes, *(_label_counts(results, split, len(plan.classes))
                                                          for split in ("train", "validation")), plan.carved):
            logger.warning("%s", warning)
    if options.shards != AUTO:
        _warn_about_shard_sizes(results)
    duplicates = json.loads(filesystems.read_text(FileSystems.join(work, DUPLICATES_SUMMARY_FILE)))
    if duplicates["num_cross_label"] or duplicates["num_cross_split"]:
        logger.info(
            "%d identical images carry different labels and %d sit in more than one split (see %s, "
            "or python -m converter inspect)",
            duplicates["num_cross_label"], duplicates["num_cross_split"], record_schema.DUPLICATES_FILE,
        )
    if duplicates["num_near_cross_split"]:
        logger.info("%d groups of near-duplicates (perceptual hashes within %d bits) span splits (see %s)%s",
                    duplicates["num_near_cross_split"], duplicates["near_threshold"], record_schema.DUPLICATES_FILE,
                    "" if options.drop_leaks else "; --drop-leaks leaves their evaluation copies out")
    # A resumed run: what it processed (its busiest phase), and the images the stopped run had validated.
    processed = (max(read_progress(work, phase) - read_progress(work, phase, resumed=True) for phase in PHASES),
                 read_progress(work, PHASES[0], resumed=True)) if resumed else None
    return build_manifest(plan, results, counts.rejected_by_reason(), options, duplicates,
                          runner=choice.description, counts=counts, tables=join_tables.read_entries(layout),
                          skipped_list=publish_skipped(plan, staging)), processed


def _near_distance_for(options: ConvertOptions, images: int) -> ConvertOptions:
    """``options`` with ``--near-distance auto`` resolved for ``images`` (the widest distance up to the default
    whose search stays linear in N), and a warning for a distance given that compares more pairs than auto's."""
    if options.near_distance == AUTO:
        return dataclasses.replace(options, near_distance=perceptual_hash.auto_distance(images, DEFAULT_NEAR_DISTANCE))
    if options.encode.perceptual_hash:
        _warn_about_a_wide_search(options.near_distance, images)
    return options


def _warn_about_a_wide_search(distance: int, images: int) -> None:
    """A ``--near-distance`` that compares more pairs an image than auto allows: say what it costs at this size.

    The bands get narrower as the distance grows (64 bits in ``distance + 1`` bands), so a band value holds a
    larger share of the images and the pairs compared grow as the square of the images with a larger factor
    (:func:`beam_jobs.stages.perceptual_hash.expected_candidates`).
    """
    pairs = perceptual_hash.expected_candidates(max(images, 2), distance)
    if pairs <= perceptual_hash.MAX_COMPARISONS_PER_IMAGE * images:
        return
    logger.warning(
        "--near-distance %d compares about %.2g pairs of perceptual hashes at %d images (%.0f an image, where "
        "auto allows %d) and grows with the square of the images; groups also join unrelated photos through "
        "chains of near pairs", distance, pairs, images, pairs / max(images, 1),
        perceptual_hash.MAX_COMPARISONS_PER_IMAGE)


def _near_bands(options: ConvertOptions) -> int:
    """Bands the near search compares perceptual hashes by (``--near-distance`` + 1); 0: no near search."""
    return options.near_distance + 1 if options.encode.perceptual_hash else 0


def _card_of(card: Optional[DatasetCard], stated_license: Sequence[str]) -> Optional[DatasetCard]:
    """The user's card, with the licence the source's README states (``(licence, file)``) when it gives none."""
    return dataset_card.with_stated_license(card, *stated_license) if stated_license else card


def _write_card(staging: str, out: str, manifest: dict, card: Optional[DatasetCard]) -> None:
    """``croissant.json`` into staging beside the manifest the commit writes: published with it or not at all."""
    name = os.path.basename(out.rstrip("/"))
    text = croissant.croissant_text(croissant.build_croissant(manifest, card, folder_name=name))
    filesystems.write_text(FileSystems.join(staging, croissant.CROISSANT_FILE), text)


def label_map(classes: Sequence[str]) -> str:
    """The TF Object Detection API's label map (``item { id: 1 name: 'cat' }``) of the classes that have a name."""
    def quoted(name: str) -> str:
        return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "".join(f"item {{\n  id: {index}\n  name: {quoted(name)}\n}}\n" for index, name in enumerate(classes)
                   if name)


# Failures that say the finished work itself is wrong: resuming it would fail the same way.
_UNSOUND_WORK = (SourceChangedError, WorkFileError, BucketCountError)


def _work_is_sound(err: BaseException) -> bool:
    """False when a pipeline failure says the work is stale or inconsistent (an input changed under the run...).

    Runners re-raise a worker's error as its own type (in process) or as text
    holding its traceback (worker processes), so both are looked at.
    """
    seen: Optional[BaseException] = err
    while seen is not None:
        if isinstance(seen, _UNSOUND_WORK):
            return False
        seen = seen.__cause__ or seen.__context__
    return not any(kind.__name__ in str(err) for kind in _UNSOUND_WORK)


def _warn_about_empty_classes(plan: discover.InputPlan, results: Sequence[ShardResult],
                              went_with_images: int = 0) -> None:
    """A class whose every file was rejected is published with no records: say so, naming it (an object
    dataset's objects may also have gone with their rejected images: ``went_with_images`` of them did)."""
    if plan.task == record_schema.TASK_SEGMENTATION:
        return  # a mask's classes are its pixels' values: the records count none, so nothing here says "empty"
    written: set[int] = set()
    for result in results:
        written.update(label for label, count in result.label_counts.items() if count)
    empty = [name for label, name in enumerate(plan.classes)
             if label not in written and name and name not in plan.unlisted]  # "": an id the source leaves unused
    if plan.task == record_schema.TASK_OBJECTS:  # an object's class: none listed, or all of them rejected?
        unused = [name for label, name in enumerate(plan.classes) if name in empty and not plan.listed_objects.get(label)]
        if unused:
            logger.warning("%d of the %d classes have no objects in the annotations, so none in the records: %s",
                           len(unused), sum(1 for name in plan.classes if name), _few(unused))
        empty = [name for name in empty if name not in set(unused)]
    if empty:
        noun = "class has" if len(empty) == 1 else "classes have"
        shown = _few(empty)
        logger.warning("%d %s no records: every %s listed for %s was rejected%s (%s): %s", len(empty), noun,
                       "object" if plan.task == record_schema.TASK_OBJECTS else "file",
                       "it" if len(empty) == 1 else "them",
                       " or went with its rejected image" if went_with_images else "", record_schema.REJECTED_FILE,
                       shown)


def _label_counts(results: Sequence[ShardResult], split: str, classes: int) -> list[int]:
    """Records of each label in ``split``'s shards."""
    counts = [0] * classes
    for result in results:
        if result.split == split:
            for label, count in result.label_counts.items():
                counts[label] += count
    return counts


def _warn_about_assumed_frames(counts: PartCounts) -> None:
    """Images whose size fits both the stored and the upright frame (EXIF orientations 2-4, square turned
    images): which frame their boxes were taken to be in is a convention, so say it and how to choose."""
    for frame, (count, examples) in sorted(counts.assumed_frames.items()):
        logger.warning("%d images are EXIF-turned with a size that fits both frames (%s%s): their boxes were taken "
                       "in the %s frame; pass --annotation-frame stored or upright to say which the annotations use",
                       count, ", ".join(discover.display_path(p) for p in examples), " ..." if count > len(examples) else "",
                       frame)


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _warn_about_shard_sizes(results: Sequence[ShardResult]) -> None:
    """An explicit --shards that made shards over ~1 GiB or under 10 MB is worth a warning (auto avoids both)."""
    by_split: dict[str, list[ShardResult]] = {}
    for result in results:
        by_split.setdefault(result.split, []).append(result)
    for split in record_schema.SPLITS:
        shards = by_split.get(split)
        if shards:
            warning = shard_size_warning(split, sum(s.num_bytes for s in shards), len(shards))
            if warning:
                logger.warning("%s", warning)


def _log_resume(layout: work_layout.WorkLayout) -> None:
    """Say what a resumed run finds done; drop the killed run's progress counts (this run counts again)."""
    done = len(FileSystems.match([FileSystems.join(layout.work, staging_names.COUNTS_PATTERN)])[0].metadata_list)
    shards = len(FileSystems.match([FileSystems.join(layout.work, staging_names.SHARD_RESULTS_PATTERN)])[0].metadata_list)
    logger.warning("resuming the interrupted run with the same inputs and options: %d of %d parts validated, "
                   "%d shards written", done, layout.num_parts, shards)
    stale = FileSystems.match([FileSystems.join(layout.work, f"{phase}-*.txt") for phase in ("validate", "write")])
    paths = [meta.path for match in stale for meta in match.metadata_list]
    if paths:
        FileSystems.delete(paths)


def _log_rejections(report: str) -> None:
    """Log each rejection here, once, in path order: worker logs go elsewhere on remote runners.

    Streamed from the report, so a million rejections cost no memory.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    with FileSystems.open(report, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for raw in handle:
            item = json.loads(raw)
            logger.info("rejected %s (%s): %s", item["path"], item["reason"], item["detail"])


def _with_worker_log_level(pipeline_args: Sequence[str]) -> list[str]:
    """``pipeline_args`` plus the workers' log level, unless given: as quiet as the caller's logging asks.

    Beam's workers log their start-up, internal flags and shutdown at INFO (about
    40 lines a run); failures reach the launcher through the control channel
    and are reported once. So they log at INFO only when this package's logger
    is enabled for INFO (``-v``, or a caller's ``logging`` set-up), and only
    CRITICAL lines otherwise.
    """
    args = list(pipeline_args)
    if not any(arg.startswith("--default_sdk_harness_log_level") for arg in args):
        level = "CRITICAL"
        if logging.getLogger("beam_jobs").isEnabledFor(logging.INFO):
            # The CLI's -v keeps Beam's loggers at WARNING: the workers' start-up lines are Beam's INFO chatter.
            level = "INFO" if logging.getLogger("apache_beam").isEnabledFor(logging.INFO) else "WARNING"
        args.append(f"--default_sdk_harness_log_level={level}")
    return args


def _first_line(err: BaseException) -> str:
    """The gist of a runner's error: the last line that names an exception, without Beam's stack dump."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.split(":")[0]]
    return (named[-1] if named else lines[-1] if lines else type(err).__name__)[:500]


def _check_error_budget(
    options: ConvertOptions, num_listed: int, rejected_by_reason: Mapping[str, int], staging: str, lost: int = 0
) -> None:
    """Fail, keeping the rejection report beside OUT, when too many inputs were rejected.

    ``lost``: inputs held by containers refused whole beyond the one rejection each is (a cut Parquet file's
    rows): they count as rejected inputs.
    """
    rejected = sum(rejected_by_reason.values()) + lost
    num_listed += lost
    fraction = rejected / num_listed
    if fraction <= options.max_bad_fraction and rejected < num_listed:
        return
    report = _rejected_report_path(options.out)
    FileSystems.rename([FileSystems.join(staging, record_schema.REJECTED_FILE)], [report])
    ordered = sorted(rejected_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    counted = ", ".join(f"{reason} {count}" for reason, count in ordered)
    if lost:
        counted += f"; and about {lost} more inputs in files refused whole, each named in a warning"
    raise TooManyRejectedError(
        f"{rejected} of {num_listed} files ({fraction:.1%}) were rejected ({counted}), more than "
        f"--max-bad-fraction {options.max_bad_fraction:g}; nothing was published. "
        f"Each file and its reason is in {report}" + "".join(
            f". {hint}" for reason, hint in _REASON_HINTS.items() if rejected_by_reason.get(reason))
    )


# What a rejection reason asks of the user, said in the error line when rejections fail the run.
_REASON_HINTS = {
    "absolute-path": "The Parquet rows hold absolute paths of the machine that wrote them and no image bytes: "
                     "pass --local-paths to read those files from this machine",
}


def _check_object_budget(options: ConvertOptions, counts: PartCounts, staging: str) -> None:
    """Fail, keeping the report, when more objects were rejected than --max-bad-fraction allows of all objects."""
    rejected = counts.rejected_objects_by_reason()
    bad = sum(rejected.values())
    total = bad + sum(counts.objects.values())
    if not bad or bad / total <= options.max_bad_fraction:
        return
    report = _rejected_report_path(options.out)
    FileSystems.rename([FileSystems.join(staging, record_schema.REJECTED_FILE)], [report])
    counted = ", ".join(f"{reason} {count}" for reason, count in sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0])))
    raise TooManyRejectedError(
        f"{bad} of {total} objects ({bad / total:.1%}) were rejected ({counted}), more than --max-bad-fraction "
        f"{options.max_bad_fraction:g}; nothing was published. Each object and its reason is in {report}")


def _rejected_report_path(out: str) -> str:
    """Where the rejection report of a run that exceeded the error budget is kept."""
    return out.rstrip("/") + ".rejected.jsonl"


@contextlib.contextmanager
def _private_tempdir(work: str) -> Iterator[None]:
    """Point temporary files of the runner and its local workers at a folder removed afterwards.

    Beam's portable local runners leave empty ``beam-temp*`` and ``tmp*``
    folders in the system temp folder on every run; this keeps them contained.
    Local worker processes inherit ``TMPDIR``. The folder is inside the run's
    local work folder when there is one, so even a killed run's temporary
    files go when the next run clears its staging folder.
    """
    folder = tempfile.mkdtemp(prefix="tmp-", dir=work if os.path.isdir(work) else None)
    saved_env, saved_default = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield
    finally:
        tempfile.tempdir = saved_default
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(folder, ignore_errors=True)


def _read_results(work: str) -> list[ShardResult]:
    matches = FileSystems.match([FileSystems.join(work, staging_names.SHARD_RESULTS_PATTERN)])[0].metadata_list
    return [ShardResult.from_json(filesystems.read_text(meta.path)) for meta in matches]


def _remove_quietly(path: str) -> None:
    try:
        if FileSystems.exists(path):
            FileSystems.delete([path])
    except OSError as err:
        logger.warning("could not remove %s: %s", path, err)


# What beam_jobs.update, which runs a conversion of the changed images into a version, takes from a run's steps.
plan_inputs = _plan
worker_log_args = _with_worker_log_level
write_card = _write_card
near_distance_for = _near_distance_for
