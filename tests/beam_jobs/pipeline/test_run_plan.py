"""Decisions made before the pipeline runs: the near-duplicate search's distance for the images listed."""

from __future__ import annotations

import pytest

from beam_jobs.pipeline import run_plan


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
    chosen = [run_plan.near_distance_for(options, images).near_distance for images in sizes]
    assert chosen == [3, 3, 2, 1]
    assert all(perceptual_hash.expected_candidates(images, distance) <= 256 * images
               and perceptual_hash.expected_candidates(images, distance + 1) > 256 * images
               for images, distance in zip(sizes[1:], chosen[1:]))
    wide = dataclasses.replace(options, near_distance=10)
    with caplog.at_level(logging.WARNING, logger="beam_jobs.pipeline.run_plan"):
        assert run_plan.near_distance_for(wide, 15).near_distance == 10
        assert not caplog.records  # 15 images: a handful of pairs
        assert run_plan.near_distance_for(wide, 100_000).near_distance == 10
    assert "--near-distance 10 compares about 1e+09 pairs" in caplog.text and "auto allows 256" in caplog.text
    with pytest.raises(ValueError, match="--near-distance must be 'auto' or an integer"):
        dataclasses.replace(options, near_distance="wide")
