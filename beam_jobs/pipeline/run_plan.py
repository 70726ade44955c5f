"""What a conversion will do, decided before its pipeline runs: SRC listed and planned, the work weighed, the
near-duplicate search's distance chosen.

In:  the conversion's options; a scratch folder for the listing; the runner chosen.
Out: the plan (:class:`beam_jobs.planning.discover.InputPlan`), the work the size rule weighs
     (:func:`beam_jobs.runtime.runners.sized_for`), the options with ``--near-distance auto`` resolved.
"""

from __future__ import annotations

import dataclasses
import logging

import apache_beam as beam

from beam_jobs import sources
from beam_jobs.files import publish
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import AUTO, DEFAULT_NEAR_DISTANCE, ConvertOptions
from beam_jobs.planning import discover
from beam_jobs.runtime import interrupt, runners
from beam_jobs.sources.archives import archive_scan, archives, member_reads
from beam_jobs.stages import perceptual_hash

logger = logging.getLogger(__name__)


def plan_inputs(options: ConvertOptions, scratch: str, scanner: archives.Scanner) -> discover.InputPlan:
    """List SRC into ``scratch`` and plan the conversion; log what was skipped and any warnings."""
    plan = sources.plan_inputs(options, scratch, scanner)
    if plan.skipped:
        logger.info("skipped without reading: %s", plan.skipped)
    for warning in plan.warnings:
        logger.warning("%s", warning)
    return plan


def archive_scanner(options: ConvertOptions, staging: str, choice: runners.RunnerChoice) -> archives.Scanner:
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


# Past this many images, no run is small enough for one process: their bytes are not looked at.
_SIZED_UP_TO = 5_000


def work_of(options: ConvertOptions, plan: discover.InputPlan) -> runners.Work:
    """The run's work, as the rule that runs small runs in one process weighs it (runners.sized_for)."""
    count = len(plan.refs)
    stored = member_reads.input_bytes(options.src, plan.refs, _SIZED_UP_TO) if count <= _SIZED_UP_TO else 0
    return runners.Work(count, stored if count <= _SIZED_UP_TO else count * member_reads.UNKNOWN_ITEM_BYTES,
                        downsizing=options.encode.max_side is not None)


def near_distance_for(options: ConvertOptions, images: int) -> ConvertOptions:
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


def near_bands(options: ConvertOptions) -> int:
    """Bands the near search compares perceptual hashes by (``--near-distance`` + 1); 0: no near search."""
    return options.near_distance + 1 if options.encode.perceptual_hash else 0
