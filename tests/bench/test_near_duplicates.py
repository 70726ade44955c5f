"""A tiny run of bench.near_duplicates (its numbers mean little at this size; the code path is the benchmark's)."""

from __future__ import annotations

import json

import pytest

from bench import near_duplicates

pytestmark = pytest.mark.e2e  # runs the benchmark's command line, which runs the converter's


def test_the_near_duplicate_benchmark_scores_planted_copies_and_times_the_hash(tmp_path, capsys):
    out = tmp_path / "near.json"
    # In this process (``main(argv)``, as ``python -m bench.near_duplicates`` runs it): the conversions it scores and
    # times are processes of their own; a process for the harness only imported its libraries again.
    assert near_duplicates.main(["--grid", "1", "--photos", "16", "--rounds", "1", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    results = json.loads(out.read_text())
    quality = results["quality"]
    assert quality["images"] == 5 * quality["tiles"] and quality["tiles"] >= 15
    assert set(quality["recall"]) == {"resized to half", "re-encoded at quality 40", "cropped 2% on every side",
                                      "cropped 5% on one side"}
    assert quality["recall"]["resized to half"] >= 0.9 and quality["recall"]["re-encoded at quality 40"] >= 0.9
    assert 0 <= quality["false_pairs"] < quality["pairs_of_different_tiles"]
    cost = results["cost"]
    assert cost["photos"] == 16 and cost["wall_ratio"] > 0 and cost["cpu_ratio"] > 0
    assert "recall" in stdout and "--near-distance off" in stdout
