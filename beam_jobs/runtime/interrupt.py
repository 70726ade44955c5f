"""A signal ends a conversion at any moment: promptly, in one line, keeping only finished work.

SIGINT (Ctrl-C), SIGTERM (``timeout``, Slurm, Kubernetes, spot VMs) and SIGHUP
(an ssh session that drops) raise :class:`Interrupted` in the main thread, once: a second Ctrl-C while the run
cleans up is ignored, so it cannot cut the cleanup short.

Raising is not enough on its own. Beam's local runner, unwinding, joins every
worker it started, and a worker still starting up never learns that the run
is over: the join waited forever (the issue measured 16 hangs in 23 tries).
So while a run is live (:func:`live_run`), the first signal also starts a
reaper thread that kills every process started since the run began (Beam's
workers, a job server; never the caller's own) and keeps killing any that
appear. As a last resort it runs the run's cleanup and exits the process at
:data:`DEADLINE_S`: in the CLI (:func:`install`) whenever the process is
still alive then, whatever hangs (a rare race after unwinding was seen to);
for a library caller only if the run has not unwound by then, so a notebook's
kernel lives on, and the next run starts with no signal on record. Tracebacks of the runner's threads that
lose their workers are silenced: the user asked for the stop.

A commit runs as a :func:`deferred` section: a signal there takes effect once
the commit is whole, and says so (:attr:`Interrupted.published`).

What a stop needs to know lives in one :class:`StopState`, the process's
(signals are delivered to the process, so the handler finds it there);
:func:`isolated` gives a program that runs the CLI inside itself (the test
process) a fresh one, and its handlers and hooks back afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator, Optional

# Seconds from the signal to the forced exit; the issue promises 10 s.
DEADLINE_S = 7.0
_REAP_INTERVAL_S = 0.05
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_VERBS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}

class _LiveRun:
    """What the reaper needs of a live run: which processes were there before it, and its last resort."""

    def __init__(self, last_resort: Callable[[], None]) -> None:
        self.last_resort = last_resort
        # Processes this one had started before the run (a notebook's other servers...) are never killed.
        self.preexisting = set(_descendant_ids(os.getpid()))
        self.over = threading.Event()


@dataclasses.dataclass
class StopState:
    """Everything a stop signal reads and writes, for the whole process."""

    received: Optional[int] = None  # the first stop signal, once one came
    deferring: int = 0  # depth of deferred() sections (the commit)
    exit_message: str = ""  # what a forced exit prints ("{verb}" filled in)
    # Set by install(): the process is ours (the CLI), so after a signal it ends by the deadline whatever
    # else hangs; a library caller's process (a notebook) is only ever left alone once the run has unwound.
    owns_process: bool = False
    reaper: Optional[threading.Thread] = None
    live: list = dataclasses.field(default_factory=list)  # the live runs (_LiveRun), innermost last


_state = StopState()


@contextlib.contextmanager
def isolated() -> Iterator[StopState]:
    """A fresh :class:`StopState` within, and afterwards the process's state, stop-signal handlers, thread
    and unraisable hooks as they were: for a program that runs the CLI inside itself (the test process)."""
    global _state
    saved, handlers = _state, {signum: signal.getsignal(signum) for signum in _SIGNALS}
    hooks = (sys.unraisablehook, threading.excepthook)
    _state = fresh = StopState()
    try:
        yield fresh
    finally:
        fresh.owns_process = False  # the process was never the CLI's: a reaper stands down once the run unwound
        _state = saved
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        sys.unraisablehook, threading.excepthook = hooks


class Interrupted(KeyboardInterrupt):
    """The run was stopped by SIGINT, SIGTERM or SIGHUP.

    Attributes:
      signum: the signal.
      published: the signal came during a commit, which completed first.
      kept: what the run kept for the same command to resume (its staging
        folder, described for the user), or "" when nothing was kept.
    """

    def __init__(self, signum: int, published: bool = False) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.published = published
        self.kept = ""

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as shells report it: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
        return 128 + self.signum

    @property
    def verb(self) -> str:
        return _VERBS.get(self.signum, "stopped")


def raise_if_received() -> None:
    """Raise :class:`Interrupted` if a stop signal came while it could not be raised.

    Also where it was raised but lost: Python ignores an exception raised in
    some callbacks (an import's module-lock weakref callback, seen once in
    the signal matrix), and the run went on until the deadline. The
    launcher's long loops (listing, writing parts) call this.
    """
    if _state.received is not None:
        raise Interrupted(_state.received)


def stop_behind(err: BaseException) -> Optional[Interrupted]:
    """The :class:`Interrupted` a signal raised, when it reached the caller wrapped in another exception, or None
    when ``err`` is no stop's. Python 3.11 wraps an exception raised while a class is made (a dataclass field's
    ``__set_name__``, during an import) in a ``RuntimeError`` whose cause it is: a SIGTERM landing there printed a
    traceback and exited 1 instead of its one line and 143 (seen in the signal matrix at a slowdown of 10)."""
    seen: set[int] = set()
    current: Optional[BaseException] = err
    while current is not None and id(current) not in seen:
        if isinstance(current, Interrupted):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _handle(signum: int, frame: object) -> None:
    state = _state
    if state.received is not None:
        return  # a second Ctrl-C must not cut the cleanup of the first short
    state.received = signum
    if state.live:
        _start_reaper(state, state.live[-1])
    elif state.owns_process:  # the CLI ends by the deadline even when stopped outside a run (while Beam imports...)
        _start_reaper(state, _LiveRun(last_resort=lambda: None))
    if not state.deferring:
        raise Interrupted(signum)


def install(exit_message: str = "") -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in this (main) thread, for the whole process.

    The CLI calls this before importing anything heavy, so a signal while Beam
    imports is one line too. ``exit_message`` is what a forced exit prints
    (``{verb}`` becomes "interrupted" or "terminated").
    """
    _state.exit_message = exit_message
    _state.owns_process = True
    for signum in _SIGNALS:
        signal.signal(signum, _handle)
    _quiet_lost_interrupts()


