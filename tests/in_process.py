"""Run the converter's command line inside the test process, leaving the process as it found it.

``converter.cli.main`` is written for a process of its own: it installs
signal handlers, configures the root logger, points the reader's S3 client.
:func:`cli_in_process` saves each of those, runs ``main`` with stdout and
stderr captured (a ``SystemExit`` from argparse becomes the exit status), and
restores them, so the next test meets the same process.

A run that must end a process of its own (killed or stopped at a fault point) runs by
:func:`cli_in_forked_process`: forked from a process that imported Beam once, not a new interpreter each time.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional

from tests import forking

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



# What ``python -m converter`` imports to convert (Beam's runners and the pipeline's modules: 4-5 s of CPU), imported
# once by the process that forks the runs of :func:`cli_in_forked_process`.
_PRELOAD = ["converter.cli", "beam_jobs.pipeline", "beam_jobs.transforms", "beam_jobs.update",
            "apache_beam.runners.direct.direct_runner", "apache_beam.runners.portability.fn_api_runner.fn_runner"]
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The forking process: it imports _PRELOAD, then for each request (a JSON line: argv, cwd, env, stdout and stderr
# files) forks a child that runs ``python -m converter ARGV`` as the interpreter would (converter/__main__.py ends
# it), and answers with the child's pid, then its exit status (minus the signal that ended it). Its own
# multiprocessing state is untouched, so a run's workers start from the run's own forkserver, as in a new process.
_FORKER = r"""
import json, os, sys
from tests.forking import run as run_child
for name in json.loads(sys.argv[1]):
    try:
        __import__(name)
    except ImportError:
        pass
replies = os.fdopen(os.dup(1), "w")
while True:
    line = sys.stdin.readline()
    if not line:
        break
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        def body():
            import runpy
            sys.argv = ["converter", *job["argv"]]
            runpy.run_module("converter", run_name="__main__", alter_sys=True)
        run_child(job, body)
    replies.write(f"{pid}\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(f"{os.waitstatus_to_exitcode(status)}\n")
    replies.flush()
"""
_forker: Optional[subprocess.Popen] = None


def _forking_process() -> subprocess.Popen:
    """This test process's forking process, started at its first use; it ends when this process closes its input."""
    global _forker
    if _forker is None or _forker.poll() is not None:
        _forker = subprocess.Popen([sys.executable, "-c", _FORKER, json.dumps(_PRELOAD)], cwd=_REPO,
                                   env={**os.environ, "PYTHONPATH": _REPO}, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, bufsize=0)
    return _forker


def cli_in_forked_process(argv: list[str], cwd: str = _REPO, env: Optional[dict] = None,
                          timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m converter ARGV`` in a process of its own, as :func:`subprocess.run` gives it back: its exit
    status (minus the signal that ended it), stdout and stderr. ``env``: variables added to this process's.

    Why: a run told to kill or stop itself at a fault point (``IMGSHARDS_FAULT=kill@...``) must end a process of
    its own, and a new interpreter spends 4-5 s of CPU importing Beam before it converts anything: the kill tests
    pin what a run leaves on disk at each point, not how its interpreter starts. The process is forked from one
    that imported Beam and the converter once (``_PRELOAD``, single-threaded) for every such run of this test
    process; the run then goes through ``python -m converter``'s own code (its argument parsing, signal handlers,
    workers, exit) in the environment it is given (``TMPDIR`` included), in this process's group. Tests of the
    process itself (its start-up, what it prints before Beam loads, signals from outside) start a real
    ``python -m converter`` instead (tests/conftest.py's run_converter_process).
    """
    command = ["python", "-m", "converter", *argv]
    with _FORKING, tempfile.TemporaryDirectory(prefix="forked-cli-") as folder:
        out_path, err_path = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        for path in (out_path, err_path):
            open(path, "wb").close()
        forker = _forking_process()
        forker.stdin.write(json.dumps({"argv": list(argv), "cwd": cwd, "stdout": out_path, "stderr": err_path,
                                       "env": {**os.environ, "PYTHONPATH": _REPO, **(env or {})}}).encode() + b"\n")
        pid = int(forking.reply(forker, 600) or 0)
        assert pid, "the forking process did not start the run (tests/in_process.py)"
        status = forking.reply(forker, timeout)
        if not status:
            os.kill(pid, signal.SIGKILL)
            forking.reply(forker, 60)
            raise subprocess.TimeoutExpired(command, timeout)
        with open(out_path, encoding="utf-8", errors="replace") as out, \
                open(err_path, encoding="utf-8", errors="replace") as err:
            return subprocess.CompletedProcess(command, int(status), out.read(), err.read())


_FORKING = threading.Lock()  # one run at a time through the forking process
