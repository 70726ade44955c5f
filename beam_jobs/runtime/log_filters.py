"""What the converter's processes keep out of their logs: Beam's noise about what the converter set up itself.

In: log records of the launcher (the CLI's handler) and of each local worker. Out: filters. A module of
its own, standard library only, because the worker installs it before Beam is imported and the CLI before
Beam loads.
"""

from __future__ import annotations

import logging
import re


# Warnings Beam logs about what the converter itself set up (a directory local workers never need), or
# about clients a local run never uses; and the flags the runner passes its own workers.
BEAM_NOISE = ("No semi_persistent_directory found", "apitools not found")
_RUNNERS_OWN_FLAGS = {"--pipeline_type_check", "--direct_runner_use_stacked_bundle"}
_DISCARDING = re.compile(r"Discarding unparseable args: \[(.*)\]")


def not_beam_noise(record: logging.LogRecord) -> bool:
    """A logging filter: drops Beam's warnings about what the converter set up itself (see BEAM_NOISE)."""
    message = record.getMessage()
    discarded = _DISCARDING.search(message)
    if discarded and {flag.strip(" '\"") for flag in discarded.group(1).split(",")} <= _RUNNERS_OWN_FLAGS:
        return False
    return not any(noise in message for noise in BEAM_NOISE)


class NotRelayedWorkerRecords(logging.Filter):
    """Drops the runner's copies of worker log records: each local worker prints its own (beam_jobs.runtime.local_worker).

    The runner logs every record it receives as ``Worker: <protobuf dump>``;
    with both, ``-v`` showed every line twice, once unreadable.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("Worker: "))


def drop_relayed_worker_logs() -> None:
    relay = logging.getLogger("apache_beam.runners.portability.local_job_service")
    if not any(isinstance(f, NotRelayedWorkerRecords) for f in relay.filters):
        relay.addFilter(NotRelayedWorkerRecords())
