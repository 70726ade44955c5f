"""The command line's logging: ``-v`` shows our messages whatever ran before in the same process."""

from __future__ import annotations

import logging

from converter.cli_logging import configure_logging

_OURS = ("converter", "beam_jobs", "reader", "apache_beam")


def test_verbose_shows_our_info_lines_after_a_quiet_run_in_the_same_process():
    """A quiet run set our loggers to WARNING; a verbose run after it (main() called twice, a notebook, the tests'
    in-process runs) showed none of its INFO lines: the object-store test missing its scan line in CI was this."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {name: logging.getLogger(name).level for name in _OURS}
    root.handlers = []
    try:
        configure_logging(verbose=False)
        assert not logging.getLogger("beam_jobs.sources.archives.archive_scan").isEnabledFor(logging.INFO)
        configure_logging(verbose=True)
        for name in ("converter.cli", "beam_jobs.sources.archives.archive_scan", "reader.info"):
            assert logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert not logging.getLogger("apache_beam.runners").isEnabledFor(logging.INFO)  # Beam's chatter stays out
    finally:
        root.handlers, root.level = saved[0], saved[1]
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)
