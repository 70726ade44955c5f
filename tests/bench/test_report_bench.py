"""A tiny run of ``python -m bench.report_bench`` (not the benchmark: its numbers mean nothing at this size)."""

from __future__ import annotations

import json

import pytest

from bench import report_bench

pytestmark = pytest.mark.e2e  # runs the benchmark's command line, which measures in a process of its own


def test_the_report_benchmark_writes_synthetic_shards_and_measures_time_and_memory(tmp_path):
    out = tmp_path / "report.json"
    # In this process (``main(argv)``, as ``python -m bench.report_bench`` runs it): what it measures (the report's
    # time and memory) runs in a process of its own each time; a process for the harness only loaded TensorFlow.
    assert report_bench.main(["--sizes", "300", "--tasks", "objects", "--work", str(tmp_path / "work"),
                              "--json", str(out)]) == 0
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
