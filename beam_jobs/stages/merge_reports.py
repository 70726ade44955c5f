"""Stage 6: merge the parts' reports: the rejection report, and the search for identical images.

Rejections.
  In:  ``rejected/part-P.jsonl`` of every part, each sorted.
  Out: ``rejected.jsonl`` in staging: a streaming k-way merge (the lines sorted
       as a whole, so reruns give the same file). Memory: a line per open file.

Duplicates (one task per content-hash range, as datatrove's exact dedup).
  In:  range ``r`` of every part's ``content/part-P`` (sorted by SHA-256).
  Out: ``duplicates/range-r.jsonl``: one line per group of identical images
       (``{"kind": "exact", "images": [{"split", "label", "path"}, ...]}``, the images sorted, the lines
       sorted), ``range-r.dropped.json`` (the images of evaluation splits ``--drop-leaks`` leaves out), and a
       :class:`DuplicateSummary`: the counts and the first few groups that
       carry two labels or sit in two splits, also saved as ``range-r.json``.
       Memory: one range's records.
  The summaries add up (:class:`SumDuplicates`) into the manifest's
  ``duplicates``; the range files and the near search's groups
  (:mod:`beam_jobs.stages.near_duplicates`) are merged into ``duplicates.jsonl``, its lines sorted.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from typing import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes

from beam_jobs import faults
from beam_jobs.files import filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.planning.discover import display_path
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.stages.near_duplicates import Member
from beam_jobs.stages.near_groups import leaked

# Files merged at once; more are merged in rounds (each open file holds a buffer and a descriptor).
MAX_FAN_IN = 128
# Groups listed in the manifest per kind; every group is in duplicates.jsonl.
MAX_LISTED_DUPLICATES = 20


def _lines(path: str) -> Iterator[str]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for raw in handle:
            yield raw.decode("utf-8")


def _merge_into(paths: Sequence[str], out: str) -> None:
    with filesystems.whole_file(out) as handle:
        for line in heapq.merge(*(_lines(path) for path in paths)):
            handle.write(line.encode("utf-8"))


def merge_sorted_lines(paths: Sequence[str], out: str, scratch: str) -> None:
    """Merge files of sorted lines into ``out``, sorted, opening at most MAX_FAN_IN files at once."""
    paths = list(paths)
    round_ = 0
    while len(paths) > MAX_FAN_IN:
        merged = []
        for start in range(0, len(paths), MAX_FAN_IN):
            target = FileSystems.join(scratch, f"merge-{round_}-{start // MAX_FAN_IN:06d}.jsonl")
            _merge_into(paths[start:start + MAX_FAN_IN], target)
            merged.append(target)
        paths, round_ = merged, round_ + 1
    _merge_into(paths, out)


def merge_rejections(layout: WorkLayout, out: str) -> None:
    """Every part's rejections, merged into the report at ``out``."""
    merge_sorted_lines([layout.rejected(part) for part in range(layout.num_parts)], out,
                       FileSystems.join(layout.work, "rejected"))


