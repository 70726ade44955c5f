"""A tiny run of bench.near_search (its numbers mean little at this size; the code path is the benchmark's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # runs the benchmark's command line in a subprocess


def test_the_near_search_benchmark_times_both_searches_on_the_same_files_and_counts_candidates(tmp_path):
    out = tmp_path / "near_search.json"
    proc = subprocess.run([sys.executable, "-m", "bench.near_search", "--smoke", "--json", str(out)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    (row,) = results["search"].values()
    assert row["images"] == 42 and row["links"] >= 2 and row["identical_outputs"] is True
    assert all(len(row[name]["find_pairs_cpu_s"]) == 1 for name in ("baseline", "current"))
    assert {(c["kind"], c["bands"], c["radius"]) for c in results["candidates"]} == {
        (kind, bands, 10 // bands) for kind in ("random", "clustered") for bands in (11, 6, 5, 4, 3)}
    exact = [c for c in results["candidates"] if c["bands"] == 11]
    assert all(c["candidate_pairs"] > 0 and c["probes"] == 500 * 11 for c in exact)
    for kind in ("random", "clustered"):  # the multi-index prototype is exact: the search's pairs, each once
        rows = {c["bands"]: c for c in results["candidates"] if c["kind"] == kind}
        assert rows[4]["multi_index_pairs"] == rows[11]["pairs"]
    assert rows[11]["pairs"] > 0
