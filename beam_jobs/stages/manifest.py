"""Build the manifest and the run summary from what the pipeline wrote.

The manifest is the dataset's table of contents and its commit marker:
readers take the shard list from it (never from a glob), so stale or partial
files can never be mixed into a run.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
from typing import Mapping, Optional, Sequence

import record_schema
from beam_jobs.files import filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ConvertOptions
from beam_jobs.planning.discover import InputPlan
from beam_jobs.stages.count import PartCounts
from beam_jobs.stages.write import ShardResult

TOOL = "imgshards"


class ShardAccountingError(RuntimeError):
    """The shards the pipeline wrote do not add up to the plan: a runner bug, never published."""


def check_results(results: Sequence[ShardResult], expected_per_split: Mapping[str, int]) -> None:
    """Every split has shards 0..n-1 exactly once, and they hold every accepted image."""
    by_split: dict[str, list[ShardResult]] = collections.defaultdict(list)
    for result in results:
        by_split[result.split].append(result)
    for split, expected in expected_per_split.items():
        shards = sorted(by_split.get(split, []), key=lambda r: r.index)
        if expected == 0:
            continue
        indices = [r.index for r in shards]
        if not shards or indices != list(range(shards[0].num_shards)):
            raise ShardAccountingError(f"split {split}: shards {indices} were written, expected a complete set")
        written = sum(r.num_examples for r in shards)
        if written != expected:
            raise ShardAccountingError(f"split {split}: {written} records written, {expected} accepted")


def build_manifest(
    plan: InputPlan,
    results: Sequence[ShardResult],
    rejected_by_reason: Mapping[str, int],
    options: ConvertOptions,
    duplicates: Optional[dict] = None,
    runner: str = "",
    counts: Optional[PartCounts] = None,
    tables: Optional[Mapping[str, dict]] = None,
    skipped_list: Optional[Mapping[str, object]] = None,
) -> dict:
    """The manifest.json content (see the README's "Output" section).

    ``runner`` names the Beam runner that wrote the shards; it is recorded with
    Beam's version, so a dataset says what produced it. ``counts``: the run's, whose object counts an
    object dataset's manifest holds. ``tables``: each split's records table (file, rows, bytes, SHA-256).
    ``skipped_list``: :func:`publish_skipped`'s entry (``skipped.jsonl``'s name, lines and SHA-256).
    """
    objects = plan.task in (record_schema.TASK_OBJECTS, record_schema.TASK_SEGMENTATION)
    splits = {}
    for split in record_schema.SPLITS:
        shards = sorted((r for r in results if r.split == split), key=lambda r: r.index)
        if not shards:
            continue
        label_counts = [0] * len(plan.classes)
        reencoded: collections.Counter[str] = collections.Counter()
        for shard in shards:
            for label, count in shard.label_counts.items():
                label_counts[label] += count
            reencoded.update(shard.reencoded)
        splits[split] = {
            "num_examples": sum(s.num_examples for s in shards),
            # An object dataset's label_counts count objects by class id; num_objects, all of them.
            **({"num_objects": sum(label_counts)} if objects else {}),
            "num_bytes": sum(s.num_bytes for s in shards),
            "num_shards": len(shards),
            "label_counts": label_counts,
            "num_reencoded": sum(reencoded.values()),
            "reencoded_by_reason": dict(sorted(reencoded.items())),
            "max_side": max(s.max_side for s in shards),
            "num_grayscale": sum(s.grayscale for s in shards),
            "num_small": sum(s.small for s in shards),
            "shards": [
                {"file": s.file, "num_examples": s.num_examples, "num_bytes": s.num_bytes, "sha256": s.sha256,
                 **({"dali_index": s.dali_index, "index_bytes": s.index_bytes} if s.dali_index else {})}
                for s in shards
            ],
            **({"records_table": dict((tables or {})[split])} if split in (tables or {}) else {}),
        }
    return {
        "format_version": record_schema.FORMAT_VERSION,
        "tool": TOOL,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "classes": list(plan.classes),
        "class_text": list(plan.class_text or plan.classes),
        "num_classes": len(plan.classes),
        "task": plan.task,
        "features": dict(record_schema.OBJECT_FEATURES if objects else record_schema.MULTILABEL_FEATURES
                         if plan.task == record_schema.TASK_MULTILABEL else record_schema.FEATURES,
                         **plan.extra_features),
        "splits": splits,
        "num_listed": len(plan.refs),
        "num_rejected": sum(rejected_by_reason.values()),
        "rejected_by_reason": dict(sorted(rejected_by_reason.items())),
        # Objects refused from the images written (an empty box, an unknown class...), each in rejected.jsonl.
        **({"num_rejected_objects": sum(counts.rejected_objects_by_reason().values()) if counts else 0,
            "rejected_objects_by_reason": counts.rejected_objects_by_reason() if counts else {},
            # Objects listed for images that were rejected (a missing file...): not written, not "rejected objects".
            "num_objects_of_rejected_images": sum(counts.objects_of_rejected.values()) if counts else 0,
            "label_map": record_schema.LABEL_MAP_FILE} if objects else {}),
        # COCO's keypoints: K points an object, their names and the flip their names give (the reader's
        # ObjectTargets(keypoints="auto") takes K from here; reader.dataset_info(...).keypoint_names, ...).
        **({"keypoints": dict(plan.keypoints)} if plan.keypoints else {}),
        # Objects: id 0 is the background; record id = the source's class id + this (1 for YOLO's and the Hub's
        # 0-based indexes, 0 for COCO's and VOC's ids).
        **({"class_id_offset": plan.class_id_offset} if plan.task == record_schema.TASK_OBJECTS else {}),
        "num_skipped": sum(plan.skipped.values()),
        "skipped_by_reason": dict(plan.skipped),
        # The first few files skipped for each reason (the run's summary names them); each one in skipped_file.
        "skipped_examples": dict(sorted(plan.skipped_files.examples.items())) if plan.skipped_files else {},
        **(dict(skipped_list) if skipped_list else {}),
        "duplicates": duplicates or _no_duplicates(),
        "options": options.to_json(),
        # The licence an export's README states, put in the card when the user gave none (`card OUT` keeps it).
        **({"stated_license": {"license": plan.stated_license[0], "file": plan.stated_license[1]}}
           if plan.stated_license else {}),
        "written_by": {"runner": runner, "apache_beam": _beam_version()},
        # Where the images came from: a source's own record of its files (a Hugging Face dataset's Parquet files
        # and Hub revision: "source_parquet"), or, when SRC holds archives, each one (not inside another), its size
        # and modification time; records name images by their path in the extraction, as a folder's would be.
        **(dict(plan.provenance) if plan.provenance else
           {"source_archives": dict(plan.archives)} if plan.archives else {}),
    }


def publish_skipped(plan: InputPlan, staging: str) -> dict:
    """``skipped.jsonl`` into staging: each file the plan names as skipped (empty where its source names none),
    and the manifest's ``skipped_file``, ``num_skipped_listed`` (its lines) and ``skipped_sha256``."""
    digest, lines = hashlib.sha256(), 0
    with filesystems.whole_file(FileSystems.join(staging, record_schema.SKIPPED_FILE)) as out:
        for line in (plan.skipped_files.lines() if plan.skipped_files is not None else ()):
            data = line.encode("utf-8") + b"\n"
            digest.update(data)
            out.write(data)
            lines += 1
    return {"skipped_file": record_schema.SKIPPED_FILE, "num_skipped_listed": lines,
            "skipped_sha256": digest.hexdigest()}


