"""What a finished run tells the user: each rejection, classes left empty, frames assumed, shard sizes, splits
carved unevenly, duplicates found, a resumed run's progress.

In:  the run's counts, shard results, duplicates summary and rejection report (read back by ``outcome``).
Out: log lines on this package's logger; nothing else (the checks that fail a run are ``budgets``).
"""

from __future__ import annotations

import json
import logging
from typing import Sequence

from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs.files import work_layout
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.planning import carve, discover
from beam_jobs.planning.shard import shard_size_warning
from beam_jobs.stages.count import PartCounts
from beam_jobs.stages.write import ShardResult
from record_files import staging as staging_names

logger = logging.getLogger(__name__)


def log_rejections(report: str) -> None:
    """Log each rejection here, once, in path order: worker logs go elsewhere on remote runners.

    Streamed from the report, so a million rejections cost no memory.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    with FileSystems.open(report, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for raw in handle:
            item = json.loads(raw)
            logger.info("rejected %s (%s): %s", item["path"], item["reason"], item["detail"])


def warn_about_empty_classes(plan: discover.InputPlan, results: Sequence[ShardResult],
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


def warn_about_uneven_carve(plan: discover.InputPlan, results: Sequence[ShardResult]) -> None:
    """``--val-fraction`` carved a class's images unevenly (too few to split): say which (classification only)."""
    counts = [_label_counts(results, split, len(plan.classes)) for split in ("train", "validation")]
    for warning in carve.unstratified(plan.classes, *counts, plan.carved):
        logger.warning("%s", warning)


def _label_counts(results: Sequence[ShardResult], split: str, classes: int) -> list[int]:
    """Records of each label in ``split``'s shards."""
    counts = [0] * classes
    for result in results:
        if result.split == split:
            for label, count in result.label_counts.items():
                counts[label] += count
    return counts


def warn_about_assumed_frames(counts: PartCounts) -> None:
    """Images whose size fits both the stored and the upright frame (EXIF orientations 2-4, square turned
    images): which frame their boxes were taken to be in is a convention, so say it and how to choose."""
    for frame, (count, examples) in sorted(counts.assumed_frames.items()):
        logger.warning("%d images are EXIF-turned with a size that fits both frames (%s%s): their boxes were taken "
                       "in the %s frame; pass --annotation-frame stored or upright to say which the annotations use",
                       count, ", ".join(discover.display_path(p) for p in examples), " ..." if count > len(examples) else "",
                       frame)


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def warn_about_shard_sizes(results: Sequence[ShardResult]) -> None:
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


def log_duplicates(duplicates: dict, drop_leaks: bool) -> None:
    """Identical images across labels or splits, and near-duplicate groups across splits: where to look."""
    if duplicates["num_cross_label"] or duplicates["num_cross_split"]:
        logger.info(
            "%d identical images carry different labels and %d sit in more than one split (see %s, "
            "or python -m converter inspect)",
            duplicates["num_cross_label"], duplicates["num_cross_split"], record_schema.DUPLICATES_FILE,
        )
    if duplicates["num_near_cross_split"]:
        logger.info("%d groups of near-duplicates (perceptual hashes within %d bits) span splits (see %s)%s",
                    duplicates["num_near_cross_split"], duplicates["near_threshold"], record_schema.DUPLICATES_FILE,
                    ("" if drop_leaks else "; --drop-leaks leaves their evaluation copies out (under --update, a new "
                                            "image's copy of a kept one, whichever its split)"))


def log_resume(layout: work_layout.WorkLayout) -> None:
    """Say what a resumed run finds done."""
    done = len(FileSystems.match([FileSystems.join(layout.work, staging_names.COUNTS_PATTERN)])[0].metadata_list)
    shards = len(FileSystems.match([FileSystems.join(layout.work, staging_names.SHARD_RESULTS_PATTERN)])[0].metadata_list)
    logger.warning("resuming the interrupted run with the same inputs and options: %d of %d parts validated, "
                   "%d shards written", done, layout.num_parts, shards)
