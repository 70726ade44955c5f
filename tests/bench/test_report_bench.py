"""A tiny run of ``python -m bench.report_bench`` (not the benchmark: its numbers mean nothing at this size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # runs the benchmark's command line, which measures in a process of its own


def test_the_report_benchmark_writes_synthetic_shards_and_measures_time_and_memory(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.report_bench", "--sizes", "300", "--tasks", "objects", "--work",
         str(tmp_path / "work"), "--json", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    run, scanned = runs["objects-300"], runs["objects-300-scan"]  # from the records table, and by the scan
    assert run["records"] == scanned["records"] == 300
    assert run["figures_from"] == "records tables" and scanned["figures_from"] == "scan"
    assert run["report_s"] > 0 and run["report_cpu_s"] > 0 and scanned["read_frames_only_s"] > 0
    assert run["peak_rss_mib"] > run["rss_after_imports_mib"]
    assert run["html_bytes"] > 10_000 and scanned["html_bytes"] > 10_000
    manifest = json.loads((tmp_path / "work" / "objects-300-0" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] == 300 and manifest["task"] == "objects"
    assert manifest["splits"]["train"]["records_table"]["num_rows"] == 300
