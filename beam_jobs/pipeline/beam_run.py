"""The conversion's Beam pipeline run on the chosen runner, and its failure judged.

In:  the plan, the work layout and the staging folder; the runner (:mod:`beam_jobs.runtime.runners`).
Out: the work files, shards and reports the stages write into staging (:class:`beam_jobs.transforms.ConvertImages`);
     or :class:`ConversionFailedError`, keeping the finished work when resuming it would not fail the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from typing import Iterator, Optional, Sequence, Union

import apache_beam as beam

from beam_jobs.files import work_layout
from beam_jobs.files.work_records import WorkFileError
from beam_jobs.options import ConvertOptions
from beam_jobs.planning import discover
from beam_jobs.runtime import interrupt, runners
from beam_jobs.runtime.progress import ProgressBars, choose_mode
from beam_jobs.stages.order_bucket import BucketCountError
from beam_jobs.stages.write import SourceChangedError
from beam_jobs.transforms import ConvertImages


class ConversionFailedError(RuntimeError):
    """The Beam pipeline failed (a worker raised, a disk filled up...); nothing was published.

    ``kept_staging`` holds the finished work: the same command, run again once
    the cause is fixed, resumes from it (a run with other inputs or options removes it).
    """

    def __init__(self, message: str, kept_staging: Optional[str] = None) -> None:
        super().__init__(message)
        self.kept_staging = kept_staging


def run_pipeline(options: ConvertOptions, plan: discover.InputPlan, layout: work_layout.WorkLayout, staging: str,
                 planned: Optional[dict], choice: runners.RunnerChoice, show_progress: Union[None, bool, str],
                 shard_bytes: Optional[dict] = None) -> None:
    """Run :class:`ConvertImages` over ``layout``'s parts into ``staging``, with the progress bars or lines
    ``show_progress`` asks for and the runner's temporary files in the work folder. ``planned``: each split's
    shard count (None: sized from the bytes, about ``shard_bytes[split]`` a shard where given).

    Raises:
      ConversionFailedError: the pipeline failed; ``kept_staging`` set unless the work is stale.
      interrupt.Interrupted: a worker died of the user's stop signal.
    """
    progress = choose_mode(show_progress, choice.local, sys.stderr)
    spread = runners.spreads_tasks(choice)
    with ProgressBars(layout.work, len(plan.refs), enabled=progress, parts=layout.num_parts), \
            _private_tempdir(layout.work):
        try:
            with beam.Pipeline(runner=choice.runner, options=choice.options) as pipeline:
                _ = (
                    pipeline
                    # Create spreads its elements over the workers itself (a Reshuffle inside,
                    # or partitions on Dask), so no further reshuffle is needed; on one worker nothing spreads.
                    | "ListParts" >> beam.Create(range(layout.num_parts), reshuffle=spread)
                    | "ConvertImages" >> ConvertImages(options, staging, plan.classes, plan.class_text or plan.classes,
                                                       planned, layout, plan.task, spread=spread,
                                                       shard_bytes=shard_bytes)
                )
        except Exception as err:  # runners re-raise worker errors as assorted types; name the outcome
            # A worker that died of the user's Ctrl-C or SIGTERM (sent to the whole group) is the stop.
            interrupt.raise_if_received()
            failed = f"the conversion failed and nothing was published ({options.out} is unchanged): {first_line(err)}"
            if not work_is_sound(err):
                raise ConversionFailedError(failed) from err
            # Kept, as a killed run's is: what failed (a full disk, a lost connection, a worker's memory) is
            # usually fixed without touching the inputs, and hours of finished work should survive it.
            raise ConversionFailedError(
                f"{failed}. Its finished work is kept in {staging}: the same command resumes from it once the cause "
                "is fixed (a run with other inputs or options removes it, as may you)", kept_staging=staging) from err


# Failures that say the finished work itself is wrong: resuming it would fail the same way.
_UNSOUND_WORK = (SourceChangedError, WorkFileError, BucketCountError)


def work_is_sound(err: BaseException) -> bool:
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


def first_line(err: BaseException) -> str:
    """The gist of a runner's error: the last line that names an exception, without Beam's stack dump."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.split(":")[0]]
    return (named[-1] if named else lines[-1] if lines else type(err).__name__)[:500]


def worker_log_args(pipeline_args: Sequence[str]) -> list[str]:
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
