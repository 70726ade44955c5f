"""Workers forked from the forkserver: what its preload leaves on the user's terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.e2e
def test_the_forkservers_first_import_keeps_beams_noise_off_the_terminal_and_ignores_stops():
    """Where the gcp extra is missing, importing Beam logs 'apitools not found' at WARNING on the forkserver's
    stderr, the user's terminal (a new user saw it on every run)."""
    code = ("import logging, signal, beam_jobs.runtime.forkserver_signals\n"
            "logging.getLogger().warning('apitools not found, and bigquery client libraries are not available')\n"
            "logging.getLogger('x').warning('kept')\n"
            "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True"
    assert proc.stderr.strip() == "WARNING x: kept"
