"""The stop state is one object: a program that runs the CLI inside itself gets a fresh one and its own back.

tests/in_process.py saved and restored five private globals of ``interrupt`` around each in-process run;
``interrupt.isolated()`` is that, for any caller.
"""

from __future__ import annotations

import signal
import sys
import threading

import pytest

from beam_jobs.runtime import interrupt

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signal handlers: main thread")
def test_a_run_inside_another_program_leaves_its_stop_state_handlers_and_hooks_as_they_were():
    handlers = {signum: signal.getsignal(signum) for signum in STOPS}
    hooks = (sys.unraisablehook, threading.excepthook)
    outer = interrupt.exit_line(signal.SIGINT)
    with interrupt.isolated() as state:
        interrupt.install(exit_message="{verb}: nothing was published")  # what the CLI does first
        assert state.owns_process and signal.getsignal(signal.SIGTERM) is not handlers[signal.SIGTERM]
        state.received = signal.SIGTERM  # a stop this run took
        with pytest.raises(interrupt.Interrupted) as stopped:
            interrupt.raise_if_received()
        assert stopped.value.exit_status == 143
        assert interrupt.exit_line(signal.SIGTERM) == "terminated: nothing was published"
    interrupt.raise_if_received()  # the program's own state: no stop on record
    assert interrupt.exit_line(signal.SIGINT) == outer
    assert {signum: signal.getsignal(signum) for signum in STOPS} == handlers
    assert (sys.unraisablehook, threading.excepthook) == hooks
    assert not state.owns_process  # a reaper that run started stands down once it unwound


def test_a_stop_that_python_wrapped_while_a_class_was_made_is_still_found_as_the_stop():
    """Python 3.11 wraps an exception raised in ``__set_name__`` (a dataclass made during an import) in a
    RuntimeError: the CLI must still see the SIGTERM behind it (one line, exit 143), not a failure."""
    class Field:
        def __set_name__(self, owner, name):
            raise interrupt.Interrupted(signal.SIGTERM)

    with pytest.raises(RuntimeError) as wrapped:
        type("Made", (), {"field": Field()})
    assert interrupt.stop_behind(wrapped.value).exit_status == 143
    assert interrupt.stop_behind(RuntimeError("a real failure")) is None
