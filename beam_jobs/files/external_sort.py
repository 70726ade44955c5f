"""Byte records sorted on a task's local disk, a bounded run at a time.

In:  byte strings of any content (a newline or a NUL inside is kept), added one at a time.
Out: :meth:`ExternalSort.sorted`: them in byte order, each once per time it was added.

Why (#56 §5: memory flat in N): a task that sorts what it found holds all of it; the near groups' task held
every group line, and the leaks of every range, at once (~600 bytes an image with a near pair). Here a task
holds :data:`RUN_BYTES` of records at most: each full run is sorted and written to a scratch file as
``u32 length, bytes`` frames, and :meth:`ExternalSort.sorted` merges the runs (``heapq.merge``: one record
of each run in memory, a buffered read of each). Scratch files live in a local folder the caller owns (a
task's temporary folder: the work folder may be an object store) and are removed as they are read.
"""

from __future__ import annotations

import heapq
import os
import struct
from typing import BinaryIO, Iterable, Iterator

RUN_BYTES = 16 << 20  # records held before a run is written: their bytes and each one's object (~40 bytes)
FAN_IN = 64  # runs merged at once (a 64 KB read buffer each); more are merged into fewer first
_OBJECT_BYTES = 40
_LENGTH = struct.Struct(">I")


class ExternalSort:
    """Records added in any order, given back sorted; memory: ``run_bytes`` (and a read buffer a run)."""

    def __init__(self, scratch: str, name: str, run_bytes: int = RUN_BYTES) -> None:
        self._scratch, self._name, self._run_bytes = scratch, name, run_bytes
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._runs: list[str] = []
        self._written = 0

    def add(self, record: bytes) -> None:
        self._held.append(record)
        self._held_bytes += len(record) + _OBJECT_BYTES
        if self._held_bytes >= self._run_bytes:
            self._spill()

    def _spill(self) -> None:
        self._held.sort()
        self._runs.append(self._write_run(self._held))
        self._held, self._held_bytes = [], 0

    def _write_run(self, records: Iterable[bytes]) -> str:
        path = os.path.join(self._scratch, f"{self._name}-{self._written}.run")
        self._written += 1
        with open(path, "wb") as out:
            write_frames(out, records)
        return path

    def sorted(self) -> Iterator[bytes]:
        """Every record added, in byte order (once: the runs are removed as they are read)."""
        if not self._runs:
            self._held.sort()
            held, self._held = self._held, []
            yield from held
            return
        if self._held:
            self._spill()
        runs, self._runs = self._runs, []
        while len(runs) > FAN_IN:  # each record merged log_FAN_IN(runs) times, FAN_IN files open at once
            runs = runs[FAN_IN:] + [self._write_run(_merged(runs[:FAN_IN]))]
        yield from _merged(runs)


def _merged(runs: list[str]) -> Iterator[bytes]:
    """The records of sorted run files, merged; each file removed once read."""
    handles = [open(path, "rb", buffering=1 << 16) for path in runs]
    try:
        yield from heapq.merge(*(read_frames(handle) for handle in handles))
    finally:
        for handle, path in zip(handles, runs):
            handle.close()
            os.remove(path)


def write_frames(out: BinaryIO, records: Iterable[bytes]) -> None:
    """Records as ``u32 length, bytes`` frames (a record may hold any byte)."""
    for record in records:
        out.write(_LENGTH.pack(len(record)))
        out.write(record)


def read_frames(handle: BinaryIO) -> Iterator[bytes]:
    """The records :func:`write_frames` wrote, in order."""
    while head := handle.read(_LENGTH.size):
        (size,) = _LENGTH.unpack(head)
        yield handle.read(size)
