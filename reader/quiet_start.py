"""TensorFlow loaded without its start-up lines, which ignore ``TF_CPP_MIN_LOG_LEVEL``.

In: nothing; ``reader/__init__`` calls :func:`load_tensorflow` before anything
imports TensorFlow. Out: TensorFlow imported and its devices listed, and on
stderr only the C++ lines the log level lets through.

Since TensorFlow 2.20 its libraries log while they load, before absl's
logging is initialised, and absl writes those lines to stderr whatever
``TF_CPP_MIN_LOG_LEVEL`` says (tensorflow/tensorflow#100442): every
``import tensorflow`` on a CPU machine printed absl's "All log messages
before absl::InitializeLog()" warning and the oneDNN and "Could not find cuda
drivers" INFO lines, twice (two libraries), and the first operation printed
"failed call to cuInit". So the import and the device listing (where cuInit
runs) write their file descriptor 2 into a temporary file, and what they
wrote is passed on filtered: an absl line (``I0000 00:00:...``) only at or
above the level ``TF_CPP_MIN_LOG_LEVEL`` sets (INFO 0, WARNING 1, ERROR 2,
FATAL 3), as TensorFlow means it to; the preamble only when a line it
introduces is kept; other libraries' lines unchanged. Python's own
``sys.stderr`` (warnings, logging) bypasses the capture and is written at once. One more is dropped: "failed call to cuInit" where TensorFlow has
just said the machine has no CUDA driver (that failure says nothing new; with
a driver, it is kept).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}
_NO_DRIVER = "Could not find cuda drivers on your machine"
_CUINIT_FAILED = "failed call to cuInit"


def min_log_level() -> int:
    """The level ``TF_CPP_MIN_LOG_LEVEL`` sets, as TensorFlow reads it (0 when unset or not a number)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def filtered(text: str, level: int) -> str:
    """``text`` written to stderr while TensorFlow loaded, less the absl lines under ``level``.

    A line that continues a dropped absl line (no prefix of its own, right after
    it: cpu_feature_guard's instruction list) goes with it.
    """
    kept: list[str] = []
    preamble = False  # a preamble waiting for a line it introduces
    dropping = False
    no_driver = _NO_DRIVER in text
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == PREAMBLE:
            preamble, dropping = True, False
            continue
        absl = _ABSL_LINE.match(line)
        if absl is None:
            if not dropping:
                kept.append(line)
            continue
        dropping = _LEVELS[absl.group(1)] < level or (level > 0 and no_driver and _CUINIT_FAILED in line)
        if not dropping:
            if preamble:
                kept.append(PREAMBLE + "\n")
            kept.append(line)
        preamble = False
    return "".join(kept)


@contextlib.contextmanager
def _fd2_into(capture) -> Iterator[None]:
    """File descriptor 2 written into ``capture`` meanwhile; Python's ``sys.stderr`` still reaches the real one."""
    sys.stderr.flush()
    saved = os.dup(2)
    python_stderr = sys.stderr
    try:
        os.dup2(capture.fileno(), 2)
        if getattr(python_stderr, "fileno", None) and _is_fd2(python_stderr):
            sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding=python_stderr.encoding,
                                   errors=python_stderr.errors)
        yield
    finally:
        if sys.stderr is not python_stderr:
            sys.stderr.close()
            sys.stderr = python_stderr
        python_stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _is_fd2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (OSError, ValueError, AttributeError):  # a notebook's stream has no descriptor
        return False


def load_tensorflow() -> None:
    """Import TensorFlow and list its devices with its start-up lines filtered (see the module's docstring).

    Sets ``TF_CPP_MIN_LOG_LEVEL=1`` unless the environment sets a level: TensorFlow's C++ code also logs an
    INFO line for every TFRecord file it opens, once per pipeline and shard. Does nothing once TensorFlow is
    loaded (its level was read then) or where file descriptor 2 cannot be duplicated.
    """
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        os.fstat(2)
        capture = tempfile.TemporaryFile()
    except OSError:  # no stderr, or no descriptor to spare: load it as it comes
        import tensorflow  # noqa: F401
        return
    with capture:
        try:
            with _fd2_into(capture):
                import tensorflow as tf

                tf.config.list_physical_devices("GPU")  # cuInit runs here, not at the user's first operation
        finally:
            capture.seek(0)
            shown = filtered(capture.read().decode("utf-8", "replace"), min_log_level())
            if shown:
                sys.stderr.write(shown)
                sys.stderr.flush()
