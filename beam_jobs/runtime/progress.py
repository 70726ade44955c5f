"""Progress of a running conversion, visible to the launching process on any runner.

Workers may be other processes or other machines, so they report through the
run's scratch folder: each DoFn instance rewrites one small file with its
running count at most once a second. The launcher sums those files into tqdm
bars on a terminal, or into lines when its output goes to a pipe or a log file:
at the listing's end, seconds into the work, every 30 s and at each phase's end.
Cheap (a few bytes per second per worker) and runner-independent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from typing import Optional, TextIO

from beam_jobs.files.filesystems import FileSystems

_INTERVAL_S = 1.0


class ProgressWriter:
    """Counts events in a worker and publishes the count now and then."""

    def __init__(self, folder: str, phase: str) -> None:
        self._path = FileSystems.join(folder, f"{phase}-{uuid.uuid4().hex}.txt")
        self._count = 0
        self._resumed = 0  # of which a stopped run had done the work (found done, not done again)
        self._last = 0.0

    def add(self, count: int = 1, resumed: bool = False) -> None:
        self._count += count
        self._resumed += count if resumed else 0
        now = time.monotonic()
        if now - self._last >= _INTERVAL_S:
            self.flush()
            self._last = now

    def flush(self) -> None:
        with FileSystems.create(self._path) as handle:
            handle.write(f"{self._count} {self._resumed}".encode("ascii"))


def read_progress(folder: str, phase: str, resumed: bool = False) -> int:
    """Sum of the counts all workers published for ``phase`` (``resumed``: of those, the ones found done)."""
    try:
        matches = FileSystems.match([FileSystems.join(folder, f"{phase}-*.txt")])[0].metadata_list
    except OSError:
        return 0
    total = 0
    for meta in matches:
        try:
            with FileSystems.open(meta.path) as handle:
                fields = (handle.read() or b"0").split()
                total += int(fields[1] if resumed else fields[0]) if len(fields) > int(resumed) else 0
        except (OSError, ValueError):
            continue  # being rewritten right now; next poll gets it
    return total


PHASES = ("validate", "write")
# How a run shows its progress: tqdm bars on a terminal; into a pipe or a log file (Slurm, Kubernetes,
# nohup), where carriage returns are noise, a line now and then and at each phase's end; or nothing.
BARS, LINES, OFF = "bars", "lines", "off"
LINE_INTERVAL_S = 30.0  # as tqdm's non-terminal users and Beam's own logs pace themselves
FIRST_LINE_S = 3.0  # after the first image is counted: a log shows work under way within seconds, with a rate


def choose_mode(requested: object, local: bool, stream: TextIO) -> str:
    """:data:`BARS`, :data:`LINES` or :data:`OFF` for a run whose progress would go to ``stream``.

    ``requested``: True/False (bars or nothing, the Python API's choice),
    ``"auto"`` (the CLI's: bars on a terminal with a size, lines anywhere else),
    or None (the API's default: bars for a local run on a sized terminal, else nothing).
    """
    if requested is False:
        return OFF
    if requested is True:
        return BARS
    bars = _sized_terminal(stream)
    if requested == "auto":
        return BARS if bars else LINES
    return BARS if bars and local else OFF


def _sized_terminal(stream: TextIO) -> bool:
    """A terminal that tqdm can draw in: under ``script`` with no window size, it has 0 columns."""
    try:
        return stream.isatty() and os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):  # replaced by an object without them, closed, or no size
        return False


class ProgressBars:
    """Progress of the validate and write phases, read by a polling thread: tqdm bars, or lines."""

    def __init__(self, folder: str, total: int, enabled: object, stream: Optional[TextIO] = None,
                 interval_s: float = LINE_INTERVAL_S, parts: int = 0) -> None:
        self._folder = folder
        self._total = total
        self._parts = parts
        mode = enabled if enabled in (BARS, LINES, OFF) else BARS if enabled else OFF
        self._mode = OFF if mode == LINES and total == 0 else mode
        self._stream = stream
        self._interval_s = interval_s
        self._last_line = ""
        self._completed = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "ProgressBars":
        if self._mode != OFF:
            target = self._poll if self._mode == BARS else self._print_lines
            self._thread = threading.Thread(target=target, name="converter-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._completed = exc_info[0] is None  # a stopped or failed run ends in its own one line, not progress
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _poll(self) -> None:
        from tqdm import tqdm  # only the launcher needs it

        bars = {
            phase: tqdm(total=self._total, desc=phase, unit="img", position=i, leave=True, dynamic_ncols=True)
            for i, phase in enumerate(PHASES)
        }
        while True:
            stopping = self._stop.wait(0.5)
            for phase, bar in bars.items():
                bar.n = read_progress(self._folder, phase)
                bar.refresh()
            if stopping:
                break
        for bar in bars.values():
            bar.close()

    def _print_lines(self) -> None:
        """Into a log: a line when the listing ends, one a few seconds after work starts (so a long first
        phase never looks hung), one at each phase's end and every ``interval_s`` between."""
        rates = {phase: _Rate() for phase in PHASES}
        finished: set[str] = set()
        self._write(f"progress: {self._total:,} images listed" + (f" in {self._parts:,} parts" if self._parts else "")
                    + "; validating")
        last_line = time.monotonic()
        first_count: Optional[float] = None  # when work was first seen under way; its line follows soon
        while True:
            stopping = self._stop.wait(1.0)
            counts = {phase: read_progress(self._folder, phase) for phase in PHASES}
            for phase in PHASES:
                rates[phase].see(counts[phase])
            ended = {phase for phase in PHASES if counts[phase] >= self._total} - finished
            # A run quicker than one poll still says where each phase ended, once, in order.
            for phase in PHASES if stopping and self._completed else ():
                if phase in ended:
                    shown = {p: counts[p] if PHASES.index(p) <= PHASES.index(phase) or p in finished else 0
                             for p in PHASES}
                    self._write(progress_line(shown, self._total, rates))
                    finished.add(phase)
            if stopping:
                # Where the run ended (the write phase counts accepted images only: with rejections it
                # never reaches the listed total, so its end is the last count).
                final = progress_line(counts, self._total, rates)
                if self._completed and final != self._last_line:
                    self._write(final)
                return
            now = time.monotonic()
            if first_count is None and any(counts.values()):
                first_count = now
            early = first_count is not None and now - first_count >= FIRST_LINE_S and last_line < first_count
            if ended or early or now - last_line >= self._interval_s:
                finished |= ended
                last_line = time.monotonic()
                self._write(progress_line(counts, self._total, rates))

    def _write(self, line: str) -> None:
        self._last_line = line
        stream = self._stream or sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # the log went away (a closed pipe): progress is not worth failing for
            pass


class _Rate:
    """Images a second of one phase, from its first count on (a phase starts after the one before)."""

    def __init__(self) -> None:
        self._first: Optional[tuple[float, int]] = None
        self.per_s = 0.0

    def see(self, count: int) -> None:
        now = time.monotonic()
        if self._first is None:
            if count:
                self._first = (now, count)
            return
        elapsed = now - self._first[0]
        if elapsed > 0:
            self.per_s = (count - self._first[1]) / elapsed


def progress_line(counts: dict, total: int, rates: dict) -> str:
    """``progress: validate 3,000/3,000 (100%) | write 1,200/3,000 (40%), 85 img/s, ETA 0:00:21``."""
    parts = []
    for phase in PHASES:
        count, rate = counts[phase], rates[phase].per_s
        part = f"{phase} {count:,}/{total:,} ({100 * count // max(total, 1)}%)"
        if 0 < count < total and rate > 0:
            eta = int((total - count) / rate)
            part += f", {rate:,.0f} img/s, ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}"
        parts.append(part)
    return "progress: " + " | ".join(parts)
