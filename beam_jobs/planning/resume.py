"""Resuming a killed conversion: the run's fingerprint, and which leftover staging folder it may continue.

A run writes a :class:`RunRecord` into its work folder once its part files
are complete. It fingerprints everything the output depends on: the options
(but ``--overwrite``), the listed images (split, label and path of each, in
listing order), the classes and their text, the part size and the work-file
format. A run killed later (SIGKILL, a crash, a lost machine) leaves its
staging folder; the next run with the same fingerprint continues in it. Every
stage writes its output whole and then a marker (a part's counts, a bucket's
``.done``, a shard's result, a hash range's summary), and skips work whose
marker exists, so the result is byte-identical to an uninterrupted run
(``tests/converter/test_resume.py``). A leftover with another fingerprint is
removed, and the log says why.

A run stopped by a signal (SIGTERM from Slurm, Kubernetes or a spot VM's
preemption, Ctrl-C, SIGHUP) keeps its staging folder too once a part is
validated (:func:`kept_work`), and says where: a polite stop must not cost
more than a SIGKILL does. Before that, nothing is worth keeping.

What the fingerprint cannot see: an input file rewritten in place under the
same name. A pass-through image is checked against its validated SHA-256 when
its shard is written (the run then fails and the next one starts fresh); a
shard completed before the change keeps the bytes that were validated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from typing import Optional, Sequence

from apache_beam.io.filesystem import BeamIOError

from beam_jobs.files import filesystems, publish, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputPlan
from beam_jobs.runtime import interrupt
from record_files import staging as staging_names

logger = logging.getLogger(__name__)

# Options that do not change the output.
_IGNORED = ("overwrite", "archive_scan", "card")  # none changes the shards


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What a run converts and how; equal fingerprints mean equal outputs."""

    fingerprint: str
    options: dict
    listing: str  # SHA-256 of the listed images
    num_listed: int
    part_size: int
    format: int = work_records.VERSION
    archives: dict = dataclasses.field(default_factory=dict)  # archive -> "size bytes, modified T"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunRecord":
        return cls(**json.loads(text))


def record_for(options: ConvertOptions, plan: InputPlan, part_size: int, listing: str) -> RunRecord:
    """The record of a run of ``options`` over ``plan``; ``listing``: the digest of its part files.

    (:func:`beam_jobs.stages.list_parts.write_parts` returns it: the parts are written
    before the run knows whether it resumes, and discarded if it does.)
    """
    # As JSON gives them back (tuples become lists), so a saved record compares equal to a new one.
    chosen = json.loads(json.dumps({key: value for key, value in options.to_json().items() if key not in _IGNORED},
                                   default=str))
    everything = json.dumps({"options": chosen, "listing": listing, "classes": list(plan.classes),
                             "class_text": list(plan.class_text), "part_size": part_size,
                             "format": work_records.VERSION, "archives": dict(plan.archives)},
                            sort_keys=True, default=str)
    return RunRecord(hashlib.sha256(everything.encode("utf-8")).hexdigest(), chosen, listing, len(plan.refs),
                     part_size, archives=dict(plan.archives))


def save(work: str, record: RunRecord) -> None:
    filesystems.write_text(FileSystems.join(work, publish.RESUME_RECORD), record.to_json())


def load(staging: str) -> Optional[RunRecord]:
    """The record in a staging folder, or None when it is missing or unreadable (a run of another release)."""
    try:
        return RunRecord.from_json(filesystems.read_text(FileSystems.join(publish.work_dir(staging),
                                                                      publish.RESUME_RECORD)))
    except (OSError, ValueError, TypeError):
        return None


def why_not(old: Optional[RunRecord], new: RunRecord) -> str:
    """Why a leftover run cannot be continued by this one, in the user's terms."""
    if old is None or old.format != new.format:
        return "it was written by another release"
    changed = [f"--{key.replace('_', '-')} {old.options.get(key)!r} -> {new.options.get(key)!r}"
               for key in sorted(set(old.options) | set(new.options)) if old.options.get(key) != new.options.get(key)]
    if changed:
        return "its options differ: " + ", ".join(changed)
    if old.archives != new.archives:
        changed = sorted(name for name in set(old.archives) | set(new.archives)
                         if old.archives.get(name) != new.archives.get(name))
        return f"an archive of --src changed: {changed[0]} ({old.archives.get(changed[0], 'absent')} -> " \
               f"{new.archives.get(changed[0], 'absent')})"
    if old.listing != new.listing:
        return f"the listed images changed ({old.num_listed} -> {new.num_listed} images)"
    if old.part_size != new.part_size:
        return f"its part size differs ({old.part_size} -> {new.part_size})"
    return "its classes or their text differ"


