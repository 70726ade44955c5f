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
      near_bands: bands of the perceptual hash the near search compares by (``--near-distance`` + 1); 0 when
        the run takes no perceptual hashes.
      near_ranges: band ranges the near search is cut into (0 without one).
      kept_parts: files of the records an update keeps (``content/kept-K``, ``near/kept-K``: the searches read
        them beside the parts' own, :mod:`beam_jobs.update.kept_hashes`); 0 for a conversion.
    """

    work: str
    num_parts: int
    buckets: Mapping[str, int]
    hash_ranges: int
    near_bands: int = 0
    near_ranges: int = 0
    kept_parts: int = 0

    def __post_init__(self) -> None:
        if self.near_bands and self.near_ranges % self.near_bands:  # a range would straddle two bands
            raise ValueError(f"near_ranges ({self.near_ranges}) must be a multiple of near_bands ({self.near_bands})")

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

    def content_kept(self, kept: int) -> str:
        """CONTENT records of an update's kept records, one file a chunk of them (as a part's)."""
        return FileSystems.join(self.work, "content", f"kept-{kept:06d}")

    def content_inputs(self) -> list[str]:
        """Every file of CONTENT records the exact search reads: the parts', then the kept records'."""
        return [*map(self.content, range(self.num_parts)), *map(self.content_kept, range(self.kept_parts))]

    def rejected(self, part: int) -> str:
        return FileSystems.join(self.work, "rejected", f"part-{part:06d}.jsonl")

    def slice(self, split: str, shard: int, bucket: int) -> str:
        return FileSystems.join(self.work, "slices", f"{split}-{shard:06d}-{bucket:06d}")

    def duplicates(self, hash_range: int) -> str:
        return FileSystems.join(self.work, "duplicates", f"range-{hash_range:06d}.jsonl")

    def duplicates_dropped(self, hash_range: int) -> str:
        """The exact groups' images ``--drop-leaks`` leaves out, of one hash range (JSON)."""
        return FileSystems.join(self.work, "duplicates", f"range-{hash_range:06d}.dropped.json")

    def near(self, part: int) -> str:
        """A part's NEAR records: one per band of each image's perceptual hash."""
        return FileSystems.join(self.work, "near", f"part-{part:06d}")

    def near_kept(self, kept: int) -> str:
        """NEAR records of an update's kept records, one file a chunk of them (as a part's)."""
        return FileSystems.join(self.work, "near", f"kept-{kept:06d}")

    def near_inputs(self) -> list[str]:
        """Every file of NEAR records the near search reads: the parts', then the kept records'."""
        return [*map(self.near, range(self.num_parts)), *map(self.near_kept, range(self.kept_parts))]

    def near_pairs(self, near_range: int) -> str:
        return FileSystems.join(self.work, "near", f"pairs-{near_range:06d}.jsonl")

    def near_leaks(self, near_range: int) -> str:
        """The evaluation images of band range ``near_range`` with a direct near pair in an earlier split: each
        with its closest such partner (``--drop-leaks`` leaves them out; JSON lines)."""
        return FileSystems.join(self.work, "near", f"leaks-{near_range:06d}.jsonl")

    def near_values(self, near_range: int) -> str:
        """The band values too large for one task that range ``near_range``'s task spilled (JSON; none: no file)."""
        return FileSystems.join(self.work, "near", f"values-{near_range:06d}.json")

    def near_value(self, near_range: int, ordinal: int, name: str) -> str:
        """A file of spilled value ``ordinal`` of range ``near_range`` (:mod:`beam_jobs.stages.near_blocks`)."""
        return FileSystems.join(self.work, "near", f"value-{near_range:06d}-{ordinal:04d}.{name}")

    def near_groups(self) -> str:
        return FileSystems.join(self.work, "near", "groups.jsonl")

    def near_dropped(self) -> str:
        return FileSystems.join(self.work, "near", "dropped.json")

    def near_summary(self) -> str:
        """Written last by the near grouping: its summary (and the mark that its files are complete)."""
        return FileSystems.join(self.work, "near", "summary.json")

    def dropped(self, split: str) -> str:
        """DROPPED records of a split (``--drop-leaks``), bucketed as its runs."""
        return FileSystems.join(self.work, "dropped", f"{split}")

    def dropped_list(self) -> str:
        """Every image ``--drop-leaks`` left out with its partner and distance, as ``dropped.jsonl`` holds them."""
        return FileSystems.join(self.work, "dropped", "dropped.jsonl")

    def table_part(self, split: str, shard: int) -> str:
        """A shard's rows of its split's records table, written by the shard's writer before its result."""
        return FileSystems.join(self.work, "tables", f"{split}-{shard:06d}.parquet")

    def table_result(self, split: str) -> str:
        """Written last by a split's table join: the table's rows, size and SHA-256 (and the mark it is whole)."""
        return FileSystems.join(self.work, "tables", f"{split}.json")

    def folders(self) -> list[str]:
        return [FileSystems.join(self.work, name) for name in
                ("parts", "runs", "content", "rejected", "counts", "slices", "duplicates", "near", "dropped",
                 "tables")]


