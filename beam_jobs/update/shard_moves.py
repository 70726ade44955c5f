"""Which of the latest version's shards version N+1 reuses, masks, compacts or merges, and the copies made.

In:  the comparison's :class:`beam_jobs.planning.changes.Changes` (the shards reused whole; per shard that lost
     records, its survivors) and the latest version (its manifest and shards).
Out: in staging, ``compacted/``: the survivors of each shard that lost most of its records, or whose survivors
     are scattered, and the records of small shards merged, copied frame by frame (no image read); each split's
     shard entries but the new ones, and per shard whose records moved, where (:class:`Move`). Used by
     :mod:`beam_jobs.update.compose` (the manifest, the sources table) and :mod:`beam_jobs.update.tables`.

The rule (docs/update.md, "Masks instead of compaction" and "Merging small shards"): a shard that lost records is
masked while at least half its file's records survive in few runs, else compacted; small shards (an earlier
update's new ones, compacted survivors) are merged into shards of about the split's size once there are two.
"""

from __future__ import annotations

import hashlib
import os
from typing import NamedTuple, Optional

import numpy as np

import record_schema
from beam_jobs.files import publish, shard_copies, version_store
from beam_jobs.planning import changes as change_plan
from record_files import idx, versions

# Where a version's compacted shards are, in its folder: their names are the split's shard names anew.
COMPACTED = "compacted"
# A shard that lost records is masked (kept as it is, its survivors listed as runs: "live") when they are at
# least half its file's records and form at most this many runs; else compacted. Each run is an extent the
# training order plans like a shard (about 5 ms a stream an epoch at C streams): 64 keeps a masked file's cost
# within a few shards', and half keeps a version's bytes mostly its own records.
MAX_RUNS = 64


def mask(shard: dict, survivors) -> Optional[dict]:
    """``shard``'s entry masked to ``survivors`` (its records the version keeps, ascending, as indices in its
    file), or None when it should be compacted: fewer than half the file's records survive, or they form more
    than :data:`MAX_RUNS` runs. A shard an earlier version masked is judged against its file's records."""
    file_records = shard.get("file_records", shard["num_examples"])
    runs = versions.live_runs(survivors)
    if 2 * len(survivors) < file_records or len(runs) > MAX_RUNS:
        return None
    return dict(shard, num_examples=len(survivors), file_records=file_records, live=runs)


class Move(NamedTuple):
    """Where a shard's records went when its survivors were copied (compacted, or merged with other small shards):
    ``file`` (relative to OUT) holds them from its record ``base``, in the order of ``survivors`` (the shard's
    record indices the version keeps, ascending)."""

    file: str
    base: int
    survivors: np.ndarray

    def index_of(self, index):
        """The place in :attr:`file` of the old shard's record(s) ``index``."""
        return self.base + np.searchsorted(self.survivors, index)


def target_bytes(shards: list[dict]) -> float:
    """A split's shard size: the median file size of its shards that the conversion wrote (version 1's, at OUT's
    top), or of all its files (counted once) once none of those is left. Not all files: a split the conversion
    wrote as one shard, with two updates' small shards beside it, has a small median, so nothing was small and
    nothing merged; nor the largest: a big update's new shards would make every conversion shard "small"."""
    sizes = {shard["file"]: shard["num_bytes"] for shard in shards}
    converted = [size for file, size in sizes.items() if not file.startswith(f"{versions.VERSIONS_DIR}/")]
    chosen = converted or list(sizes.values())
    return float(np.median(chosen)) if chosen else 0.0


def live_bytes(shard: dict) -> float:
    """The bytes of a shard entry's records the version reads (a masked file's share of its bytes)."""
    return shard["num_bytes"] * shard["num_examples"] / shard.get("file_records", shard["num_examples"])


def live_indices(shard: dict) -> np.ndarray:
    """A reused shard entry's record indices the version reads: all, or its mask's runs."""
    runs = shard.get("live") or [[0, shard["num_examples"]]]
    return np.concatenate([np.arange(first, first + count, dtype=np.int64) for first, count in runs])


