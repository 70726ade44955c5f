"""The scale benchmark: it runs end to end, and docs/scaling.md quotes its recorded results verbatim."""

from __future__ import annotations

import json
import os

import pytest

from bench import scale
from tests.conftest import REPO


@pytest.mark.e2e
def test_the_scale_benchmark_measures_each_process_at_two_sizes_and_the_stages(tmp_path, capsys):
    out = tmp_path / "scale.json"
    # In this process (``main(argv)``, as ``python -m bench.scale`` runs it): each conversion it measures is a
    # process of its own; a process for the harness only imported Beam again for the stages' costs.
    assert scale.main(["--local", "150,300", "--dask", "0", "--stages", "200", "--work", str(tmp_path / "work"),
                       "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    results = json.loads(out.read_text())
    runs = results["local"]["this"]["runs"]
    assert set(runs) == {"150", "300"} and all(run["launcher_mb"] > 50 and run["largest_worker_mb"] > 50
                                               for run in runs.values())
    assert set(results["stages"]["cpu_us_per_image"]) == set(scale.STAGES)  # the near search and the table too
    assert stdout == scale.format_table(results)


@pytest.mark.parametrize("results", [scale.RESULTS, scale.DEFAULTS_RESULTS])
def test_readme_quotes_the_recorded_scale_results_verbatim(results):
    """The run against dd024e2 (memory flat again, #18) and the run with #56's defaults and the search off."""
    with open(results, encoding="utf-8") as handle:
        table = scale.format_table(json.load(handle))
    with open(os.path.join(REPO, "docs", "scaling.md"), encoding="utf-8") as handle:
        assert table in handle.read()


@pytest.mark.e2e  # in this process, but pyarrow's first import runs ldconfig
def test_the_stage_costs_with_the_search_and_without_it_are_alternated_and_compared(tmp_path):
    """``--near-off --stages N``: each stage's CPU with the near search and without, in one process, alternated."""
    src = str(tmp_path / "tiny")
    scale.make_tiny_jpegs(src, 60, classes=3)
    on, off = scale.near_cost_by_stage(src, str(tmp_path / "stages"), rounds=1)
    assert set(on["cpu_us_per_image"]) == set(off["cpu_us_per_image"]) == set(scale.STAGES)
    assert off["work_bytes_per_image"] < on["work_bytes_per_image"]  # no band records without the search
    table = scale.format_table({"stages": on, "stages_near_off": off})
    assert "the stages' CPU with the search over without it" in table
