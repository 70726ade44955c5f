"""Stage 3: add up the parts' counts; give each key bucket its global position and its shards.

In:  one :class:`PartCounts` per validated part (accepted records per split
     and key bucket, rejections per split and reason): O(buckets) integers each.
Out: :class:`Totals` (the same, summed: one small element) and, from it, one
     :class:`BucketTask` per non-empty bucket: the bucket's first global
     index in its split and the split's shard count.

This is how every record gets its global position without any worker holding
a split: a record's index is its bucket's first index plus its rank inside the
bucket (TFDS's earlier Beam writer, and Beam's ContextualTextIO, do the same).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Iterator, Mapping, Optional

import apache_beam as beam

from beam_jobs.planning.shard import RECORD_OVERHEAD, auto_shard_count, shard_starts, sized_count


@dataclasses.dataclass(frozen=True)
class PartCounts:
    """What one part (or, summed, the whole run) validated.

    Attributes:
      accepted: split -> accepted records per key bucket.
      rejected: split -> rejection reason -> count.
      stored_bytes: split -> bytes of the JPEGs its records hold.
      objects: split -> objects the accepted images' records hold (object datasets).
      rejected_objects: split -> rejection reason -> objects rejected from written images.
      assumed_frames: frame ("stored", "upright") -> ``[images, [their first paths, sorted, at most 3]]`` whose
        boxes were taken to be in that frame because the image's size could not tell (the run warns).
      objects_of_rejected: split -> objects listed for images that were rejected (a missing file...): not
        written, each image's line in ``rejected.jsonl`` says how many went with it.
    """

    accepted: Mapping[str, tuple[int, ...]]
    rejected: Mapping[str, Mapping[str, int]]
    stored_bytes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    objects: Mapping[str, int] = dataclasses.field(default_factory=dict)
    rejected_objects: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    assumed_frames: Mapping[str, list] = dataclasses.field(default_factory=dict)
    objects_of_rejected: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def plus(self, other: "PartCounts") -> "PartCounts":
        accepted = dict(self.accepted)
        for split, counts in other.accepted.items():
            mine = accepted.get(split, (0,) * len(counts))
            accepted[split] = tuple(a + b for a, b in zip(mine, counts))
        return PartCounts(accepted, _add_reasons(self.rejected, other.rejected),
                          _add(self.stored_bytes, other.stored_bytes), _add(self.objects, other.objects),
                          _add_reasons(self.rejected_objects, other.rejected_objects),
                          _add_examples(self.assumed_frames, other.assumed_frames),
                          _add(self.objects_of_rejected, other.objects_of_rejected))

    def accepted_per_split(self) -> dict[str, int]:
        return {split: sum(counts) for split, counts in self.accepted.items()}

    def rejected_by_reason(self) -> dict[str, int]:
        return _by_reason(self.rejected)

    def rejected_objects_by_reason(self) -> dict[str, int]:
        return _by_reason(self.rejected_objects)

    def num_rejected(self) -> int:
        return sum(self.rejected_by_reason().values())

    def to_json(self) -> str:
        return json.dumps({"accepted": {s: list(c) for s, c in self.accepted.items()}, "rejected": self.rejected,
                           "stored_bytes": self.stored_bytes, "objects": self.objects,
                           "rejected_objects": self.rejected_objects, "assumed_frames": self.assumed_frames,
                           "objects_of_rejected": self.objects_of_rejected},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PartCounts":
        raw = json.loads(text)
        return cls({s: tuple(c) for s, c in raw["accepted"].items()}, raw["rejected"], raw.get("stored_bytes", {}),
                   raw.get("objects", {}), raw.get("rejected_objects", {}), raw.get("assumed_frames", {}),
                   raw.get("objects_of_rejected", {}))

    def shard_counts(self, planned: Optional[Mapping[str, int]],
                     shard_bytes: Optional[Mapping[str, float]] = None) -> dict[str, int]:
        """Shards per split: ``planned`` (--shards N); or, when None, sized from the bytes: about
        ``shard_bytes[split]`` bytes a shard where given (an update's new shards: the split's shard size in
        the version, :func:`sized_count`), else TFDS's rule (:func:`auto_shard_count`); lowered to the split's
        accepted records, so no shard is empty."""
        counts = {}
        for split, records in self.accepted_per_split().items():
            if records:
                num_bytes = self.stored_bytes.get(split, 0) + RECORD_OVERHEAD * records
                if planned is not None:
                    wanted = planned[split]
                elif shard_bytes and shard_bytes.get(split):
                    wanted = sized_count(num_bytes, shard_bytes[split])
                else:
                    wanted = auto_shard_count(num_bytes, records)
                counts[split] = min(wanted, records)
        return counts


class SumCounts(beam.CombineFn):
    """Sums :class:`PartCounts`: the accumulator is one of them, O(buckets) integers."""

    def create_accumulator(self) -> PartCounts:
        return PartCounts({}, {})

    def add_input(self, accumulator: PartCounts, element: PartCounts) -> PartCounts:
        return accumulator.plus(element)

    def merge_accumulators(self, accumulators: Iterable[PartCounts]) -> PartCounts:
        total = PartCounts({}, {})
        for accumulator in accumulators:
            total = total.plus(accumulator)
        return total

    def extract_output(self, accumulator: PartCounts) -> PartCounts:
        return accumulator


@dataclasses.dataclass(frozen=True)
class BucketTask:
    """One key bucket of one split to put in order: where its records go in the split's shards."""

    split: str
    bucket: int
    first: int  # global index in the split of the bucket's first record
    count: int
    split_records: int
    num_shards: int

    def shard_slices(self) -> Iterator[tuple[int, int, int]]:
        """``(shard, lo, hi)``: records ``[lo, hi)`` of the sorted bucket belong to ``shard``."""
        starts = shard_starts(self.split_records, self.num_shards)
        end = self.first + self.count
        for shard in range(self.num_shards):
            lo, hi = max(starts[shard], self.first), min(starts[shard + 1], end)
            if lo < hi:
                yield shard, lo - self.first, hi - self.first


