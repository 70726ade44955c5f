"""After the pipeline: what it wrote, read back from staging, checked, told, and made into the manifest.

In:  the staging folder's work files (counts, shard results, duplicates summary, records tables, the rejection
     report), the plan and the options.
Out: the manifest to commit (:func:`beam_jobs.stages.manifest.build_manifest`) and a resumed run's counts; or
     :class:`beam_jobs.pipeline.budgets.TooManyRejectedError` / ``ShardAccountingError`` and nothing published.
"""

from __future__ import annotations

import json
from typing import Optional

import record_schema
from beam_jobs.files import filesystems, work_layout
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import AUTO, ConvertOptions
from beam_jobs.pipeline import budgets, run_notes
from beam_jobs.planning import discover
from beam_jobs.runtime.progress import PHASES, read_progress
from beam_jobs.stages import join_tables
from beam_jobs.stages.count import PartCounts
from beam_jobs.stages.manifest import build_manifest, check_results, publish_skipped
from beam_jobs.stages.write import ShardResult
from beam_jobs.transforms import COUNTS_FILE, DUPLICATES_SUMMARY_FILE
from record_files import staging as staging_names


def checked_manifest(options: ConvertOptions, plan: discover.InputPlan, layout: work_layout.WorkLayout,
                     staging: str, runner: str, resumed: bool,
                     budget: Optional[budgets.VersionBudget] = None) -> tuple[dict, Optional[tuple[int, int]]]:
    """The manifest of what the pipeline wrote into ``staging``, once it passed the error budget and the shards
    add up to the plan; the run's findings logged on the way.

    ``budget``: what the version of an update's conversion holds beside its images, which the error budgets
    judge the run's rejections with (default: the plan alone). Returns the manifest and, for a ``resumed`` run,
    (images this run processed, images the stopped run had validated); None when it processed them all.
    """
    work = layout.work
    counts = PartCounts.from_json(filesystems.read_text(FileSystems.join(work, COUNTS_FILE)))
    run_notes.log_rejections(FileSystems.join(staging, record_schema.REJECTED_FILE))
    listed, already = (budget.images_listed, budget.images_rejected) if budget else (len(plan.refs), 0)
    # (Rejected already: counted as the lost inputs are, as rejected and as listed.)
    budgets.check_error_budget(options, listed - already, counts.rejected_by_reason(), staging,
                               plan.lost_inputs + already)
    if budget:
        budgets.warn_about_update_rejections(options, len(plan.refs), sum(counts.rejected_by_reason().values()),
                                             listed)
    if plan.task == record_schema.TASK_OBJECTS:
        budgets.check_object_budget(options, counts, staging, budget)
        run_notes.warn_about_assumed_frames(counts)
    results = read_results(work)
    check_results(results, counts.accepted_per_split())
    run_notes.warn_about_empty_classes(plan, results, went_with_images=sum(counts.objects_of_rejected.values()))
    if options.val_fraction > 0 and plan.task == record_schema.TASK_CLASSIFICATION:  # objects: carved unstratified
        run_notes.warn_about_uneven_carve(plan, results)
    if options.shards != AUTO:
        run_notes.warn_about_shard_sizes(results)
    duplicates = json.loads(filesystems.read_text(FileSystems.join(work, DUPLICATES_SUMMARY_FILE)))
    run_notes.log_duplicates(duplicates, options.drop_leaks)
    # A resumed run: what it processed (its busiest phase), and the images the stopped run had validated.
    processed = (max(read_progress(work, phase) - read_progress(work, phase, resumed=True) for phase in PHASES),
                 read_progress(work, PHASES[0], resumed=True)) if resumed else None
    return build_manifest(plan, results, counts.rejected_by_reason(), options, duplicates,
                          runner=runner, counts=counts, tables=join_tables.read_entries(layout),
                          skipped_list=publish_skipped(plan, staging)), processed


def read_results(work: str) -> list[ShardResult]:
    """Every shard's result the write stage left in ``work``."""
    matches = FileSystems.match([FileSystems.join(work, staging_names.SHARD_RESULTS_PATTERN)])[0].metadata_list
    return [ShardResult.from_json(filesystems.read_text(meta.path)) for meta in matches]