def _quiet_lost_interrupts() -> None:
    """Python prints "Exception ignored in ..." for an exception raised where it cannot propagate (an
    import's module-lock callback); for ours that is no news: :func:`raise_if_received` raises it again."""
    previous = sys.unraisablehook
    if getattr(previous, "_imgshards", False):
        return

    def hook(args) -> None:
        if not isinstance(args.exc_value, Interrupted):
            previous(args)

    hook._imgshards = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def exit_line(signum: int) -> str:
    """The line a process stopped by ``signum`` prints: the exit message with its verb filled in."""
    return (_state.exit_message or "{verb}").format(verb=Interrupted(signum).verb)


def set_exit_message(message: str) -> None:
    """What a forced exit (the deadline) prints, once the CLI knows OUT."""
    _state.exit_message = message


def add_to_exit_message(sentence: str) -> None:
    """Append a sentence to what a forced exit prints (the last resort's word on kept work)."""
    _state.exit_message = (_state.exit_message or "{verb}") + ". " + sentence.replace("{", "{{").replace("}", "}}")


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within: the stop signals raise :class:`Interrupted` (only in the main thread; elsewhere a no-op).

    For library callers of ``run``: SIGTERM would otherwise kill the process
    without cleaning its staging folder and lock.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _state.owns_process:  # a new run: a signal that stopped an earlier one in a notebook's process is spent
        _state.received = None  # (in the CLI, one that came while it loaded, its exception lost, still stops this run)
    _quiet_lost_interrupts()
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
    """While a run has workers: a stop signal also kills the processes started since, and if unwinding
    has not left this block by the deadline, ``last_resort`` cleans up and the process exits.
    """
    run, state = _LiveRun(last_resort), _state
    state.live.append(run)
    try:
        raise_if_received()
        yield
    finally:
        run.over.set()  # unwound in time: the reaper stands down (a notebook's kernel lives on)
        state.live.remove(run)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A section a signal must not cut in two (the commit); the signal takes effect after it.

    Raises on entry if a signal already came, and on exit (with
    ``published=True``) if one came during the section.
    """
    raise_if_received()
    state = _state
    state.deferring += 1
    try:
        yield
    finally:
        state.deferring -= 1
    if state.received is not None:
        raise Interrupted(state.received, published=True)


def _start_reaper(state: StopState, run: _LiveRun) -> None:
    if state.reaper is not None and state.reaper.is_alive():
        return
    threading.excepthook = _quiet_excepthook
    state.reaper = threading.Thread(target=_reap, args=(state, run, time.monotonic() + DEADLINE_S),
                                    name="interrupt-reaper", daemon=True)
    state.reaper.start()


def _quiet_excepthook(args: threading.ExceptHookArgs) -> None:
    """After a stop signal, runner threads fail as their workers die; that is the stop, not news."""


def _reap(state: StopState, run: _LiveRun, deadline: float) -> None:
    """Kill the processes started during ``run`` until it has unwound (in the CLI: until the process
    exits); at the deadline, clean up and exit."""
    while state.owns_process or not run.over.is_set():
        for pid, started in _descendant_ids(os.getpid()):
            if (pid, started) not in run.preexisting:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            live = list(state.live)  # a run that started after the signal holds the cleanup
            _exit_now(state, live[-1] if live else run)
        time.sleep(_REAP_INTERVAL_S)


def _exit_now(state: StopState, run: _LiveRun) -> None:
    """The last resort: unwinding hung past the deadline."""
    with contextlib.suppress(Exception):  # best effort: the process is going down either way
        run.last_resort()
    with contextlib.suppress(OSError, ValueError):  # after SIGHUP the terminal may be gone
        sys.stderr.write("\n" + (state.exit_message or "{verb}").format(
            verb=Interrupted(state.received or signal.SIGTERM).verb) + "\n")
        sys.stderr.flush()
    os._exit(128 + (state.received or signal.SIGTERM))


def _descendant_ids(root: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every process below ``root`` (Linux: from /proc; elsewhere none are found).

    The start time tells a process from a later one that reuses its pid.
    """
    children: dict[int, list[tuple[int, int]]] = {}
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
        # The command name (in parentheses) may hold spaces; after it: state, parent pid, ... start time (20th).
        fields = stat[stat.rfind(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append((int(entry), int(fields[19])))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child[0])
    return found
