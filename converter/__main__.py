"""``python -m converter``: see :mod:`converter.cli`.

The process exits without the interpreter's teardown of the modules it loaded: tearing down Beam's and
TensorFlow's modules costs 0.4-1 s of CPU at the end of every run and does nothing a user needs (issue #49
§5). Exit handlers (logging's flush, temporary folders) still run first; when a non-daemon thread is still
alive, the ordinary exit waits for it as always.
"""

import atexit
import os
import sys
import threading

from converter.cli import main


def _exit_now(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # after SIGHUP the terminal may be gone
            pass
    os._exit(status)


if __name__ == "__main__":
    status = main()
    if status in (129, 130, 143):
        _exit_now(status)  # stopped by a signal, cleanup done: do not wait on threads a stopped runner left
    if all(thread.daemon for thread in threading.enumerate() if thread is not threading.main_thread()):
        atexit._run_exitfuncs()  # the exit handlers, as sys.exit would run them; then no module teardown
        _exit_now(status)
    sys.exit(status)