def choose(leftovers: Sequence[str], record: RunRecord) -> Optional[str]:
    """The leftover staging folder this run continues, if one matches; every other one is removed, with why."""
    chosen = None
    for staging in reversed(leftovers):  # the newest first
        old = load(staging)
        if chosen is None and old is not None and old.fingerprint == record.fingerprint:
            chosen = staging
            continue
        reason = "a newer one is resumed" if chosen else why_not(old, record)
        logger.warning("not resuming the interrupted run in %s (%s): starting afresh", staging, reason)
        filesystems.remove_folder(staging)
    return chosen


@dataclasses.dataclass(frozen=True)
class KeptWork:
    """A stopped or failed run's staging folder, kept for the same command to resume."""

    staging: str
    parts_done: int
    num_parts: int
    shards_done: int
    num_bytes: int
    age_s: float

    def describe(self) -> str:
        """What is kept, in a few words: "3 of 12 parts validated, 0 shards written; 45.2 MB"."""
        return (f"{self.parts_done} of {self.num_parts} parts validated, {self.shards_done} shard"
                f"{'' if self.shards_done == 1 else 's'} written; {human_bytes(self.num_bytes)}")

    def sentence(self) -> str:
        """The sentence a stopped run ends its line with."""
        return (f"Its finished work ({self.describe()}) is kept in {self.staging}: the same command resumes "
                "from it; deleting that folder discards it")


def kept_work(staging: str) -> Optional[KeptWork]:
    """What ``staging`` holds that a rerun would resume, or None when nothing is worth keeping.

    Worth keeping: a resume record and at least one validated part (a part's
    counts are written last, so a counted part is whole). A stop before that
    costs the rerun nothing, and leaves nothing behind.
    """
    record = load(staging)
    if record is None:
        return None
    work = publish.work_dir(staging)
    parts = _matches(FileSystems.join(work, staging_names.COUNTS_PATTERN))
    if not parts:
        return None
    shards = _matches(FileSystems.join(work, staging_names.SHARD_RESULTS_PATTERN))
    num_bytes, newest = _tree_size(staging)
    return KeptWork(staging, len(parts), max(1, math.ceil(record.num_listed / record.part_size)), len(shards),
                    num_bytes, max(0.0, time.time() - newest) if newest else 0.0)


def _matches(pattern: str) -> list:
    return FileSystems.match([pattern])[0].metadata_list


def _tree_size(folder: str) -> tuple[int, float]:
    """Bytes under ``folder`` and the newest modification time (seconds since the epoch; 0 if unknown)."""
    if filesystems.is_local(folder):
        total, newest = 0, 0.0
        for root, _, files in os.walk(folder):
            for name in files:
                try:
                    stat = os.stat(os.path.join(root, name))
                except OSError:
                    continue  # removed meanwhile
                total, newest = total + stat.st_size, max(newest, stat.st_mtime)
        return total, newest
    found = _matches(folder.rstrip("/") + "/**")
    return sum(m.size_in_bytes for m in found), max((m.last_updated_in_seconds or 0 for m in found), default=0.0)


def human_bytes(num: int) -> str:
    """1234567 -> "1.2 MB" (powers of 1000, as ``du --si`` and object stores' consoles count)."""
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if num < 1000 or unit == "TB":
            return f"{num} {unit}" if unit == "bytes" else f"{num:.1f} {unit}"
        num /= 1000
    raise AssertionError("unreachable")


def check_out(out: str, overwrite: bool) -> None:
    """:func:`publish.check_out`, whose refusal also names work a stopped run kept beside OUT (never forgotten)."""
    try:
        publish.check_out(out, overwrite)
    except publish.DatasetExistsError as err:
        kept = [work for work in map(kept_work, publish.leftover_stagings(out)) if work]
        if not kept:
            raise
        notes = "; ".join(f"a stopped run's finished work ({work.describe()}, {work.age_s / 3600:.1f} h old) is "
                          f"kept in {work.staging}: the same command with --overwrite resumes from it; deleting "
                          "that folder discards it" for work in kept)
        raise publish.DatasetExistsError(f"{err}. Also, {notes}") from None


def kept_on_stop(err: BaseException, staging: str) -> bool:
    """A stop signal keeps the run's finished work, as a SIGKILL would (spot VMs, Slurm and Kubernetes
    send SIGTERM first): True, and ``err`` says where, when there is any. A stop during the commit keeps
    nothing (the dataset was published, or the commit's own record finishes it)."""
    if not isinstance(err, interrupt.Interrupted) or err.published:
        return False
    try:
        kept = kept_work(staging)
    except (OSError, BeamIOError) as failed:  # cannot tell: keep it, the next run decides
        logger.warning("could not look into %s: %s", staging, failed)
        return True
    if kept:
        err.kept = kept.sentence()
    return kept is not None


def last_resort(staging: Optional[str], out: str, scratch: str) -> None:
    """The deadline's cleanup when unwinding hung: lock file and scratch go; finished work stays, and is named."""
    kept = kept_work(staging) if staging else None
    publish.abandon(None if kept else staging, out, scratch)
    if kept:
        interrupt.add_to_exit_message(kept.sentence())
