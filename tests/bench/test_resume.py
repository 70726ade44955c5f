"""The resume benchmark: it runs end to end, and docs/reader.md quotes its recorded results verbatim."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import resume
from tests.conftest import REPO


@pytest.mark.e2e
def test_the_resume_benchmark_measures_speed_memory_latency_state_and_quality(tmp_path):
    out = tmp_path / "resume.json"
    proc = subprocess.run(
        # A smoke run: the harness, not the figures. The buffer order fills its shuffle buffer before its first
        # batch (10,000 records by default, 12 s of CPU a pipeline here): 1,000 in the three that measure it.
        [sys.executable, "-m", "bench.resume", "--photos", "70", "--tiny", "1200", "--rounds", "1", "--batches", "1",
         "--latency-rounds", "1", "--shuffle-records", "1000",
         "--work", str(tmp_path / "work"), "--results", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["throughput"]["images_per_s"]) == {"streams_seeded", "buffer_seeded", "streams", "buffer"}
    assert results["shuffle_records"] == 1000 and "(1,000 records shuffled)" in proc.stdout
    assert all(mb > 100 for mb in results["memory_mb"].values())
    assert set(results["latency"]["ratio_to_fresh"]) == {f"{kind} {at}%" for kind in ("indexed", "no index")
                                                          for at in (1, 50, 99)}
    assert 0 < results["state_bytes"] < 1024
    quality = results["quality"]
    assert quality["epochs_are_permutations"] and quality["epoch_orders_differ"]
    assert proc.stdout.strip() == resume.format_table(results)


def test_readme_quotes_the_recorded_resume_results_verbatim():
    with open(resume.RESULTS, encoding="utf-8") as handle:
        table = resume.format_table(json.load(handle))
    with open(os.path.join(REPO, "docs", "reader.md"), encoding="utf-8") as handle:
        assert table in handle.read()
