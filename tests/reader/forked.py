"""Training runs in processes of their own, forked from one that imported TensorFlow once.

The kill-and-restart tests (test_resume_training.py) and the examples' runs under MirroredStrategy
(test_keras.py) need a process each: one is killed with SIGKILL, another sets up logical devices before
TensorFlow's runtime starts. A new interpreter spends 5 s of CPU here importing TensorFlow, Keras and the
reader before it trains a step (10-12 s on a slower machine): what these tests pin is how the run trains,
resumes and splits its batches, not how its interpreter starts. So each run is forked from a process that
imported them once (``_PRELOAD``: single-threaded after the imports, TensorFlow's runtime not started: the
child starts its own, and sets its own logical devices), and then runs as ``python -m MODULE``, ``python
SCRIPT`` or ``python -c CODE`` would, in the environment and folder it is given, with its own stdout, stderr
and exit status. Tests of the process itself (what TensorFlow prints at start-up: test_first_contact.py)
start a real interpreter instead.

The forking process is this test process's, started at its first use and waited for at its exit (so its
children's CPU is counted as this process's children's).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from tests import forking
from tests.conftest import REPO

_PRELOAD = ["reader", "keras", "tensorflow"]
# For each request (a JSON line: kind, target, argv, cwd, env, stdout and stderr files) it forks a child that runs
# the target as the interpreter would, and answers "pid PID"; "end PID STATUS" when a child has ended (its exit
# status, minus the signal that ended it). Runs may overlap (a server and its clients); at the end of its input it
# waits for its children.
_FORKER = r"""
import json, os, select, sys
from tests.forking import run as run_child
for name in json.loads(sys.argv[1]):
    __import__(name)
replies = os.fdopen(os.dup(1), "w")
children, pending, closed = set(), b"", False
while not closed or children:
    ready = select.select([] if closed else [0], [], [], 0.05)[0]
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            break
        children.discard(pid)
        replies.write(f"end {pid} {os.waitstatus_to_exitcode(status)}\n")
        replies.flush()
    if not ready:
        continue
    chunk = os.read(0, 65536)
    closed = not chunk
    pending += chunk
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            kind, target = job["kind"], job["target"]

            def body():
                import runpy
                sys.argv = [target if kind != "code" else "-c", *job["argv"]]
                if kind == "module":
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                elif kind == "script":
                    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))  # as `python SCRIPT` has it
                    runpy.run_path(target, run_name="__main__")
                else:
                    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
            run_child(job, body)
        children.add(pid)
        replies.write(f"pid {pid}\n")
        replies.flush()
"""
_forker: Optional[subprocess.Popen] = None
_ENDED: dict = {}  # pid -> exit status, as the forking process reports them


def _forking_process() -> subprocess.Popen:
    global _forker
    if _forker is None or _forker.poll() is not None:
        _forker = subprocess.Popen([sys.executable, "-c", _FORKER, json.dumps(_PRELOAD)], cwd=REPO,
                                   env={**os.environ, "PYTHONPATH": REPO}, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    return _forker


@atexit.register
def _close() -> None:
    """The forking process ends when its input closes; waited for, its children's CPU is counted as ours."""
    if _forker is not None and _forker.poll() is None:
        _forker.stdin.close()
        try:
            _forker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _forker.kill()


def _next(forker: subprocess.Popen, timeout: float) -> str:
    """The forking process's next line ("" after ``timeout``), an ended run's status recorded."""
    line = forking.reply(forker, timeout)
    if line.startswith("end "):
        _, pid, status = line.split()
        _ENDED[int(pid)] = int(status)
    return line


class Run:
    """A forked run, as :class:`subprocess.Popen` is used here: ``pid``, ``poll()``, ``wait()``, ``send_signal()``,
    ``terminate()``; its ``stdout`` and ``stderr`` text once it has ended (:meth:`result`)."""

    def __init__(self, command: list, kind: str, target: str, argv: list, cwd: str, env: Optional[dict]) -> None:
        self.command = command
        self._folder = tempfile.TemporaryDirectory(prefix="forked-run-")
        self._out = os.path.join(self._folder.name, "stdout")
        self._err = os.path.join(self._folder.name, "stderr")
        for path in (self._out, self._err):
            open(path, "wb").close()
        self._forker = _forking_process()
        self._forker.stdin.write(json.dumps({
            "kind": kind, "target": target, "argv": [str(a) for a in argv], "cwd": cwd, "stdout": self._out,
            "stderr": self._err, "env": {**os.environ, "PYTHONPATH": REPO, **(env or {})}}).encode() + b"\n")
        line, deadline = "", time.monotonic() + 600
        while not line.startswith("pid ") and time.monotonic() < deadline:
            line = _next(self._forker, deadline - time.monotonic())
        assert line.startswith("pid "), "the forking process did not start the run (tests/reader/forked.py)"
        self.pid = int(line.split()[1])

    @property
    def returncode(self) -> Optional[int]:
        return _ENDED.get(self.pid)

    def poll(self) -> Optional[int]:
        while self.returncode is None and select.select([self._forker.stdout], [], [], 0)[0]:
            if not _next(self._forker, 1):
                break
        return self.returncode

    def wait(self, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while self.returncode is None and time.monotonic() < deadline:
            _next(self._forker, deadline - time.monotonic())
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)
            while self.returncode is None and _next(self._forker, 60):
                pass
            raise subprocess.TimeoutExpired(self.command, timeout)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def result(self) -> subprocess.CompletedProcess:
        with open(self._out, encoding="utf-8", errors="replace") as out, \
                open(self._err, encoding="utf-8", errors="replace") as err:
            done = subprocess.CompletedProcess(self.command, self.returncode, out.read(), err.read())
        self._folder.cleanup()
        return done


def start(command: list, cwd: str = REPO, env: Optional[dict] = None) -> Run:
    """``[python, -m, MODULE, ...]``, ``[python, SCRIPT, ...]`` or ``[python, -c, CODE, ...]`` (``command[0]`` is
    the interpreter, not run again), forked: see the module's docstring. ``env``: variables added to this
    process's."""
    if command[1] == "-m":
        kind, target, argv = "module", command[2], command[3:]
    elif command[1] == "-c":
        kind, target, argv = "code", command[2], command[3:]
    else:
        kind, target, argv = "script", command[1], command[2:]
    return Run(command, kind, target, argv, cwd, env)


def run(command: list, cwd: str = REPO, env: Optional[dict] = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """:func:`start`, waited for: as :func:`subprocess.run` with ``capture_output=True, text=True`` gives it."""
    forked = start(command, cwd, env)
    forked.wait(timeout)
    return forked.result()
