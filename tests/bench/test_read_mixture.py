"""The mixture benchmark runs end to end on a few photos and reports what it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import read_mixture
from tests.conftest import REPO


@pytest.mark.e2e
def test_the_mixture_benchmark_measures_throughput_quotas_and_start_up(tmp_path):
    out = tmp_path / "read_mixture.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.read_mixture", "--photos", "60", "--rounds", "1", "--batches", "1",
         "--steps", "10000", "--checked-steps", "20", "--work", str(tmp_path / "work"), "--results", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["throughput"]["images_per_s"]) == {"one_dataset", "mixture_of_3"}
    quotas = results["quotas"]
    assert quotas["counts_seen"] == [[32], [19, 20], [12, 13]]  # batch 64 at 0.5 / 0.3 / 0.2
    assert quotas["worst_batch_distance"] < 1 and quotas["worst_running_drift"] < 1
    assert quotas["pipeline_matches_schedule"]
    assert results["startup"]["build_cpu_s"] > 0
    assert proc.stdout.strip() == read_mixture.format_table(results)


def test_the_reader_docs_quote_the_recorded_mixture_results_verbatim():
    with open(read_mixture.RESULTS, encoding="utf-8") as handle:
        table = read_mixture.format_table(json.load(handle))
    with open(os.path.join(REPO, "docs", "reader.md"), encoding="utf-8") as handle:
        assert table in handle.read()
