"""The dataset commands on a dataset that grew (``--update``, issue #59): each names the version it describes,
writes a version's files where that version's files live, and ``versions`` lists them without TensorFlow.

One small generated dataset: a conversion of 12 images and an update adding 3 (version 2), in this process on
the in-memory runner (a few seconds), shared by the module's tests read-only.
"""

from __future__ import annotations

import os
import random

import pytest
from PIL import Image

from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from converter.cli import main

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
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_verify_and_inspect_name_the_version_they_describe(grown, capsys):
    assert _run(capsys, "verify", grown, "--version", "1").startswith(f"{grown} (version 1 of 2): 3 shards, 12 records")
    assert _run(capsys, "verify", grown).startswith(f"{grown} (version 2 of 2): 5 shards, 15 records")
    assert _run(capsys, "inspect", grown, "--version", "1").startswith(f"{grown} (version 1 of 2): 2 classes, 12 images")
    assert _run(capsys, "inspect", grown, "--version", "2").startswith(f"{grown} (version 2 of 2): 2 classes, 15 images")
