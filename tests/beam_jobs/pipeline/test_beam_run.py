"""How a failed pipeline's work is judged: kept for the same command to resume, unless the failure says it is stale."""

from __future__ import annotations

import apache_beam as beam
import pytest

from beam_jobs.pipeline import beam_run
from beam_jobs.files.work_records import WorkFileError
from beam_jobs.runtime import runners
from beam_jobs.stages.order_bucket import BucketCountError
from beam_jobs.stages.write import SourceChangedError
from tests.conftest import REPO


def _raise(_, error: BaseException):
    raise error


@pytest.mark.parametrize("mode", ["in_memory", pytest.param("multi_processing", marks=pytest.mark.e2e)])
def test_a_worker_error_saying_the_work_is_stale_is_told_from_one_that_leaves_it_sound(mode, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", REPO)  # worker processes import this module for _raise
    choice = runners.choose_runner([f"--direct_running_mode={mode}", "--direct_num_workers=1"])
    cases = [(SourceChangedError("a.jpg changed during the conversion; rerun the command"), False),
             (WorkFileError("not a work file"), False), (BucketCountError("bucket 3 holds 7 records, not 8"), False),
             (OSError(28, "No space left on device"), True), (ConnectionError("connection reset"), True)]
    if mode == "multi_processing":  # a worker process per pipeline: the text path, once each way
        cases = cases[:1] + cases[3:4]
    for error, sound in cases:
        with pytest.raises(Exception) as caught:
            with beam.Pipeline(runner=choice.runner, options=choice.options) as p:
                _ = p | beam.Create([1]) | beam.Map(_raise, error)
        assert beam_run.work_is_sound(caught.value) is sound, (error, caught.value)
