"""How a failed pipeline's work is judged: kept for the same command to resume, unless the failure says it is stale."""

from __future__ import annotations

import apache_beam as beam
import pytest

from beam_jobs import pipeline
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
        assert pipeline._work_is_sound(caught.value) is sound, (error, caught.value)


def test_near_distance_auto_keeps_the_search_linear_and_a_wider_distance_warns_with_the_pairs_it_compares(
        tmp_path, caplog):
    """#56 §1: auto picks the widest distance up to 3 whose search compares at most 256 pairs an image (evenly
    spread hashes): 3 up to about 8M images, then 2, then 1 at a billion. A distance given that compares more
    is kept, with a warning naming the pairs it will compare at this size."""
    import dataclasses
    import logging

    from beam_jobs.options import AUTO, ConvertOptions
    from beam_jobs.stages import perceptual_hash

    (tmp_path / "src").mkdir()
    options = ConvertOptions(src=str(tmp_path / "src"), out=str(tmp_path / "out"))
    assert options.near_distance == AUTO
    sizes = (15, 10**6, 10**7, 10**9)
    chosen = [pipeline._near_distance_for(options, images).near_distance for images in sizes]
    assert chosen == [3, 3, 2, 1]
    assert all(perceptual_hash.expected_candidates(images, distance) <= 256 * images
               and perceptual_hash.expected_candidates(images, distance + 1) > 256 * images
               for images, distance in zip(sizes[1:], chosen[1:]))
    wide = dataclasses.replace(options, near_distance=10)
    with caplog.at_level(logging.WARNING, logger="beam_jobs.pipeline"):
        assert pipeline._near_distance_for(wide, 15).near_distance == 10
        assert not caplog.records  # 15 images: a handful of pairs
        assert pipeline._near_distance_for(wide, 100_000).near_distance == 10
    assert "--near-distance 10 compares about 1e+09 pairs" in caplog.text and "auto allows 256" in caplog.text
    with pytest.raises(ValueError, match="--near-distance must be 'auto' or an integer"):
        dataclasses.replace(options, near_distance="wide")
