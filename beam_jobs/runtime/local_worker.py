"""A local worker process: Beam's SDK harness, without its start-up chatter on our terminal.

``python -m beam_jobs.runtime.local_worker`` is what the FnApiRunner starts, one per
core, in a local multi-processing run (see ``beam_jobs.runtime.runners``). Beam's own
``sdk_worker_main`` logs to the inherited stderr while it starts ("apitools
not found...", "Logging handler created.") and again at every shutdown, above
the user's progress bars. Here the worker's stderr handler shows only what the
harness log level (``--default_sdk_harness_log_level``, INFO with ``-v``)
lets through (WARNING for the CLI's ``-v``), less Beam's noise about what the converter set up
itself; every record still reaches the runner through Beam's logging
channel, and worker errors reach it through the control channel.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys

from beam_jobs.runtime.log_filters import not_beam_noise


def _pipeline_option(name: str) -> object:
    """One of the run's pipeline options (the runner puts them in the worker's environment), or None."""
    try:
        options = json.loads(os.environ.get("PIPELINE_OPTIONS", "{}"))
    except ValueError:
        return None
    options = options.get("options", options)
    return options.get(name) if name in options else options.get(f"beam:option:{name}:v1")


def _harness_log_level() -> int:
    """The level the run asked its workers to log at."""
    name = _pipeline_option("default_sdk_harness_log_level")
    return getattr(logging, str(name).upper(), logging.INFO) if name else logging.INFO


def die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent (the launcher) dies, even by SIGKILL or the OOM
    killer; it exits at once if that parent is gone already."""
    launcher = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the launcher's stop still kills its workers
    if os.getppid() != launcher:  # it died before the request took effect
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def main() -> None:
    # Ctrl-C reaches every process of the terminal's group, and Slurm or Kubernetes send SIGTERM to
    # all of them: the launcher alone reports the stop and kills its workers (beam_jobs.runtime.interrupt).
    # A worker that died of the signal itself would only turn the stop into a "failed" run.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(_harness_log_level())
    handler.addFilter(not_beam_noise)
    # Installed before Beam is imported, so Beam's import-time warnings and later basicConfig calls use it;
    # forced, as a worker forked from the forkserver (beam_jobs.runtime.worker_start) has its handler already.
    logging.basicConfig(handlers=[handler], format="%(levelname)s %(name)s: %(message)s", force=True)
    from apache_beam.runners.worker import sdk_worker_main

    no_auth = bool(_pipeline_option("no_auth"))
    if no_auth or os.environ.get("STORAGE_EMULATOR_HOST"):  # (the import costs the others nothing)
        from beam_jobs.files.filesystems import gcs_anonymous_when_asked

        gcs_anonymous_when_asked(no_auth)

    sdk_worker_main.main(sys.argv)


if __name__ == "__main__":
    main()
