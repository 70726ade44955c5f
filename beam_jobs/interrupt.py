"""A signal ends a conversion at any moment: promptly, in one line, leaving nothing behind.

SIGINT (Ctrl-C) and SIGTERM (``timeout``, Slurm, Kubernetes) raise
:class:`Interrupted` in the main thread, once: a second Ctrl-C while the run
cleans up is ignored, so it cannot cut the cleanup short.

Raising is not enough on its own. Beam's local runner, unwinding, joins every
worker it started, and a worker still starting up never learns that the run
is over: the join waited forever (the issue measured 16 hangs in 23 tries).
So while a run is live (:func:`live_run`), the first signal also starts a
reaper thread that kills every process this one started (Beam's workers, a
Flink or Spark job server) and keeps killing any that appear, and that, as a
last resort, runs the run's cleanups and exits the process if unwinding has
not finished by :data:`DEADLINE_S`. Tracebacks of the runner's threads that
lose their workers are silenced: the user asked for the stop.

A commit runs as a :func:`deferred` section: a signal there takes effect once
the commit is whole, and says so (:attr:`Interrupted.published`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator, Optional

# Seconds from the signal to the forced exit; the issue promises 10 s.
DEADLINE_S = 7.0
_REAP_INTERVAL_S = 0.05
_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: Optional[int] = None
_deferring = 0
_live = 0
_last_resort: list[Callable[[], None]] = []
_exit_message = ""
_reaper: Optional[threading.Thread] = None


class Interrupted(KeyboardInterrupt):
    """The run was stopped by SIGINT or SIGTERM.

    Attributes:
      signum: the signal.
      published: the signal came during a commit, which completed first.
    """

    def __init__(self, signum: int, published: bool = False) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.published = published

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as shells report it: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum

    @property
    def verb(self) -> str:
        return "terminated" if self.signum == signal.SIGTERM else "interrupted"


def received() -> Optional[int]:
    """The first stop signal this process received, or None."""
    return _received


def raise_if_received() -> None:
    """Raise :class:`Interrupted` if a stop signal came while it could not be raised."""
    if _received is not None:
        raise Interrupted(_received)


def _handle(signum: int, frame: object) -> None:
    global _received
    if _received is not None:
        return  # a second Ctrl-C must not cut the cleanup of the first short
    _received = signum
    if _live:
        _start_reaper()
    if not _deferring:
        raise Interrupted(signum)


def install(exit_message: str = "") -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` in this (main) thread, for the whole process.

    The CLI calls this before importing anything heavy, so a signal while Beam
    imports is one line too. ``exit_message`` is what a forced exit prints
    (``{verb}`` becomes "interrupted" or "terminated").
    """
    global _exit_message
    _exit_message = exit_message
    for signum in _SIGNALS:
        signal.signal(signum, _handle)


def exit_line(signum: int) -> str:
    """The line a process stopped by ``signum`` prints: the exit message with its verb filled in."""
    return (_exit_message or "{verb}").format(verb=Interrupted(signum).verb)


def set_exit_message(message: str) -> None:
    """What a forced exit (the deadline) prints, once the CLI knows OUT."""
    global _exit_message
    _exit_message = message


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within: the stop signals raise :class:`Interrupted` (only in the main thread; elsewhere a no-op).

    For library callers of ``run``: SIGTERM would otherwise kill the process
    without cleaning its staging folder and lock.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    for signum in _SIGNALS:
        signal.signal(signum, _handle)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def live_run(last_resort: Callable[[], None]) -> Iterator[None]:
    """While a run has workers: a stop signal also kills them, and ``last_resort`` cleans up at the deadline."""
    global _live
    _live += 1
    _last_resort.append(last_resort)
    try:
        if _received is not None:
            _start_reaper()
            raise_if_received()
        yield
    finally:
        _last_resort.remove(last_resort)
        _live -= 1


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A section a signal must not cut in two (the commit); the signal takes effect after it.

    Raises on entry if a signal already came, and on exit (with
    ``published=True``) if one came during the section.
    """
    global _deferring
    raise_if_received()
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if _received is not None:
        raise Interrupted(_received, published=True)


def _start_reaper() -> None:
    global _reaper
    if _reaper is not None:
        return
    threading.excepthook = _quiet_excepthook
    _reaper = threading.Thread(target=_reap, args=(time.monotonic() + DEADLINE_S,), name="interrupt-reaper",
                               daemon=True)
    _reaper.start()


def _quiet_excepthook(args: threading.ExceptHookArgs) -> None:
    """After a stop signal, runner threads fail as their workers die; that is the stop, not news."""


def _reap(deadline: float) -> None:
    """Kill this process's descendants until it exits; at the deadline, clean up and exit."""
    while time.monotonic() < deadline:
        _kill_descendants()
        time.sleep(_REAP_INTERVAL_S)
    for cleanup in reversed(list(_last_resort)):
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - best effort: the process is going down either way
            pass
    sys.stderr.write("\n" + exit_line(_received or signal.SIGTERM) + "\n")
    sys.stderr.flush()
    os._exit(128 + (_received or signal.SIGTERM))


def _kill_descendants() -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (Linux: read from /proc; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile
        # The command name (in parentheses) may hold spaces; the parent's pid is the 2nd field after it.
        fields = stat[stat.rfind(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found
