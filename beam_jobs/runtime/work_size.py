"""How much work a local run asks of one core, and from what size worker processes pay for themselves.

In: a run's image count and stored bytes, from its plan (:class:`Work`, weighed by ``runners.sized_for``), or,
before any plan, from a bounded walk of a local SRC (:func:`glance`). Out: one core's estimated seconds, and
whether a run that size gets worker processes (:func:`wants_workers`).

This module imports no Beam: the CLI asks it before it imports Beam itself, to start the workers' forkserver
(``beam_jobs.runtime.worker_start``) only for runs that will use workers. A forkserver started for a run that
then stays in one process imports Beam for nothing on the other core, and holds the run's stdout and stderr
open until that import ends (a caller reading the run's output waits for it).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

PER_IMAGE_S = 0.002
CHECK_BYTES_PER_S = 35e6
DOWNSIZE_BYTES_PER_S = 15e6
# Local workers pay off once the work outlasts what starting them costs (docs/design.md, "Who converts a small
# run"): forked from the forkserver, whose import of Beam overlaps the launcher's, they cost little to start.
WORKERS_FROM_S = 6.0
# A glance walks at most this many entries of SRC before it gives up (the run is then taken to be large).
GLANCE_ENTRIES = 20_000
# Files a glance cannot weigh from their size: archives and tables hold many images of unknown count.
_CONTAINERS = (".tar", ".tgz", ".gz", ".bz2", ".xz", ".zst", ".zip", ".parquet", ".arrow")


@dataclasses.dataclass(frozen=True)
class Work:
    """What a run's images ask of the workers, estimated before any is read: how many, their bytes (as stored
    in SRC; an estimate where sizes are unknown), and whether they will be decoded to be downsized."""

    images: int
    input_bytes: int
    downsizing: bool = False

    def seconds(self) -> float:
        """One core's seconds for this work: a fixed cost an image (read, hash, check, write again) and a cost a
        byte, decoding being the most of it. Measured on 2-core machines (docs/design.md, "Who converts a small
        run"): about 2 ms an image; 35 MB/s validating JPEGs stored as they are, 15 MB/s decoding to downsize."""
        return self.images * PER_IMAGE_S + self.input_bytes / (DOWNSIZE_BYTES_PER_S if self.downsizing
                                                                else CHECK_BYTES_PER_S)


def wants_workers(work: Work) -> bool:
    """Whether a local run of ``work`` gets a worker process per core rather than staying in the launcher's."""
    return work.seconds() > WORKERS_FROM_S


def glance(src: str, downsizing: bool = False, entries_at_most: int = GLANCE_ENTRIES) -> Optional[Work]:
    """The work of a local folder SRC, from its files' count and sizes, before any plan; None where a glance
    cannot tell (not a local folder, an archive or table inside, more than ``entries_at_most`` entries).

    Every file counts as an image (annotation and label files too), so the glance errs towards workers; it stops
    as soon as the work passes :data:`WORKERS_FROM_S`, so a large tree costs a few thousand ``stat`` calls.
    """
    if "://" in src or not os.path.isdir(src):
        return None
    rate = DOWNSIZE_BYTES_PER_S if downsizing else CHECK_BYTES_PER_S
    images = size = entries = 0
    folders = [src]
    while folders:  # entry by entry (os.scandir), so a flat folder of a million files is not listed whole
        try:
            listing = os.scandir(folders.pop())
        except OSError:
            continue  # unreadable: the plan says what it is
        with listing:
            for entry in listing:
                entries += 1
                if entries > entries_at_most or entry.name.lower().endswith(_CONTAINERS):
                    return None
                try:
                    if entry.is_dir():
                        folders.append(entry.path)
                        continue
                    size += entry.stat().st_size
                except OSError:
                    continue  # gone, or a broken link
                images += 1
                if images * PER_IMAGE_S + size / rate > WORKERS_FROM_S:
                    return Work(images, size, downsizing)
    return Work(images, size, downsizing)
