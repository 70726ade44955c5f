"""The dataset commands on a dataset that grew (``--update``, issue #59): each names the version it describes,
writes a version's files where that version's files live, and ``versions`` lists them without TensorFlow.

One small generated dataset: a conversion of 12 images and an update adding 3 (version 2), in this process on
the in-memory runner (a few seconds), shared by the module's tests read-only.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys

import pytest
from PIL import Image

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from beam_jobs.runtime import interrupt
from converter.cli import main
from reader.info import dataset_info
from tests.conftest import REPO
from tests.converter.test_cli_groups import _WITHOUT_TENSORFLOW

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _image(path: str, seed: int) -> None:
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (24, 20), tuple(rng.randrange(256) for _ in range(3))).save(path, quality=90)


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> str:
    """OUT with version 1 (cat 6, dog 6) and version 2 (3 more cats), the latest."""
    root = tmp_path_factory.mktemp("grown")
    src, out = str(root / "src"), str(root / "out")
    for cls in ("cat", "dog"):
        for i in range(6):
            _image(os.path.join(src, cls, f"{i}.jpg"), sum(map(ord, cls)) * 100 + i)
    options = ConvertOptions(src=src, out=out, val_fraction=0.25, near_distance=3, shards=2)
    conversion.run(options, FAST, show_progress=False)
    for i in range(6, 9):
        _image(os.path.join(src, "cat", f"{i}.jpg"), 5000 + i)
    assert update.run(options, FAST).version == 2
    return out


def _run(capsys, *argv: str) -> str:
    # The CLI's main() installs its stop handlers for the whole process (interrupt.install): isolated() puts the
    # test process's back, or a later test in this xdist worker meets them (test_interrupt.py failed so).
    with interrupt.isolated():
        assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_verify_and_inspect_name_the_version_they_describe(grown, capsys):
    assert _run(capsys, "verify", grown, "--version", "1").startswith(f"{grown} (version 1 of 2): 3 shards, 12 records")
    files = len({shard.path for split in dataset_info(grown).splits.values() for shard in split.shards})
    assert _run(capsys, "verify", grown).startswith(f"{grown} (version 2 of 2): {files} shards, 15 records")
    assert _run(capsys, "inspect", grown, "--version", "1").startswith(f"{grown} (version 1 of 2): 2 classes, 12 images")
    assert _run(capsys, "inspect", grown, "--version", "2").startswith(f"{grown} (version 2 of 2): 2 classes, 15 images")


def test_each_versions_report_is_written_in_its_folder_and_names_its_version(grown, capsys, caplog):
    first, second = os.path.join(grown, "report.html"), os.path.join(grown, "versions", "00002", "report.html")
    assert _run(capsys, "report", grown, "--version", "1").split() == ["wrote", first, "wrote", first[:-4] + "json"]
    with caplog.at_level(logging.WARNING):
        assert _run(capsys, "report", grown, "--version", "2").split() == \
            ["wrote", second, "wrote", second[:-4] + "json"]
    # Version 1's report stays where it always was, not overwritten by version 2's; each names its version.
    for page, version in ((first, 1), (second, 2)):
        with open(page, encoding="utf-8") as handle:
            assert f"<title>Dataset report: {grown} (version {version} of 2)</title>" in handle.read()
        with open(page[:-4] + "json", encoding="utf-8") as handle:
            figures = json.load(handle)
        assert (figures["dataset"], figures["version"], figures["figures_from"]) == (grown, version, "records tables")
    # An update writes its version's records tables too (#56 x #59): version 2's report draws from them, no scan.
    assert not [record for record in caplog.records if "scan" in record.getMessage()]



@pytest.mark.e2e
def test_versions_lists_each_version_without_loading_tensorflow(grown, capsys):
    # The manifests are JSON: listing them took 29-38 s on a loaded machine when it loaded TensorFlow to read them.
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TENSORFLOW, json.dumps([["versions", grown]])],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["loaded"] == [] and result["commands"][f"versions {grown}"][0] == 0
    # The lines (here, where TensorFlow is loaded anyway): the latest marked, the fingerprints the reader gives.
    lines = _run(capsys, "versions", grown).splitlines()
    fingerprints = [dataset_info(grown, version=number).fingerprint for number in (1, 2)]
    assert [line.lstrip("* ").split()[:3:2] for line in lines] == [["1", fingerprints[0]], ["2", fingerprints[1]]]
    assert [line.startswith("*") for line in lines] == [False, True]
    assert lines[0].endswith("train 8, validation 4  (converted)") and "+3 ~0 -0" in lines[1]
