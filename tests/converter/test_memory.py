"""Peak memory does not grow with the bytes of the dataset (the memory rule).

Converting 4x the bytes must not raise the converter's peak RSS by anything
like those bytes: only keys and paths are grouped, never image bytes. The run
uses the in-memory runner in one process, the worst case (every stage and
every grouping lives in the measured process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server


def _noisy_tree(root: str, count: int) -> int:
    """``count`` incompressible JPEGs (~0.27 MB each); returns their total bytes."""
    rng = np.random.default_rng(count)
    total = 0
    for index in range(count):
        folder = os.path.join(root, f"class{index % 2}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{index:05d}.jpg")
        Image.fromarray(rng.integers(0, 256, size=(420, 560, 3), dtype=np.uint8)).save(path, quality=95)
        total += os.path.getsize(path)
    return total


def _peak_rss_mb(src: str, out: str) -> float:
    """The conversion process's own peak RSS (its VmHWM, read until it exits), as ``bench.scale`` measures it.

    Not ``wait4``'s maxrss: a forked child's counts its parent's pages until exec, so under pytest it could
    report the test process's TensorFlow and pass without measuring the conversion at all.
    """
    command = [sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", "4", "--no-progress",
               "--direct_running_mode=in_memory", "--direct_num_workers=1"]
    peak_kb = 0
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
                                stdout=subprocess.DEVNULL, stderr=errors)
        while proc.poll() is None:  # read before each reap: a reaped process has no status to read
            try:
                with open(f"/proc/{proc.pid}/status", encoding="ascii") as status:
                    peak_kb = max([peak_kb] + [int(line.split()[1]) for line in status if line.startswith("VmHWM:")])
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        errors.seek(0)
        assert proc.returncode == 0, errors.read().decode()[-3000:]
    return peak_kb / 1024


def test_peak_memory_does_not_grow_with_dataset_bytes(tmp_path):
    small_bytes = _noisy_tree(str(tmp_path / "small"), 60)
    large_bytes = _noisy_tree(str(tmp_path / "large"), 400)
    small = _peak_rss_mb(str(tmp_path / "small"), str(tmp_path / "small-out"))
    large = _peak_rss_mb(str(tmp_path / "large"), str(tmp_path / "large-out"))
    extra_mb = (large_bytes - small_bytes) / 2**20
    assert extra_mb > 75  # the test means something only if the extra bytes are large
    # Holding the bytes would add ~extra_mb; per-image bookkeeping adds well under 10 MB.
    assert large - small < 25, f"peak RSS {small:.0f} MB -> {large:.0f} MB for {extra_mb:.0f} MB more images"
