"""``--max-bad-fraction``: a run that rejected more inputs (or objects) than it allows publishes nothing.

In:  the run's rejections by reason (:class:`beam_jobs.stages.count.PartCounts`), the images listed.
Out: nothing, or :class:`TooManyRejectedError` with the rejection report moved beside OUT
     (``OUT.rejected.jsonl``), naming each reason's count and what the commonest asks of the user.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Mapping, Optional

import record_schema
from beam_jobs import annotations
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ConvertOptions
from beam_jobs.stages.count import PartCounts

logger = logging.getLogger(__name__)


class TooManyRejectedError(RuntimeError):
    """More inputs were rejected than --max-bad-fraction allows; nothing was published."""


@dataclasses.dataclass(frozen=True)
class VersionBudget:
    """What an update's version holds beside the images its conversion reads, which ``--max-bad-fraction``
    judges the conversion's rejections with: the fraction is of the version, not of the update's few images
    (docs/update.md, "The error budget of an update").

    ``images_listed``: SRC's images (kept, converted, rejected); ``images_rejected``: those the version keeps
    rejected (unchanged since the version that rejected them; not the images ``--drop-leaks`` left out, which
    a conversion does not count either); ``objects_kept``: the objects of the records it keeps;
    ``objects_rejected``: the objects rejected from those records' images (their lines kept in its report).
    """

    images_listed: int
    images_rejected: int = 0
    objects_kept: int = 0
    objects_rejected: int = 0


def check_error_budget(
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
    report = rejected_report_path(options.out)
    FileSystems.rename([FileSystems.join(staging, record_schema.REJECTED_FILE)], [report])
    ordered = sorted(rejected_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    counted = ", ".join(f"{reason} {count}" for reason, count in ordered)
    if lost:
        counted += f"; and about {lost} more inputs in files refused whole, each named in a warning"
    by_object = sorted(set(rejected_by_reason) & set(annotations.OBJECT_REASONS))
    raise TooManyRejectedError(
        f"{rejected} of {num_listed} files ({fraction:.1%}) were rejected ({counted}), more than "
        f"--max-bad-fraction {options.max_bad_fraction:g}; nothing was published. "
        f"Each file and its reason is in {report}" + "".join(
            f". {hint}" for reason, hint in _REASON_HINTS.items() if rejected_by_reason.get(reason))
        + (f". To publish the other images, raise --max-bad-fraction to {_enough(fraction)}" if rejected < num_listed
           else "")
        + (f". An image rejected for an object that cannot be written ({', '.join(by_object)}) is written without "
           "it with --keep-partial-images" if by_object and not options.encode.keep_partial_images else "")
    )


def _enough(fraction: float) -> str:
    """The smallest --max-bad-fraction of two decimals that lets ``fraction`` pass."""
    return f"{math.ceil(fraction * 100 - 1e-9) / 100:g}"


# What a rejection reason asks of the user, said in the error line when rejections fail the run.
_REASON_HINTS = {
    "absolute-path": "The Parquet rows hold absolute paths of the machine that wrote them and no image bytes: "
                     "pass --local-paths to read those files from this machine",
}


def warn_about_update_rejections(options: ConvertOptions, converted: int, rejected: int, listed: int) -> None:
    """Warn when an update's own images were rejected beyond --max-bad-fraction though the version passed: its
    budget is judged over the version's ``listed`` images (a fresh conversion of SRC would pass too), so an update
    of a few bad images publishes; the warning says so (the review's finding: exit 0 and not a word)."""
    if converted and rejected / converted > options.max_bad_fraction:
        logger.warning("%d of the %d images this update converted were rejected (%.1f%%, more than --max-bad-fraction "
                       "%g): the version was published because the budget is judged over its %d images; each "
                       "rejection and its reason is in the version's %s", rejected, converted,
                       100 * rejected / converted, options.max_bad_fraction, listed, record_schema.REJECTED_FILE)


def check_object_budget(options: ConvertOptions, counts: PartCounts, staging: str,
                        version: Optional[VersionBudget] = None) -> None:
    """Fail, keeping the report, when more objects were rejected than --max-bad-fraction allows of all objects
    (an update's: of the version's, ``version`` holding what it keeps)."""
    rejected = counts.rejected_objects_by_reason()
    bad = sum(rejected.values())
    kept_bad = version.objects_rejected if version else 0
    if kept_bad:
        rejected["rejected before (kept)"] = kept_bad
    total = bad + kept_bad + sum(counts.objects.values()) + (version.objects_kept if version else 0)
    bad += kept_bad
    if not bad - kept_bad or bad / total <= options.max_bad_fraction:
        return
    report = rejected_report_path(options.out)
    FileSystems.rename([FileSystems.join(staging, record_schema.REJECTED_FILE)], [report])
    counted = ", ".join(f"{reason} {count}" for reason, count in sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0])))
    raise TooManyRejectedError(
        f"{bad} of {total} objects ({bad / total:.1%}) were rejected ({counted}), more than --max-bad-fraction "
        f"{options.max_bad_fraction:g}; nothing was published. Each object and its reason is in {report}. To "
        f"publish their images without them, raise --max-bad-fraction to {_enough(bad / total)}")


def rejected_report_path(out: str) -> str:
    """Where the rejection report of a run that exceeded the error budget is kept."""
    return out.rstrip("/") + ".rejected.jsonl"


def remove_rejected_report(out: str) -> None:
    """Remove an earlier failed run's report beside OUT, once a run has published (a warning if it cannot)."""
    path = rejected_report_path(out)
    try:
        if FileSystems.exists(path):
            FileSystems.delete([path])
    except OSError as err:
        logger.warning("could not remove %s: %s", path, err)
