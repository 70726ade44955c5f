"""What the tests' forking processes share (tests/in_process.py's converter runs, tests/reader/forked.py's training
runs): a forked child becomes the job's process and runs it as the interpreter would (:func:`run`); the test
process reads the forking process's answers a line at a time (:func:`reply`).

A job is a JSON object with ``env``, ``cwd``, ``stdout`` and ``stderr`` (files); the child takes that environment
(``tempfile`` reads TMPDIR again, as in a new process), folder and standard streams, runs ``body`` and ends with
its exit status (``SystemExit``'s code; 1 after an exception, whose trace goes to its stderr), its atexit
functions run and its streams flushed, never returning into the forking loop.
"""

import atexit
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, NoReturn


def reply(forker: subprocess.Popen, timeout: float) -> str:
    """The forking process's next line, read a byte at a time (nothing buffered past it); "" after ``timeout``."""
    deadline, line = time.monotonic() + timeout, b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([forker.stdout], [], [], max(0.0, deadline - time.monotonic()))
        byte = os.read(forker.stdout.fileno(), 1) if ready else b""
        if not byte:
            return ""
        line += byte
    return line.decode().strip()


def run(job: dict, body: Callable[[], None]) -> NoReturn:
    """In a freshly forked child: become ``job``'s process, run ``body``, exit with its status."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(job["env"])
        tempfile.tempdir = None  # from TMPDIR, as in a new process
        os.chdir(job["cwd"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY),
                                (2, job["stderr"], os.O_WRONLY)):
            target = os.open(path, flags)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(0, closefd=False)
        try:
            body()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if isinstance(exit_.code, str):
                print(exit_.code, file=sys.stderr)
        atexit._run_exitfuncs()  # as the interpreter's exit runs them
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
