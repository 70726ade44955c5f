"""docs/benchmarks.md shows the benchmark's recorded results as they are: re-rendered from the JSON, copied verbatim."""

from __future__ import annotations

import json
import os

from bench import report
from tests.conftest import REPO

RESULTS = os.path.join(REPO, "bench", "results")


def test_results_markdown_is_what_the_recorded_json_renders_to():
    with open(os.path.join(RESULTS, "results.json"), encoding="utf-8") as handle:
        results = json.load(handle)
    with open(os.path.join(RESULTS, "results.md"), encoding="utf-8") as handle:
        assert handle.read() == report.markdown(results)


def test_readme_quotes_the_recorded_results_verbatim():
    """A rerun merged into results.json must reach docs/benchmarks.md too (it once showed a superseded table)."""
    with open(os.path.join(RESULTS, "results.md"), encoding="utf-8") as handle:
        recorded = handle.read()
    with open(os.path.join(REPO, "docs", "benchmarks.md"), encoding="utf-8") as handle:
        readme = handle.read()
    assert recorded.strip() in readme
