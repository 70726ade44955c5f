"""The code passes ruff (pyflakes and bugbear rules, see ruff.toml)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", REPO],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