def _no_duplicates() -> dict:
    return {"num_groups": 0, "num_duplicate_images": 0, "num_cross_label": 0, "num_cross_split": 0,
            "cross_label": [], "cross_split": [], "file": record_schema.DUPLICATES_FILE,
            "near_threshold": None, "num_near_groups": 0, "num_near_images": 0, "num_near_within_split": 0,
            "num_near_cross_split": 0, "near_cross_split": [], "num_dropped": 0, "dropped_file": None,
            "dropped_sha256": None}


def _beam_version() -> str:
    import apache_beam

    return apache_beam.__version__


@dataclasses.dataclass(frozen=True)
class ConvertSummary:
    """What a conversion did, for the CLI's closing summary and for callers."""

    out: str
    written: Mapping[str, int]
    shards: Mapping[str, int]
    num_bytes: int
    reencoded: int
    rejected: int
    skipped: int
    elapsed_s: float
    cross_label_duplicates: int = 0
    cross_split_duplicates: int = 0
    small: int = 0
    processed: Optional[int] = None  # images this run processed, when it resumed a stopped run's work
    kept: Optional[int] = None  # and the images the stopped run had validated
    objects: Optional[int] = None  # an object dataset's objects written (None: a classification dataset)
    rejected_objects: int = 0
    dropped: int = 0  # evaluation images --drop-leaks left out
    skipped_by_reason: Mapping[str, int] = dataclasses.field(default_factory=dict)
    skipped_examples: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    objects_with_rejected: int = 0  # objects that went with their rejected image (a missing file...)
    skipped_listed: int = 0  # the skipped files skipped.jsonl names

    @classmethod
    def from_manifest(cls, out: str, manifest: dict, elapsed_s: float,
                      processed: Optional[int] = None, kept: Optional[int] = None) -> "ConvertSummary":
        splits = manifest["splits"]
        return cls(
            out=out,
            written={name: s["num_examples"] for name, s in splits.items()},
            shards={name: s["num_shards"] for name, s in splits.items()},
            num_bytes=sum(s["num_bytes"] for s in splits.values()),
            reencoded=sum(s["num_reencoded"] for s in splits.values()),
            rejected=manifest["num_rejected"],
            skipped=manifest["num_skipped"],
            elapsed_s=elapsed_s,
            cross_label_duplicates=manifest["duplicates"]["num_cross_label"],
            cross_split_duplicates=manifest["duplicates"]["num_cross_split"],
            small=sum(s.get("num_small", 0) for s in splits.values()),
            processed=processed,
            kept=kept,
            objects=sum(s["num_objects"] for s in splits.values()) if manifest.get("task") == record_schema.TASK_OBJECTS else None,
            rejected_objects=manifest.get("num_rejected_objects", 0),
            dropped=manifest["duplicates"].get("num_dropped", 0),
            skipped_by_reason=manifest.get("skipped_by_reason", {}),
            skipped_examples=manifest.get("skipped_examples", {}),
            objects_with_rejected=manifest.get("num_objects_of_rejected_images", 0),
            skipped_listed=manifest.get("num_skipped_listed", 0),
        )

    @property
    def images_per_second(self) -> float:
        done = sum(self.written.values()) if self.processed is None else self.processed
        return done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def format(self) -> str:
        """A few human lines."""
        per_split = ", ".join(f"{name} {count} ({_count(self.shards[name], 'shard')})"
                              for name, count in self.written.items())
        warnings = []  # worded and prefixed as the CLI's logged warnings are
        if self.cross_label_duplicates or self.cross_split_duplicates:
            warnings.append(
                f"warning: identical images under two labels: {_count(self.cross_label_duplicates, 'group')}; "
                f"in two splits: {_count(self.cross_split_duplicates, 'group')} (python -m converter inspect "
                f"{self.out})"
            )
        if self.small:
            warnings.append(
                f"warning: {_count(self.small, 'image')} with a side under {record_schema.SMALL_SIDE} px (some "
                f"training code fails on them); --min-side {record_schema.SMALL_SIDE} rejects them"
            )
        return "\n".join(
            warnings + [
                f"published {self.out}",
                f"  written:    {per_split}",
                f"  re-encoded: {self.reencoded}   rejected: {self.rejected}   skipped: {self.skipped}",
                *self._skipped_lines(),
                *([f"  objects:    {self.objects} written, {self.rejected_objects} rejected"
                   + (f", {self.objects_with_rejected} with their rejected images" if self.objects_with_rejected
                      else "")]
                  if self.objects is not None else []),
                *([f"  dropped:    {_count(self.dropped, 'evaluation image')} copying an earlier split's "
                   f"(--drop-leaks; each with its partner in {record_schema.DROPPED_FILE})"] if self.dropped else []),
                f"  bytes:      {self.num_bytes:,}",
                f"  elapsed:    {self.elapsed_s:.1f} s   ({self.images_per_second:.1f} images/s"
                + (f", {self.processed} processed by this run; the stopped run it resumed had validated {self.kept})"
                   if self.processed is not None
                   else ")"),
            ]
        )


    def _skipped_lines(self) -> list[str]:
        """The files skipped, by reason, the first few of each named: ``skipped.jsonl`` holds every one."""
        if not self.skipped:
            return []
        lines = []
        for reason, count in sorted(self.skipped_by_reason.items(), key=lambda kv: (-kv[1], kv[0])):
            examples = list(self.skipped_examples.get(reason, ()))
            named = f": {', '.join(examples)}{' ...' if count > len(examples) else ''}" if examples else ""
            lines.append(f"              {reason} {count}{named}")
        named = ("each named in " if self.skipped_listed >= self.skipped else
                 f"{self.skipped_listed} of them named in " if self.skipped_listed else "counted by reason; none named in ")
        return [f"  skipped:    {_count(self.skipped, 'file')} not converted ({named}{record_schema.SKIPPED_FILE}):"] \
            + lines


def _count(number: int, noun: str) -> str:
    """``1 shard``, ``2 shards``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"
