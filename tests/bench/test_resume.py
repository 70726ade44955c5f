"""The resume benchmark: it runs end to end, and docs/reader.md quotes its recorded results verbatim."""

from __future__ import annotations

import json
import os

import pytest

from bench import resume
from tests.conftest import REPO


@pytest.mark.e2e  # its conversions and memory measurements run in processes of their own
def test_the_resume_benchmark_measures_speed_memory_latency_state_and_quality(tmp_path, capsys):
    out = tmp_path / "resume.json"
    # A smoke run: the harness, not the figures. Run in this process (``main(argv)``, as ``python -m bench.resume``
    # runs it): a fresh TensorFlow would cost more than its reading. The buffer order fills its shuffle buffer
    # before its first batch (10,000 records by default, 12 s of CPU a pipeline here): 1,000 in the three that
    # measure it. Batches of 8 photos (each decoded whole, 300-500 px), and of 64 tiny images (6 steps an epoch
    # of 400: resumes at steps 0, 3 and 5) for the latencies and the epochs' permutations; both converted in this
    # process (set-up, not measured).
    assert resume.main(["--photos", "70", "--tiny", "400", "--rounds", "1", "--batches", "1", "--latency-rounds", "1",
                        "--shuffle-records", "1000", "--batch", "8", "--quality-batch", "64", "--convert-in-process",
                        "--work", str(tmp_path / "work"), "--results", str(out)]) == 0
    stdout = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert set(results["throughput"]["images_per_s"]) == {"streams_seeded", "buffer_seeded", "streams", "buffer"}
    assert results["shuffle_records"] == 1000 and "(1,000 records shuffled)" in stdout
    assert results["batch"] == 8 and results["quality"]["batch"] == 64 and results["latency"]["steps_per_epoch"] == 6
    assert all(mb > 100 for mb in results["memory_mb"].values())
    assert set(results["latency"]["ratio_to_fresh"]) == {f"{kind} {at}%" for kind in ("indexed", "no index")
                                                          for at in (1, 50, 99)}
    assert 0 < results["state_bytes"] < 1024
    quality = results["quality"]
    assert quality["epochs_are_permutations"] and quality["epoch_orders_differ"]
    assert stdout.strip() == resume.format_table(results)


def test_readme_quotes_the_recorded_resume_results_verbatim():
    with open(resume.RESULTS, encoding="utf-8") as handle:
        table = resume.format_table(json.load(handle))
    with open(os.path.join(REPO, "docs", "reader.md"), encoding="utf-8") as handle:
        assert table in handle.read()
