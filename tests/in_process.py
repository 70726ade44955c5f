"""Run the converter's command line inside the test process, leaving the process as it found it.

``converter.cli.main`` is written for a process of its own: it installs
signal handlers, configures the root logger, points the reader's S3 client.
:func:`cli_in_process` saves each of those, runs ``main`` with stdout and
stderr captured (a ``SystemExit`` from argparse becomes the exit status), and
restores them, so the next test meets the same process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import tempfile

# Loggers whose levels the CLI sets (converter/cli_logging.py's configure_logging).
_LOGGERS = ("converter", "beam_jobs", "reader", "apache_beam")


@contextlib.contextmanager
def _environment(env: dict):
    """``env`` in ``os.environ`` for the call. A temporary folder named there (``TMPDIR``, ``TEMP``, ``TMP``) is
    ``tempfile``'s too, as in a new process: ``tempfile.tempdir`` caches the folder this process found first."""
    saved = {name: os.environ.get(name) for name in env}
    saved_tempdir = tempfile.tempdir
    os.environ.update(env)
    if {"TMPDIR", "TEMP", "TMP"} & set(env):
        tempfile.tempdir = None  # found again from the environment at the next use
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = saved_tempdir


@contextlib.contextmanager
def _process_state():
    """The stop state and signal handlers (interrupt.isolated), logging, S3 options, cwd: as they were."""
    from beam_jobs.runtime import interrupt

    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    cwd = os.getcwd()
    storage = sys.modules.get("reader.storage")
    s3_options = dict(storage._CLIENT_OPTIONS) if storage else None
    root.handlers = []  # pytest's capture handlers would make the CLI's basicConfig a no-op
    try:
        with interrupt.isolated():
            yield
    finally:
        root.handlers, root.level = root_handlers, root_level
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        os.chdir(cwd)
        storage = sys.modules.get("reader.storage")
        if storage is not None:
            storage.configure_s3()
            storage._CLIENT_OPTIONS.update(s3_options or {})


def needs_own_process(env: dict) -> bool:
    """A fault point that kills or signals its process (beam_jobs/faults.py) would end this one."""
    from beam_jobs import faults

    action = (env.get(faults.ENV) or "").partition("@")[0]
    return action in ("kill", "term")


def cli_in_process(argv: list[str], cwd: str, env: dict) -> subprocess.CompletedProcess:
    """``python -m converter ARGV`` run by ``converter.cli.main`` here: its status, stdout and stderr."""
    from converter.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _process_state(), _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.chdir(cwd)
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse's usage errors, --help
            code = exit_.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            if isinstance(code, str):
                print(code, file=sys.stderr)
    return subprocess.CompletedProcess(["python", "-m", "converter", *argv], status, out.getvalue(), err.getvalue())
