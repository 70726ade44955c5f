"""Named fault-injection points, so tests can kill or pause a real conversion at an exact moment.

A conversion passes through :func:`point` at each step that matters for
crash safety. Unless the environment variable ``IMGSHARDS_FAULT`` names that
point, it does nothing. ``IMGSHARDS_FAULT=kill@before-commit`` sends the
process SIGKILL there (no cleanup handlers run, exactly like ``kill -9`` or the
OOM killer); ``fail@bucket-ordered`` raises :class:`InjectedFailure` there (a
worker's error, as a full disk or a lost connection raises);
``term@shard-written`` sends SIGTERM (a preemption; in-memory runs, whose
workers are the launcher's threads); ``sleep:2.5@listed`` pauses, so a test can change the inputs in between.
SQLite and etcd test crash safety the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import time

ENV = "IMGSHARDS_FAULT"

# The points, in the order a run passes them.
POINTS = (
    "locked",  # holding the lock on OUT, nothing written yet
    "listed",  # SRC listed into part files, staging created, the run resumable
    "part-validated",  # a worker has validated one part (its runs, hashes, rejections and counts written)
    "bucket-ordered",  # a worker has sorted one key bucket into its shard slices
    "shard-written",  # a worker has written one shard into staging
    "duplicates-found",  # a worker has searched one content-hash range for identical images
    "pipeline-done",  # every shard written, manifest not yet built
    "before-commit",  # manifest built, OUT untouched
    "displaced",  # (fallback commit only) old dataset moved aside, new one not yet in place
    "committed",  # dataset published, lock still held
)
# Passed only when OUT is in an object store, where the commit moves files one by one.
REMOTE_POINTS = (
    "retracted",  # commit record written, old manifest deleted: readers see no dataset
    "moving",  # the first new file moved into OUT, the rest still in staging
)

logger = logging.getLogger(__name__)


class InjectedFailure(RuntimeError):
    """Raised at a point named by ``fail@POINT``."""


def point(name: str) -> None:
    """Kill or pause here if ``IMGSHARDS_FAULT`` asks for it."""
    spec = os.environ.get(ENV)
    if not spec or "@" not in spec:
        return
    action, _, where = spec.partition("@")
    if where != name:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":  # a preemption at an exact moment (the process must be the launcher: in-memory runs)
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "fail":
        raise InjectedFailure(f"injected failure at {name}")
    elif action.startswith("sleep:"):
        seconds = float(action.split(":", 1)[1])
        logger.info("fault point %s: sleeping %.1f s", name, seconds)
        time.sleep(seconds)


def fallback_requested() -> bool:
    """True when a test targets the "displaced" point, which only the two-rename commit passes."""
    return os.environ.get(ENV, "").endswith("@displaced")