@dataclasses.dataclass(frozen=True)
class DuplicateSummary:
    """Counts of identical images, with the first groups of each kind (groups sorted by their members)."""

    num_groups: int = 0
    num_duplicate_images: int = 0
    num_cross_label: int = 0
    num_cross_split: int = 0
    cross_label: tuple = ()
    cross_split: tuple = ()

    def plus(self, other: "DuplicateSummary") -> "DuplicateSummary":
        return DuplicateSummary(
            self.num_groups + other.num_groups,
            self.num_duplicate_images + other.num_duplicate_images,
            self.num_cross_label + other.num_cross_label,
            self.num_cross_split + other.num_cross_split,
            tuple(heapq.nsmallest(MAX_LISTED_DUPLICATES, self.cross_label + other.cross_label)),
            tuple(heapq.nsmallest(MAX_LISTED_DUPLICATES, self.cross_split + other.cross_split)),
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DuplicateSummary":
        raw = json.loads(text)
        for key in ("cross_label", "cross_split"):
            raw[key] = tuple(tuple(tuple(member) for member in group) for group in raw[key])
        return cls(**raw)

    def to_manifest(self, classes: Sequence[str], file: str) -> dict:
        """The manifest's ``duplicates``: counts, the first groups by path, and the file listing them all."""
        def named(group):
            return [{"split": split, "label": classes[label], "path": path} for split, label, path in group]

        return {
            "num_groups": self.num_groups,
            "num_duplicate_images": self.num_duplicate_images,
            "num_cross_label": self.num_cross_label,
            "num_cross_split": self.num_cross_split,
            "cross_label": [named(g) for g in self.cross_label],
            "cross_split": [named(g) for g in self.cross_split],
            "file": file,
        }


class SumDuplicates(beam.CombineFn):
    def create_accumulator(self) -> DuplicateSummary:
        return DuplicateSummary()

    def add_input(self, accumulator: DuplicateSummary, element: DuplicateSummary) -> DuplicateSummary:
        return accumulator.plus(element)

    def merge_accumulators(self, accumulators: Iterable[DuplicateSummary]) -> DuplicateSummary:
        total = DuplicateSummary()
        for accumulator in accumulators:
            total = total.plus(accumulator)
        return total

    def extract_output(self, accumulator: DuplicateSummary) -> DuplicateSummary:
        return accumulator


def find_duplicates(layout: WorkLayout, hash_range: int, classes: Sequence[str]) -> DuplicateSummary:
    """Groups of identical images whose SHA-256 falls in ``hash_range``: written to a file, summarized.

    A range whose summary exists (a killed run this one resumes) is not searched again.
    """
    done = layout.duplicates_summary(hash_range)
    if FileSystems.exists(done):
        return DuplicateSummary.from_json(filesystems.read_text(done))
    records: list[bytes] = []
    for path in layout.content_inputs():  # an update's kept records' files too
        records += work_records.read_bucket(path, work_records.CONTENT, hash_range)
    records.sort()
    groups, members, previous, dropped, kept = [], [], None, [], set()
    for record in records + [None]:
        item = work_records.decode_content(record) if record is not None else None
        if (item is None or item.sha != previous) and len(members) > 1 and len(kept) < len(members):
            # (a group of kept records alone is the version's that converted them)
            groups.append(tuple(sorted((split, label, display_path(relpath)) for split, label, relpath, *_ in members)))
            if len({member.split for member in members}) > 1:
                dropped += leaked(members, kept)  # a kept record is never dropped: a new copy of another split is
        if item is None:
            break
        if item.sha != previous:
            members, previous, kept = [], item.sha, set()
        members.append(Member.of(item))
        if item.kept:
            kept.add(item.relpath)
    groups.sort()
    cross_label = [g for g in groups if len({label for _, label, _ in g}) > 1]
    cross_split = [g for g in groups if len({split for split, _, _ in g}) > 1]
    lines = sorted(json.dumps(exact_line(group, classes), ensure_ascii=False) for group in groups)
    with filesystems.whole_file(layout.duplicates(hash_range)) as handle:
        handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
    filesystems.write_text(layout.duplicates_dropped(hash_range), json.dumps(sorted(dropped)))
    summary = DuplicateSummary(len(groups), sum(len(g) - 1 for g in groups), len(cross_label), len(cross_split),
                               tuple(cross_label[:MAX_LISTED_DUPLICATES]), tuple(cross_split[:MAX_LISTED_DUPLICATES]))
    filesystems.write_text(done, summary.to_json())
    faults.point("duplicates-found")
    return summary


def exact_line(group: Sequence[tuple], classes: Sequence[str]) -> dict:
    """A group of identical images as ``duplicates.jsonl`` holds it."""
    return {"kind": "exact",
            "images": [{"split": split, "label": classes[label], "path": path} for split, label, path in group]}


def join_duplicates(layout: WorkLayout, out: str) -> None:
    """Every range's exact groups and the near search's groups (when it ran) merged into ``out``, lines sorted."""
    paths = [layout.duplicates(hash_range) for hash_range in range(layout.hash_ranges)]
    if layout.near_bands:
        paths.append(layout.near_groups())
    merge_sorted_lines(paths, out, FileSystems.join(layout.work, "duplicates"))
