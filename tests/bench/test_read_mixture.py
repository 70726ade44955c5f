"""The mixture benchmark runs end to end at its smoke size and reports what it promises.

Run in this process (``main(argv)``, as ``python -m bench.read_mixture`` runs it, its conversions too):
three converter processes and a fresh TensorFlow would cost more than the whole smoke run.
"""

from __future__ import annotations

import json
import os

import pytest

from bench import read_mixture
from tests.conftest import REPO


@pytest.mark.e2e  # in this process, but a library it loads asks `ldconfig -p` (ctypes.util.find_library)
def test_the_mixture_benchmark_measures_throughput_quotas_and_start_up(tmp_path, capsys):
    out = tmp_path / "read_mixture.json"
    assert read_mixture.main(["--smoke", "--steps", "10000", "--work", str(tmp_path / "work"),
                              "--results", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["photos"] == read_mixture.SMOKE["photos"] == 30
    assert set(results["throughput"]["images_per_s"]) == {"one_dataset", "mixture_of_3"}
    quotas = results["quotas"]
    assert quotas["counts_seen"] == [[32], [19, 20], [12, 13]]  # batch 64 at 0.5 / 0.3 / 0.2
    assert quotas["worst_batch_distance"] < 1 and quotas["worst_running_drift"] < 1
    assert quotas["pipeline_matches_schedule"]
    assert results["startup"]["build_cpu_s"] > 0
    hosts = results["hosts"]  # at H = 1 and 2 only: the code that measures 4 and 8
    assert list(hosts["bytes_read"]) == ["1", "2"] and all(hosts["same_global_batches"].values())
    assert set(hosts["first_batch_cpu_s"]) == {f"C={c}, H={h}" for c in (1, hosts["canonical_pipelines"]) for h in (1, 2)}
    assert capsys.readouterr().out.strip() == read_mixture.format_table(results)


def test_the_reader_docs_quote_the_recorded_mixture_results_verbatim():
    with open(read_mixture.RESULTS, encoding="utf-8") as handle:
        table = read_mixture.format_table(json.load(handle))
    with open(os.path.join(REPO, "docs", "reader.md"), encoding="utf-8") as handle:
        assert table in handle.read()
