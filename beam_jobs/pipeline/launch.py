"""The conversion's launch: the lock on OUT, the plan, the resume, the pipeline, the publish.

In:  the conversion's options (:class:`beam_jobs.options.ConvertOptions`) and Beam's flags.
Out: the dataset at OUT, its manifest committed last (:mod:`beam_jobs.files.publish`); or nothing published and
     an exception naming why (a failed run's finished work kept for the same command to resume).

:func:`run` is what ``python -m converter`` calls; :func:`convert_into` is its conversion without the lock and
the publish, for :mod:`beam_jobs.update`. Each step is another module's: ``run_plan`` lists and plans SRC,
``label_files`` writes the labels and the card, ``beam_run`` runs the pipeline, ``outcome`` reads back what it
wrote and builds the manifest.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Optional, Sequence, Union

from apache_beam.io.filesystem import BeamIOError
from apache_beam.options.pipeline_options import GoogleCloudOptions

from beam_jobs import faults
from beam_jobs.files import filesystems, publish, store_files, work_layout
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import AUTO, ConvertOptions
from beam_jobs.pipeline import beam_run, budgets, first_sources, label_files, outcome, run_notes, run_plan
from beam_jobs.planning import discover, resume
from beam_jobs.planning.shard import plan_shard_counts
from beam_jobs.runtime import interrupt, runners, worker_handler, worker_start
from beam_jobs.sources.archives import compressed
from beam_jobs.stages import list_parts
from beam_jobs.stages.manifest import ConvertSummary

logger = logging.getLogger(__name__)


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
    started, started_ns = time.monotonic(), time.time_ns()
    choice = runners.choose_runner(beam_run.worker_log_args(pipeline_args))
    # Their Beam is imported while SRC is listed (docs/design.md); not where this Beam's workers start as commands
    # (worker_handler.install() found it moved, and stopped the forkserver the CLI may have started).
    if runners.starts_workers(choice) and worker_handler.install():
        worker_start.start_for(options.src, pipeline_args, downsizing=options.encode.max_side is not None)
    # The launcher lists SRC and publishes OUT itself: object stores need the
    # pipeline's flags (--s3_endpoint_url, credentials) before any path is touched.
    FileSystems.set_options(choice.options)
    filesystems.gcs_anonymous_when_asked(choice.options.view_as(GoogleCloudOptions).no_auth)
    out = options.out
    store_files.check_inputs_reachable(options)  # no credentials: at once, not after ~9 minutes of retries
    with publish.output_lock(out):
        faults.point("locked")
        publish.recover_and_clean(out)
        resume.check_out(out, options.overwrite)
        scratch, staging = publish.new_scratch(out), None
        try:
            with interrupt.live_run(last_resort=lambda: resume.last_resort(staging, out, scratch)):
                leftovers = publish.leftover_stagings(out)
                staging = publish.new_staging(out)  # before the plan: the workers may read the tars' headers into it
                plan = run_plan.plan_inputs(options, scratch, run_plan.archive_scanner(options, staging, choice))
                options = run_plan.near_distance_for(options, len(plan.refs))
                choice = runners.sized_for(choice, run_plan.work_of(options, plan))
                record, staging, resumed = _resume_or_start(options, plan, staging, leftovers)
                compressed.place_inflated(plan.inflated, publish.work_dir(staging))
                manifest, processed = _convert(options, plan, record, staging, resumed, choice, show_progress)
                # Version 1's sources table, as an update writes its version's: the first update compares as later ones.
                manifest = first_sources.write_first(options.src, plan, manifest, staging, scratch, started_ns)
                label_files.write_card(staging, out, manifest, label_files.card_of(options.card, plan.stated_license))
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
    budgets.remove_rejected_report(out)
    return ConvertSummary.from_manifest(out, manifest, time.monotonic() - started, *(processed or (None, None)))


def convert_into(options: ConvertOptions, plan: discover.InputPlan, staging: str, choice: runners.RunnerChoice,
                 show_progress: Union[None, bool, str], budget: Optional[budgets.VersionBudget] = None,
                 kept=None, shard_bytes: Optional[dict] = None) -> tuple[dict, str]:
    """Run the conversion of ``plan`` into ``staging`` under OUT's lock, as :func:`run` does, without
    publishing: for :mod:`beam_jobs.update`, which converts the changed images and composes a version.

    Returns the manifest built and the staging folder that holds the work: a killed run's with the same
    work (resumed, ``staging`` removed), else ``staging``. ``budget``: what the version holds beside the images
    converted, which ``--max-bad-fraction`` weighs the run's rejections against (default: the plan alone).
    ``kept``: the records the update keeps (:class:`beam_jobs.update.kept_hashes.KeptRecords`), written into
    the work folder before the pipeline runs, for its duplicate searches to compare the new images with.
    ``shard_bytes``: with ``--shards auto``, each split's shards are cut to about this many bytes where given
    (an update's: the version's shard size), else by TFDS's rule.
    """
    leftovers = [path for path in publish.leftover_stagings(options.out) if path != staging]
    choice = runners.sized_for(choice, run_plan.work_of(options, plan))
    record, staging, resumed = _resume_or_start(options, plan, staging, leftovers, kept)
    compressed.place_inflated(plan.inflated, publish.work_dir(staging))  # where new members' locators point
    manifest, _ = _convert(options, plan, record, staging, resumed, choice, show_progress, budget, kept, shard_bytes)
    return manifest, staging


def _resume_or_start(options: ConvertOptions, plan: discover.InputPlan, staging: str,
                     leftovers: Sequence[str], kept=None) -> tuple[resume.RunRecord, str, bool]:
    """The run's parts written, and the staging folder to convert into: a killed run's among ``leftovers`` that
    holds the same parts (``staging`` then removed; True), else ``staging``, whose run record is saved so that
    from here on a killed run can be resumed (False)."""
    part_size = list_parts.choose_part_size(len(plan.refs), options.part_size, plan.read_unit)
    layout = _layout(options, plan, staging, part_size, kept)
    record = resume.record_for(options, plan, part_size, list_parts.write_parts(layout, plan.refs, part_size))
    resumed = resume.choose(leftovers, record)
    if resumed:  # continue there: this run's parts are the same as the ones it holds
        publish.discard_staging(staging)
        return record, resumed, True
    resume.save(layout.work, record)
    return record, staging, False


def _convert(
    options: ConvertOptions,
    plan: discover.InputPlan,
    record: resume.RunRecord,
    staging: str,
    resumed: bool,
    choice: runners.RunnerChoice,
    show_progress: Union[None, bool, str],
    budget: Optional[budgets.VersionBudget] = None,
    kept=None,
    shard_bytes: Optional[dict] = None,
) -> tuple[dict, Optional[tuple[int, int]]]:
    """Run the pipeline into ``staging`` (a killed run's, when ``resumed``) and check what it wrote.

    Returns the manifest to commit and, for a resumed run, how many images this run processed (the
    summary's rate counts those, not the ones the stopped run had done) and how many the stopped run had
    validated; None when it processed them all.
    """
    planned = None if options.shards == AUTO else plan_shard_counts(plan.split_sizes(), options.shards)
    layout = _layout(options, plan, staging, record.part_size, kept)
    if resumed:
        run_notes.log_resume(layout)
        _drop_progress_counts(layout)
    label_files.write_label_files(staging, plan)
    faults.point("listed")
    if kept is not None:  # an update's kept records, for the searches (a resumed run's are found whole)
        kept.write(layout)
    beam_run.run_pipeline(options, plan, layout, staging, planned, choice, show_progress, shard_bytes)
    faults.point("pipeline-done")
    return outcome.checked_manifest(options, plan, layout, staging, choice.description, resumed, budget)


def _layout(options: ConvertOptions, plan: discover.InputPlan, staging: str, part_size: int,
            kept=None) -> work_layout.WorkLayout:
    return work_layout.plan_layout(publish.work_dir(staging), plan.split_sizes(), part_size,
                                   run_plan.near_bands(options), *((kept.count, kept.chunk) if kept else ()))


def _drop_progress_counts(layout: work_layout.WorkLayout) -> None:
    """Remove the killed run's progress counts: the resumed run counts again (its own progress, its own rate)."""
    stale = FileSystems.match([FileSystems.join(layout.work, f"{phase}-*.txt") for phase in ("validate", "write")])
    paths = [meta.path for match in stale for meta in match.metadata_list]
    if paths:
        FileSystems.delete(paths)
