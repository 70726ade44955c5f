"""The update-at-scale benchmark's harness, end to end on two thousand tiny images (the figures need 100k and 1M)."""

import json

import pytest

from bench import update_scale

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # converter processes, measured


def test_the_same_change_at_two_sizes_is_measured_and_its_growth_per_image_reported(tmp_path, capsys):
    results = tmp_path / "update_scale.json"
    assert update_scale.main(["--sizes", "2000,2400", "--change", "30", "--work", str(tmp_path / "work"),
                              "--results", str(results)]) == 0
    written = json.loads(results.read_text())
    for size in ("2000", "2400"):
        run = written["runs"][size]
        assert run["changes"] == {"added": 10, "changed": 10, "deleted": 10}
        assert run["update"]["phases_s"]["listing"] >= 0 and run["update"]["launcher_mb"] > 0
        assert run["conversion"]["seconds"] > 0 and not (tmp_path / "work" / f"out-{size}").exists()
    assert set(written["growth"]["memory_growth_mb"]) == {"conversion launcher_mb", "conversion largest_worker_mb",
                                                          "update launcher_mb", "update largest_worker_mb"}
    assert "stage comparison" in written["growth"]["per_image_us"]
