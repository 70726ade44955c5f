"""Progress of a running conversion, visible to the launching process on any runner.

Workers may be other processes or other machines, so they report through the
run's scratch folder: each DoFn instance rewrites one small file with its
running count at most once a second. The launcher sums those files into tqdm
bars. Cheap (a few bytes per second per worker) and runner-independent.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Optional

from beam_jobs.filesystems import FileSystems

_INTERVAL_S = 1.0


class ProgressWriter:
    """Counts events in a worker and publishes the count now and then."""

    def __init__(self, folder: str, phase: str) -> None:
        self._path = FileSystems.join(folder, f"{phase}-{uuid.uuid4().hex}.txt")
        self._count = 0
        self._last = 0.0

    def add(self, count: int = 1) -> None:
        self._count += count
        now = time.monotonic()
        if now - self._last >= _INTERVAL_S:
            self.flush()
            self._last = now

    def flush(self) -> None:
        with FileSystems.create(self._path) as handle:
            handle.write(str(self._count).encode("ascii"))


def read_progress(folder: str, phase: str) -> int:
    """Sum of the counts all workers published for ``phase``."""
    try:
        matches = FileSystems.match([FileSystems.join(folder, f"{phase}-*.txt")])[0].metadata_list
    except OSError:
        return 0
    total = 0
    for meta in matches:
        try:
            with FileSystems.open(meta.path) as handle:
                total += int(handle.read() or b"0")
        except (OSError, ValueError):
            continue  # being rewritten right now; next poll gets it
    return total


class ProgressBars:
    """tqdm bars for the validate and write phases, fed by a polling thread."""

    def __init__(self, folder: str, total: int, enabled: bool) -> None:
        self._folder = folder
        self._total = total
        self._enabled = enabled
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "ProgressBars":
        if self._enabled:
            self._thread = threading.Thread(target=self._poll, name="converter-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _poll(self) -> None:
        from tqdm import tqdm  # only the launcher needs it

        bars = {
            phase: tqdm(total=self._total, desc=phase, unit="img", position=i, leave=True, dynamic_ncols=True)
            for i, phase in enumerate(("validate", "write"))
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
