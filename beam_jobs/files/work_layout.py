"""The run's work folder: where each stage's files live, and how keys are bucketed.

In:  the work folder (inside staging), the split sizes and the part size.
Out: :class:`WorkLayout`, the paths every stage writes and reads (parts, sorted runs, content hashes,
     rejections, counts, shard slices, duplicates). One module, as each on-disk format has one: stage 1
     lays the folder out, and every later stage finds its files through it.

The layout fixes the number of key buckets per split (the unit the ordering
stage sorts in memory, about ``part_size`` records each) and of content-hash
ranges (the unit the duplicate search holds). None of these numbers changes
the output's bytes (``tests/converter/test_pinned_output.py`` pins it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from beam_jobs.files.filesystems import FileSystems
from record_files import staging as staging_names


@dataclasses.dataclass(frozen=True)
class WorkLayout:
    """Where each stage's files live in the run's work folder, and how keys are bucketed.

    Attributes:
      work: the run's work folder (inside staging).
      num_parts: part files ``0..num_parts-1``.
      buckets: key buckets per split (only splits with listed images).
      hash_ranges: content-hash ranges the duplicate search is cut into.
    """

    work: str
    num_parts: int
    buckets: Mapping[str, int]
    hash_ranges: int

    def part_counts(self, part: int) -> str:
        """Written last by a validated part: its counts (and the mark that its files are complete)."""
        return FileSystems.join(self.work, staging_names.part_counts_name(part))

    def bucket_done(self, split: str, bucket: int) -> str:
        """Written once every slice of a bucket is."""
        return FileSystems.join(self.work, "slices", f"{split}-{bucket:06d}.done")

    def duplicates_summary(self, hash_range: int) -> str:
        return FileSystems.join(self.work, "duplicates", f"range-{hash_range:06d}.json")

    def part(self, part: int) -> str:
        return FileSystems.join(self.work, "parts", f"part-{part:06d}")

    def run(self, split: str, part: int) -> str:
        return FileSystems.join(self.work, "runs", f"{split}-{part:06d}")

    def content(self, part: int) -> str:
        return FileSystems.join(self.work, "content", f"part-{part:06d}")

    def rejected(self, part: int) -> str:
        return FileSystems.join(self.work, "rejected", f"part-{part:06d}.jsonl")

    def slice(self, split: str, shard: int, bucket: int) -> str:
        return FileSystems.join(self.work, "slices", f"{split}-{shard:06d}-{bucket:06d}")

    def duplicates(self, hash_range: int) -> str:
        return FileSystems.join(self.work, "duplicates", f"range-{hash_range:06d}.jsonl")

    def folders(self) -> list[str]:
        return [FileSystems.join(self.work, name) for name in
                ("parts", "runs", "content", "rejected", "counts", "slices", "duplicates")]


def plan_layout(work: str, split_sizes: Mapping[str, int], part_size: int) -> WorkLayout:
    """The layout of a run's work folder: a function of the split sizes and the part size only."""
    total = sum(split_sizes.values())
    return WorkLayout(
        work=work,
        num_parts=max(1, math.ceil(total / part_size)),
        buckets={split: max(1, math.ceil(n / part_size)) for split, n in split_sizes.items() if n},
        hash_ranges=max(1, math.ceil(total / part_size)),
    )