def bucket_tasks(totals: PartCounts, planned_shards: Optional[Mapping[str, int]],
                 shard_bytes: Optional[Mapping[str, float]] = None) -> Iterator[BucketTask]:
    """One task per non-empty bucket, with prefix sums as first indices.

    Shard counts per split: see :meth:`PartCounts.shard_counts` (``None``: ``--shards auto``).
    """
    shard_counts = totals.shard_counts(planned_shards, shard_bytes)
    for split in sorted(totals.accepted):
        counts = totals.accepted[split]
        records = sum(counts)
        if not records:
            continue
        num_shards = shard_counts[split]
        first = 0
        for bucket, count in enumerate(counts):
            if count:
                yield BucketTask(split, bucket, first, count, records, num_shards)
            first += count


def _add_examples(a: Mapping[str, list], b: Mapping[str, list]) -> dict[str, list]:
    """``{key: [count, first examples]}`` summed: counts added, the three smallest examples kept (any order of
    parts gives the same)."""
    total = {key: list(value) for key, value in a.items()}
    for key, (count, examples) in b.items():
        mine = total.get(key, [0, []])
        total[key] = [mine[0] + count, sorted(set(mine[1]) | set(examples))[:3]]
    return total


def _add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    total = dict(a)
    for key, count in b.items():
        total[key] = total.get(key, 0) + count
    return total


def _add_reasons(a: Mapping[str, Mapping[str, int]], b: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Two ``split -> reason -> count`` tables added."""
    return {split: _add(a.get(split, {}), b.get(split, {})) for split in sorted(set(a) | set(b))}


def _by_reason(table: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """A ``split -> reason -> count`` table summed over the splits, reasons sorted."""
    totals: dict[str, int] = {}
    for reasons in table.values():
        totals = _add(totals, reasons)
    return dict(sorted(totals.items()))


def without(totals: PartCounts, dropped: PartCounts) -> PartCounts:
    """``totals`` less the images ``--drop-leaks`` leaves out (their buckets' counts, bytes and objects)."""
    accepted = {split: tuple(a - b for a, b in zip(counts, dropped.accepted.get(split, (0,) * len(counts))))
                for split, counts in totals.accepted.items()}
    return dataclasses.replace(
        totals, accepted=accepted,
        stored_bytes={s: n - dropped.stored_bytes.get(s, 0) for s, n in totals.stored_bytes.items()},
        objects={s: n - dropped.objects.get(s, 0) for s, n in totals.objects.items()})
