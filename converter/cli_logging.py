"""How the command line's log lines read: ``warning: ...`` as the summary's warnings read; ``-v`` adds more.

In: whether the run is verbose. Out: the root logger's handler and the levels of our loggers and Beam's.
"""

from __future__ import annotations

import logging

from beam_jobs.runtime.log_filters import not_beam_noise


class _CliFormatter(logging.Formatter):
    """``warning: ...`` as the summary's warnings and ``error: ...`` read; ``-v`` adds level and logger names."""

    def __init__(self, verbose: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s" if verbose else None)
        self._verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        if self._verbose:
            return super().format(record)
        return f"{record.levelname.lower()}: {record.getMessage()}"


def configure_logging(verbose: bool) -> None:
    """Our warnings and errors; with ``-v`` our own messages too, and Beam's warnings, never its chatter."""
    handler = logging.StreamHandler()
    handler.setFormatter(_CliFormatter(verbose))
    handler.addFilter(not_beam_noise)
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, handlers=[handler])
    if verbose:
        # Our loggers at INFO whatever ran before in this process: a quiet run (main() called twice, a notebook,
        # the tests' in-process runs) left them at WARNING, and -v showed none of our messages. A record's level is
        # checked at its own logger only, so the root's level (basicConfig keeps an existing one) does not matter.
        for name in ("converter", "beam_jobs", "reader"):
            logging.getLogger(name).setLevel(logging.INFO)
        # Beam's INFO lines (57 "Converting string literal type hint" for 12 images, each worker's start-up
        # and shutdown) say nothing about the conversion; its warnings do. Workers follow (pipeline.py).
        logging.getLogger("apache_beam").setLevel(logging.WARNING)
    else:
        for name in ("converter", "beam_jobs", "reader"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # A failed pipeline is reported once, by us; Beam would log the worker's whole stack first.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
