"""The update benchmark's reading mode (``python -m bench.update --reads``): it runs end to end."""

from __future__ import annotations

import json

import pytest

from bench import update


@pytest.mark.e2e  # two conversions and two updates in this process (in memory; the CLI runs ldconfig), then 4 reads
def test_reading_after_updates_measures_both_datasets_and_describes_their_shards(tmp_path):
    out = tmp_path / "update_reads.json"
    # A smoke run: the harness, not the figures (40 photos, 2 updates of 4, one batch of 8 a measurement).
    assert update.main(["--reads", "--photos", "40", "--change", "0.1", "--updates", "2", "--rounds", "1",
                        "--batches", "1", "--batch", "8", "--in-process", "--results", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [{key: done[key] for key in ("added", "changed", "deleted")} for done in results["updates"]] \
        == [{"added": 2, "changed": 1, "deleted": 1}] * 2
    shards = results["shards"]
    # SRC as it ends: 40 + 2 x (2 added - 1 deleted) photos, in both datasets.
    assert sum(split["records"] for split in shards["updated"].values()) == 42
    assert sum(split["records"] for split in shards["fresh"].values()) == 42
    assert shards["fresh"]["train"]["records_masked"] == 0
    assert set(results["reads"]["images_per_s"]) == {"updated_train", "fresh_train", "updated_eval", "fresh_eval"}
    assert results["reads"]["ratio_train"] > 0 and results["reads"]["ratio_eval"] > 0
    assert results["reads"]["cpu_ratio_train"] > 0 and results["reads"]["cpu_ratio_eval"] > 0
    assert {name: len(values) for name, values in results["reads"]["cpu_samples"].items()} \
        == {name: 1 for name in results["reads"]["images_per_s"]}  # every round's CPU an image, as its wall
