"""bench.near_scale on a few thousand hashes: the rows it reports, and what holds at any size (every planted copy
within the distance found; no false link among uniform hashes; the candidates as expected_candidates predicts)."""

from __future__ import annotations

import pytest

from beam_jobs.options import DEFAULT_NEAR_DISTANCE
from beam_jobs.stages import perceptual_hash
from bench import near_scale


@pytest.mark.parametrize("kind", near_scale.KINDS)
def test_the_scale_run_finds_every_planted_copy_and_reports_cost_memory_and_false_links(kind):
    row = near_scale.run(3000, kind, seed=1, conversion_ms=0.63)
    assert row["images"] == 3030 and row["planted"] == 30 and row["distance"] == DEFAULT_NEAR_DISTANCE
    assert row["recall"] == 1.0  # copies 0-3 bits from their originals: the bands find every one
    assert row["ranges"] >= 1 and 0 < row["largest_task_records"] <= 3030 * (DEFAULT_NEAR_DISTANCE + 1)
    assert row["largest_task_peak_mb"] > 0 and row["search_us_per_image"] > 0
    if kind != "photo-like":  # crowded: uniform, a quarter of them agreeing on one band (the others apart)
        assert row["false_links"] == 0 and row["expected_false_pairs_uniform"] < 1e-6
    else:  # alike hashes of one cluster within the distance are links, as alike photos of one scene are
        assert row["false_links"] > 0


def test_uniform_hashes_share_band_values_as_expected_candidates_predicts():
    hashes = near_scale.hashes_of("uniform", 200_000, seed=2)
    measured = near_scale._candidates(hashes)
    expected = perceptual_hash.expected_candidates(200_000, DEFAULT_NEAR_DISTANCE)  # about 1.2e6
    assert abs(measured - expected) < 0.02 * expected
