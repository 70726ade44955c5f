"""Stage 1, in the launcher: cut the listed images into part files, and lay out the work folder.

In:  the listed images (``ImageRef``), in any order.
Out: ``parts/part-P`` files of ``part_size`` LISTED records each (see
     :mod:`beam_jobs.files.work_records`), and a :class:`WorkLayout` that every
     later stage uses to find its files. The pipeline's first PCollection is
     the part ids: ``ceil(N / part_size)`` small elements, whatever N is.

The layout also fixes the number of key buckets per split (the unit the
ordering stage sorts in memory, about ``part_size`` records each) and of
content-hash ranges (the unit the duplicate search holds). None of these
numbers changes the output's bytes: records are ordered by their keyed hash
and cut into shards by their global position, however they were grouped on
the way (``tests/converter/test_pinned_output.py`` pins it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Iterable, Mapping, Optional

from beam_jobs.files import work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.runtime import interrupt
from beam_jobs.stage_records import ImageRef
from record_files import staging as staging_names

# Parts of at most this many images: a part's records are sorted in one worker's memory (~200 B each).
MAX_PART_SIZE = 1 << 20
# At least this many per part: every part costs a few files in each stage.
MIN_PART_SIZE = 128
# Aim for this many parts, so small runs still spread over the workers.
TARGET_PARTS = 64


def choose_part_size(num_images: int, wanted: Optional[int] = None, unit: int = 0) -> int:
    """Images per part: ``wanted``, or about 1/64 of the images within [128, 2**20], and at least ``unit``.

    ``unit``: the rows a source reads as one (a Parquet row group): a part of
    at least that many rows reads each of them at most twice, where smaller
    parts would each read the whole row group for a few of its rows.
    """
    if wanted is not None:
        return wanted
    return max(MIN_PART_SIZE, min(MAX_PART_SIZE, math.ceil(num_images / TARGET_PARTS)), min(unit, MAX_PART_SIZE))


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


def write_parts(layout: WorkLayout, refs: Iterable[ImageRef], part_size: int) -> str:
    """Write ``refs`` into the layout's part files, ``part_size`` images each; return their SHA-256.

    Streams: one part's records are held at a time. The digest (of every
    record, length-prefixed, in order) is the listing's part of a run's
    fingerprint (:mod:`beam_jobs.planning.resume`), computed in the same pass.
    """
    digest = hashlib.sha256()
    for folder in layout.folders():
        if not FileSystems.exists(folder):
            FileSystems.mkdirs(folder)
    part, batch = 0, []
    for ref in refs:
        batch.append(work_records.encode_listed(ref))
        if len(batch) == part_size:
            interrupt.raise_if_received()  # a signal whose exception was lost (see interrupt.raise_if_received)
            _write_part(layout, part, batch, digest)
            part, batch = part + 1, []
    if batch:
        _write_part(layout, part, batch, digest)
    return digest.hexdigest()


def _write_part(layout: WorkLayout, part: int, records: list[bytes], digest) -> None:
    work_records.write_file(layout.part(part), work_records.LISTED, records)
    digest.update(b"".join(len(record).to_bytes(4, "big") + record for record in records))