def plan_layout(work: str, split_sizes: Mapping[str, int], part_size: int, near_bands: int = 0,
                kept: int = 0, kept_chunk: int = 1) -> WorkLayout:
    """The layout of a run's work folder: a function of the split sizes, the part size and the near bands only
    (and, for an update, its ``kept`` records, searched in files of ``kept_chunk``: the searches' ranges are
    sized by every image they compare)."""
    total = sum(split_sizes.values())
    searched = total + kept
    # A hash range is held in memory: a part's records, or a kept file's when more (an update of a few images
    # over 1M kept records has small parts: ranges of a part each would be thousands of tiny tasks).
    per_range = max(part_size, kept_chunk) if kept else part_size
    return WorkLayout(
        work=work,
        num_parts=max(1, math.ceil(total / part_size)),
        buckets={split: max(1, math.ceil(n / part_size)) for split, n in split_sizes.items() if n},
        hash_ranges=max(1, math.ceil(searched / per_range)),
        near_bands=near_bands,
        near_ranges=near_ranges(searched, part_size, near_bands),
        kept_parts=math.ceil(kept / kept_chunk) if kept else 0,
    )


# Band records a near range holds at least (about 2.5 MB): fewer, larger tasks for a small run.
MIN_NEAR_RANGE = 16384
# A range's share of the work: the records of a part's budget (about 200 bytes an image, what the ordering
# stage holds of a part) at about 150 bytes a NEAR record (its CONTENT record with the thumbnail, and a path),
# 4/3 of a part's images. The task reads them a chunk at a time: its memory does not follow the range's size.
PART_BYTES_PER_IMAGE = 200
NEAR_RECORD_BYTES = 150


def near_ranges(total: int, part_size: int, bands: int) -> int:
    """Band ranges of the near search (a band record per band of each image): a whole number of ranges per band,
    so that no range straddles two bands (its task then holds each image once), each band's cut into ranges of
    about a part's images (``part_size * PART_BYTES_PER_IMAGE / NEAR_RECORD_BYTES`` records: a task's share of
    the work, which it reads a chunk at a time, :mod:`beam_jobs.stages.near_links`) and of no fewer than
    MIN_NEAR_RANGE records. Each task opens every part's file: with the part count at 64 from 8,192 images on
    (:func:`beam_jobs.stages.list_parts.choose_part_size`), that is 192 ranges of 64 reads, about 12,000 bucket
    reads at the default distance whatever N is; a small run has one range a band."""
    if not bands:
        return 0
    per_range = max(1, part_size * PART_BYTES_PER_IMAGE // NEAR_RECORD_BYTES)
    return bands * max(1, min(math.ceil(total / per_range), math.ceil(total / MIN_NEAR_RANGE)))
