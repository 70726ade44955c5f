"""Stage 4: put one key bucket of one split in its final order and cut it at the shard boundaries.

In:  a :class:`beam_jobs.stages.count.BucketTask`, and bucket ``b`` of every part's
     ``runs/<split>-P`` (one seek per file), less the images ``--drop-leaks`` leaves out
     (bucket ``b`` of ``dropped/<split>``, :mod:`beam_jobs.stages.drop_leaks`).
Out: ``slices/<split>-S-b``: the bucket's records of shard S, in order (ACCEPTED
     records), then ``slices/<split>-b.done``; returns ``(shard, records)`` for each slice.
     Memory: one bucket's records (about a part's worth).

The order is the keyed hash of (seed, path), the path breaking ties: within a
bucket that is the sort of the records' raw bytes, and buckets are consecutive
hash ranges, so the split's order is the buckets' orders one after another.
"""

from __future__ import annotations

from beam_jobs import faults
from beam_jobs.files import filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.stages.count import BucketTask
from beam_jobs.stages.drop_leaks import dropped_keys
from beam_jobs.files.work_layout import WorkLayout


class BucketCountError(RuntimeError):
    """A bucket holds a different number of records than the counts said: a lost or stale work file."""


def order_bucket(layout: WorkLayout, task: BucketTask) -> list[tuple[int, int]]:
    """Sort bucket ``task.bucket`` of ``task.split`` and write its shard slices; return ``[(shard, count)]``.

    A bucket marked done (by a killed run this one resumes) is not redone.
    """
    done = layout.bucket_done(task.split, task.bucket)
    if FileSystems.exists(done):
        return [(shard, hi - lo) for shard, lo, hi in task.shard_slices()]
    records: list[bytes] = []
    for part in range(layout.num_parts):
        records += work_records.read_bucket(layout.run(task.split, part), work_records.ACCEPTED, task.bucket)
    dropped = dropped_keys(layout, task.split, task.bucket)
    if dropped:
        records = [record for record in records if work_records.accepted_prefix(record) not in dropped]
    if len(records) != task.count:
        raise BucketCountError(f"bucket {task.bucket} of split {task.split} holds {len(records)} records, "
                               f"the counts said {task.count}")
    records.sort()
    written = []
    for shard, lo, hi in task.shard_slices():
        work_records.write_file(layout.slice(task.split, shard, task.bucket), work_records.ACCEPTED, records[lo:hi])
        written.append((shard, hi - lo))
    filesystems.write_text(done, "")
    faults.point("bucket-ordered")
    return written
