"""Where a conversion stages its work, and what a stopped one keeps: the names both sides look for.

A run writes its dataset into a private staging folder and publishes it
whole. Locally the folder sits beside OUT as ``.<name>.staging-<run>`` (so
the final rename stays on one file system); in an object store, where a
rename is a copy anyway, inside OUT as ``OUT/.staging-<run>``. Its work
folder ``_work/`` holds the run's intermediate files (the converter's
:class:`beam_jobs.files.work_layout.WorkLayout`) and two marks read by others:

- ``_work/resume.json``: the run's record. A staging folder holding it can
  be resumed by the same command (``beam_jobs.planning.resume``); the reader's
  ``inspect`` and its "no manifest" errors point at it.
- ``_work/counts/part-*.json``: one per validated part, written last, so a
  counted part is whole: a stopped run with none kept nothing worth keeping.

A remote commit in progress is marked by ``_commit.json`` (the new manifest)
in the staging folder: the next run finishes it.

Pure names, no I/O: the converter reads them through Beam's file systems,
the reader through TensorFlow's.
"""

from __future__ import annotations

import os
from typing import Iterable

WORK = "_work"
RESUME_RECORD = "resume.json"
RESUME_RECORD_PATH = f"{WORK}/{RESUME_RECORD}"
COMMIT_RECORD = "_commit.json"
# In the work folder: each validated part's counts, and each written shard's result.
COUNTS_FOLDER = "counts"
COUNTS_PATTERN = f"{COUNTS_FOLDER}/part-*.json"
SHARD_RESULTS_PATTERN = "*.tfrecord.json"

_REMOTE = ".staging-"


def part_counts_name(part: int) -> str:
    """The counts file of part ``part``, relative to the work folder."""
    return f"{COUNTS_FOLDER}/part-{part:06d}.json"


def shard_result_name(shard_file: str) -> str:
    """The result a written shard leaves in the work folder (its counts and SHA-256), relative to it."""
    return f"{shard_file}.json"


def sibling(out: str, kind: str, run: str = "") -> str:
    """``.<name>.<kind>-<run>`` beside a local OUT (kinds: staging, scratch, old), ``.<name>.<kind>`` without a run
    (the lock file)."""
    parent, name = os.path.split(os.path.abspath(out))
    return os.path.join(parent, f".{name}.{kind}-{run}" if run else f".{name}.{kind}")


def is_sibling(entry: str, out_name: str, kinds: Iterable[str] = ("staging",)) -> bool:
    """``entry`` (a name in OUT's parent folder) is one of OUT's ``kinds`` of sibling."""
    return entry.startswith(tuple(f".{out_name}.{kind}-" for kind in kinds))


def remote_staging(out: str, run: str) -> str:
    """The staging folder of run ``run`` inside an object store's OUT."""
    return out.rstrip("/") + f"/{_REMOTE}{run}"


def is_remote_staging(entry: str) -> bool:
    """``entry`` (a name inside an object store's OUT) is a staging folder, never part of the dataset."""
    return entry.startswith(_REMOTE)