def compact(out: str, staging: str, found: change_plan.Changes, latest: version_store.Version,
             number: int) -> tuple[dict[str, list[dict]], dict[str, Move]]:
    """Each split's shards of the version but the new ones: reused, masked where :func:`mask` says so, and the
    survivors of the others copied record by record (the same bytes: no image read, none converted) into
    shards of their own in ``staging/compacted/``, after them.

    **Small shards are merged**: when a split has at least two *small* shards (the records the version reads
    from them under half :func:`target_bytes`: compacted survivors, an earlier update's new shards, a shard
    masked down), their records are copied together, in the latest version's shard order, into files of about
    the target size (a file is closed once it reaches it). Only small shards are rewritten, never a big reused
    one: the copy stays within about a shard's bytes a split an update, whatever N, and reading after many
    updates meets few tiny files.

    Returns each split's entries (masked ones carry ``live``; :func:`version_manifest` lists them where their
    files were) and, per shard whose records moved, its :class:`Move` (files relative to OUT).
    """
    entries: dict[str, list[dict]] = {}
    moved: dict[str, Move] = {}
    for split, entry in latest.manifest["splits"].items():
        target = target_bytes(entry["shards"])
        kept, pool = [], []  # pool: (shard, its indices to keep, must it be copied)
        for shard in entry["shards"]:
            if shard["file"] in found.reused:
                current, indices = shard, live_indices(shard)
            else:
                indices = found.survivors.get(shard["file"], np.zeros(0, np.int64))
                current = mask(shard, indices) if len(indices) else None
                if current is None:
                    if len(indices):
                        pool.append((shard, indices, True))  # compacted: copied whatever its size
                    continue
            kept.append(current)
            if live_bytes(current) < target / 2:
                pool.append((current, indices, False))
        groups = merge_groups(pool, target)
        merged = {shard["file"] for group in groups for shard, _ in group}
        entries[split] = [shard for shard in kept if shard["file"] not in merged] \
            + _merge(out, staging, split, number, groups, moved)
    return entries, moved


def merge_groups(pool: list[tuple[dict, np.ndarray, bool]], target: float) -> list[list[tuple[dict, np.ndarray]]]:
    """The files the copies write: ``pool``'s shards (entry, its record indices to keep, whether it must be
    copied: a compacted shard's survivors), in order, grouped until a group reaches ``target`` bytes.

    A small shard that would be copied alone stays where it is (merging needs a second; a copy of one file into
    one file buys nothing): the pool's only small shard, or one left alone at the end of the groups (review of
    5b76a56, F4); it is merged once another small shard comes."""
    groups: list[list[tuple[dict, np.ndarray, bool]]] = []
    size = target
    for shard, indices, must in pool:
        if size >= target:
            groups.append([])
            size = 0.0
        groups[-1].append((shard, indices, must))
        size += shard["num_bytes"] * len(indices) / shard.get("file_records", shard["num_examples"])
    groups = [group for group in groups if len(group) > 1 or group[0][2]]
    return [[(shard, indices) for shard, indices, _ in group] for group in groups]


def _merge(out: str, staging: str, split: str, number: int, groups: list[list[tuple[dict, np.ndarray]]],
           moved: dict[str, Move]) -> list[dict]:
    """The records of each group (:func:`merge_groups`: shard entries and their record indices to keep) copied,
    in order, into a new shard of ``staging/compacted/``; their entries. Each shard's :class:`Move` is put in
    ``moved``."""
    folder, made = versions.version_dir(number), []
    if groups:
        os.makedirs(os.path.join(staging, COMPACTED), exist_ok=True)
    for position, group in enumerate(groups):
        name = f"{COMPACTED}/{record_schema.shard_filename(split, position, len(groups))}"
        copied = _copy_group(out, staging, group, os.path.join(staging, name))
        base = 0
        for shard, indices in group:
            moved[shard["file"]] = Move(f"{folder}/{name}", base, np.asarray(indices, np.int64))
            base += len(indices)
        made.append({"file": f"{folder}/{name}", "num_examples": copied.num_examples, "num_bytes": copied.num_bytes,
                     "sha256": copied.sha256, "dali_index": f"{folder}/{name}.idx", "index_bytes": copied.index_bytes})
    return made


def _copy_group(out: str, staging: str, group: list[tuple[dict, np.ndarray]], target: str) -> shard_copies.CopiedShard:
    """The records of each shard of ``group`` copied (:func:`beam_jobs.files.shard_copies.copy_records`) one after
    the other into ``target``, with its record index: one shard (no second copy), else each into a part file
    in staging's work folder, appended (the parts are small shards' records: a second copy of little)."""
    if len(group) == 1:
        shard, indices = group[0]
        return shard_copies.copy_records(out, shard, indices.tolist(), target)
    digest, offset, frames = hashlib.sha256(), 0, []
    part = os.path.join(publish.work_dir(staging), "merging.part")
    os.makedirs(os.path.dirname(part), exist_ok=True)
    with open(target, "wb") as sink:
        for shard, indices in group:
            shard_copies.copy_records(out, shard, indices.tolist(), part)
            with open(part, "rb") as handle:
                data = handle.read()
            with open(idx.index_filename(part), "rb") as handle:
                frames += [(offset + int(start), int(length)) for start, length in
                           (line.split() for line in handle.read().split(b"\n") if line)]
            sink.write(data)
            digest.update(data)
            offset += len(data)
        sink.flush()
        os.fsync(sink.fileno())
    for name in (part, idx.index_filename(part)):
        os.remove(name)
    return shard_copies.CopiedShard(len(frames), offset, digest.hexdigest(), shard_copies.write_index(target, frames))
