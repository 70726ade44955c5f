"""A local worker process: Beam's SDK harness, without its start-up chatter on our terminal.

``python -m beam_jobs.local_worker`` is what the FnApiRunner starts, one per
core, in a local multi-processing run (see ``beam_jobs.runners``). Beam's own
``sdk_worker_main`` logs to the inherited stderr while it starts ("apitools
not found...", "Logging handler created.") and again at every shutdown, above
the user's progress bars. Here the worker's stderr handler shows only what the
harness log level (``--default_sdk_harness_log_level``, INFO with ``-v``)
lets through; every record still reaches the runner through Beam's logging
channel, and worker errors reach it through the control channel.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys


def _harness_log_level() -> int:
    """The level the run asked its workers to log at (the pipeline options are in the environment)."""
    try:
        options = json.loads(os.environ.get("PIPELINE_OPTIONS", "{}"))
    except ValueError:
        return logging.INFO
    options = options.get("options", options)
    name = options.get("default_sdk_harness_log_level") or options.get("beam:option:default_sdk_harness_log_level:v1")
    return getattr(logging, str(name).upper(), logging.INFO) if name else logging.INFO


def main() -> None:
    # Ctrl-C reaches every process of the terminal's group: the launcher reports it once and
    # stops the run; a worker ends when the runner closes its control channel (or kills it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(_harness_log_level())
    # Installed before Beam is imported, so Beam's import-time warnings and later basicConfig calls use it.
    logging.basicConfig(handlers=[handler], format="%(levelname)s %(name)s: %(message)s")
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(sys.argv)


if __name__ == "__main__":
    main()
