"""Progress into a pipe or a log file: a line now and then and at each phase's end; bars only on a sized terminal."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios
import time

import pytest

from beam_jobs.runtime.progress import FIRST_LINE_S, BARS, LINES, OFF, ProgressBars, ProgressWriter, choose_mode


@pytest.mark.slow  # seconds of waiting for the intervals
def test_lines_come_at_each_phase_end_and_every_interval(tmp_path):
    stream = io.StringIO()
    validate, write = ProgressWriter(str(tmp_path), "validate"), ProgressWriter(str(tmp_path), "write")
    with ProgressBars(str(tmp_path), 100, enabled=LINES, stream=stream, interval_s=1.5):
        validate.add(40)
        validate.flush()
        time.sleep(2.5)  # one interval: a line with the count so far
        validate.add(60)
        validate.flush()
        time.sleep(1.5)  # validate ends: a line at once
        write.add(100)
        write.flush()
        time.sleep(1.5)  # write ends
    lines = stream.getvalue().splitlines()
    assert lines[0] == "progress: 100 images listed; validating"
    assert lines[1].startswith("progress: validate 40/100 (40%)")
    assert "progress: validate 100/100 (100%) | write 0/100 (0%)" in lines
    assert lines[-1] == "progress: validate 100/100 (100%) | write 100/100 (100%)"
    assert all(line.startswith("progress: ") for line in lines)


def test_the_mode_follows_where_the_output_goes(tmp_path):
    with open(tmp_path / "log", "w") as log:
        assert choose_mode("auto", True, log) == LINES  # nohup ... > log
        assert choose_mode(None, True, log) == OFF  # the Python API stays quiet unless asked
        assert choose_mode(False, True, log) == OFF and choose_mode(True, False, log) == BARS
    leader, follower = pty.openpty()  # a real terminal, first without a size (as under `script`)
    with os.fdopen(follower, "w") as terminal:
        assert choose_mode("auto", True, terminal) == LINES
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        assert choose_mode("auto", True, terminal) == BARS
        assert choose_mode(None, False, terminal) == OFF  # remote runners: no bars unless asked
    os.close(leader)


def test_a_run_quicker_than_one_poll_still_says_where_each_phase_ended(tmp_path):
    stream = io.StringIO()
    with ProgressBars(str(tmp_path), 12, enabled=LINES, stream=stream):
        for phase in ("validate", "write"):
            writer = ProgressWriter(str(tmp_path), phase)
            writer.add(12)
            writer.flush()
    assert stream.getvalue().splitlines() == ["progress: 12 images listed; validating",
                                              "progress: validate 12/12 (100%) | write 0/12 (0%)",
                                              "progress: validate 12/12 (100%) | write 12/12 (100%)"]


@pytest.mark.slow  # seconds of waiting for the first line
def test_a_log_gets_a_line_when_listing_ends_and_one_seconds_after_work_starts(tmp_path):
    """A 54 s run once wrote its first line at 30 s and looked hung."""
    stream = io.StringIO()
    validate = ProgressWriter(str(tmp_path), "validate")
    with ProgressBars(str(tmp_path), 3000, enabled=LINES, stream=stream, parts=24):
        time.sleep(1.2)
        validate.add(10)
        validate.flush()
        time.sleep(FIRST_LINE_S + 1.5)
        assert stream.getvalue().splitlines()[0] == "progress: 3,000 images listed in 24 parts; validating"
        assert stream.getvalue().splitlines()[1].startswith("progress: validate 10/3,000 (0%)")


def test_with_rejections_the_last_line_says_where_the_write_phase_ended(tmp_path):
    """Rejected images are never written, so the write count stays below the listed total: its end is the last
    count, printed when the run ends."""
    stream = io.StringIO()
    with ProgressBars(str(tmp_path), 12, enabled=LINES, stream=stream):
        for phase, count in (("validate", 12), ("write", 9)):
            writer = ProgressWriter(str(tmp_path), phase)
            writer.add(count)
            writer.flush()
    assert stream.getvalue().splitlines()[-1] == "progress: validate 12/12 (100%) | write 9/12 (75%)"
