"""The conversion's Beam transforms: the one place that wires the stages together.

Data flow (PCollection elements in comments; per-image records move through files
in the work folder, never through a shuffle, see :mod:`beam_jobs.files.work_records`)::

    part ids                         N / part_size ints           (stage 1, list_parts, in the launcher)
      | ValidateParts                PartCounts per part          (stage 2, validate_part: runs, content, near,
      |                                                            rejected files)
      | CountBuckets                 one PartCounts, summed       (stage 3, count)
      |-> MergeRejections            rejected.jsonl in staging    (stage 6, merge_reports)
    part ids again, with CountBuckets as a side input (so after it), each dealing its share of:
      |-> ListSearches, SpreadSearches, FindDuplicates   per content-hash range a DuplicateSummary (stage 6,
      |     |                        merge_reports), per band range the near links (stage 6, near_links) and
      |     |                        the band values too large for one task, spilled (BigValue list)
      |     |-> ListValues           the BigValues, read as one list; part ids again, with it as a side input:
      |     |     ListBlocks, SpreadBlocks, SearchBlocks   (BigValue, block) tasks: their links and leaks
      |     |     (stage 6, near_blocks): a list of ints (links), which GroupNear waits for
      |     | SumDuplicates, GroupNear   (DuplicateSummary, NearSummary): the exact and the near groups (near_groups)
      |     | WriteDuplicates        duplicates.jsonl in staging, the summary in the work folder
      |   (--drop-leaks) CollectDrops, DropLeaks   the counts less the dropped images (drop_leaks): the
      |                              buckets and shards below then wait for the duplicate searches
      |-> WriteCounts                counts.json in the work folder, for the launcher
    part ids again, with the counts as a side input, each dealing its share of:
      |-> ListBuckets, SpreadBuckets BucketTask per key bucket
            | OrderBuckets           ((split, shard, n), (bucket, records))  (stage 4, order_bucket: slice files)
            | GroupSlices            ((split, shard, n), [(bucket, records)])  a few per shard
            | WriteShards            ShardResult JSON             (stage 5, write: the shard file in staging, its rows)
            | KeyBySplit, GroupShards, JoinTables   per split its records table in staging (join_tables)

Spread*: a Reshuffle, only when the run has worker processes to spread the tasks over (a run in the
launcher's one process has none: there it would only cost pipeline set-up, about 0.1 s of CPU each).
A global sum (CountBuckets, SumDuplicates) has no default: its input is never empty (a part and a hash
range at least), and a list a branch waits for is read as a side input list, not counted or gathered by a
combine of its own (each costs about 0.2 s of CPU to build and run, whatever the run's size).

Every PCollection holds at most N / part_size + buckets + shards small
elements, so no runner holds per-image data in one process (Beam's local
runners and Dask keep every grouped element in memory), and no element grows
with N past the bucket counts. Image bytes are read only by the shard writer
(the source file, or the bytes a re-encoded image was spilled to during
validation). Shard writing is a plain DoFn after a GroupByKey, which every
Beam runner supports (no reliance on a sink's finalisation step).
"""

from __future__ import annotations

import json
from typing import Iterable, Iterator, Mapping, Optional, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

import record_schema
from beam_jobs import faults
from beam_jobs.files import filesystems, publish, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.runtime.progress import ProgressWriter
from beam_jobs.stages import drop_leaks, join_tables, merge_reports, near_blocks, near_groups, near_links
from beam_jobs.stages.count import BucketTask, PartCounts, SumCounts, bucket_tasks, without
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.stages.order_bucket import order_bucket
from beam_jobs.stages.validate_part import validate_part
from beam_jobs.stages.write import ShardResult, ShardRows, write_shard
from record_files import staging as staging_names

NAMESPACE = "converter"
COUNTS_FILE = "counts.json"
DUPLICATES_SUMMARY_FILE = "duplicates-summary.json"


class ValidatePartFn(beam.DoFn):
    """A part id -> its :class:`PartCounts`; writes the part's runs, content hashes and rejections."""

    def __init__(self, src: str, layout: WorkLayout, seed: int, encode: EncodeOptions) -> None:
        self._src, self._layout, self._seed, self._encode = src, layout, seed, encode

    def setup(self) -> None:
        self._accepted = Metrics.counter(NAMESPACE, "images_accepted")
        self._rejected = Metrics.counter(NAMESPACE, "images_rejected")

    def start_bundle(self) -> None:
        self._progress = ProgressWriter(self._layout.work, "validate")

    def process(self, part: int) -> Iterator[PartCounts]:
        counts = validate_part(self._src, self._layout, part, self._seed, self._encode, on_image=self._progress.add)
        self._accepted.inc(sum(counts.accepted_per_split().values()))
        self._rejected.inc(counts.num_rejected())
        yield counts

    def finish_bundle(self) -> None:
        self._progress.flush()


def deal_buckets(part: int, totals: PartCounts, planned: Optional[Mapping[str, int]],
                 num_parts: int, shard_bytes: Optional[Mapping[str, float]] = None) -> Iterator[BucketTask]:
    """Part ``part``'s share of the bucket tasks: every ``num_parts``-th, so each part id deals a few."""
    for index, task in enumerate(bucket_tasks(totals, planned, shard_bytes)):
        if index % num_parts == part:
            yield task


def deal_searches(part: int, totals: PartCounts, layout: WorkLayout) -> Iterator[tuple[str, int]]:
    """Part ``part``'s share of the searches' tasks: ``("exact", content-hash range)`` and ``("near", band
    range)`` (``totals`` only orders this after validation). One list, so one shuffle spreads both."""
    del totals
    yield from (("exact", r) for r in range(part, layout.hash_ranges, layout.num_parts))
    yield from (("near", r) for r in range(part, layout.near_ranges, layout.num_parts))


def search(task: tuple[str, int], layout: WorkLayout, classes: Sequence[str], distance: int,
           chunk_records: int = near_links.CHUNK_RECORDS) -> tuple[merge_reports.DuplicateSummary, list[near_blocks.BigValue]]:
    """One search task: an exact range's summary, or a band range's links written (an empty summary) and the
    band values too large for it, spilled for block tasks."""
    kind, index = task
    if kind == "exact":
        return merge_reports.find_duplicates(layout, index, classes), []
    near_links.find_pairs(layout, index, distance, chunk_records=chunk_records)
    return merge_reports.DuplicateSummary(), near_blocks.values(index, layout)


def deal_blocks(part: int, values: Sequence[near_blocks.BigValue],
                num_parts: int) -> Iterator[tuple[near_blocks.BigValue, int]]:
    """Part ``part``'s share of the spilled values' block tasks: every ``num_parts``-th."""
    tasks = [(value, block) for value in sorted(values) for block in range(value.blocks)]
    yield from tasks[part::num_parts]


def group_near(exact: merge_reports.DuplicateSummary, layout: WorkLayout, classes: Sequence[str],
               distance: int, values: Sequence[near_blocks.BigValue] = (),
               blocks_done: Sequence[int] = ()) -> tuple[merge_reports.DuplicateSummary, near_groups.NearSummary]:
    """After every search task and block task (``blocks_done``, the block tasks' results, only orders this after
    them): the near groups (an empty summary when the run took no perceptual hashes)."""
    del blocks_done
    near = near_groups.group_near(layout, distance, classes, values=sorted(values)) if layout.near_bands \
        else near_groups.NearSummary()
    return exact, near


def order(task: BucketTask, layout: WorkLayout) -> Iterator[tuple[tuple[str, int, int], tuple[int, int]]]:
    """A bucket task -> ``((split, shard, num_shards), (bucket, records))`` per slice written."""
    for shard, count in order_bucket(layout, task):
        yield (task.split, shard, task.num_shards), (task.bucket, count)


def write_duplicates(summaries: tuple, layout: WorkLayout, staging: str, classes: Sequence[str],
                     dropped: Optional[PartCounts] = None) -> None:
    """``duplicates.jsonl`` into staging (every group), and the manifest's summary into the work folder.

    ``summaries``: the exact and the near search's. ``dropped`` (``--drop-leaks``' counts, only waited for)
    orders this after the dropped list is written.
    """
    del dropped
    summary, near = summaries
    merge_reports.join_duplicates(layout, FileSystems.join(staging, record_schema.DUPLICATES_FILE))
    entry = {**summary.to_manifest(classes, record_schema.DUPLICATES_FILE), **near.to_manifest(),
             **drop_leaks.publish_list(layout, staging)}
    filesystems.write_text(FileSystems.join(layout.work, DUPLICATES_SUMMARY_FILE), json.dumps(entry, sort_keys=True))


class WriteShardFn(beam.DoFn):
    """``((split, shard, n), [(bucket, records)])`` -> ShardResult JSON; writes the shard file."""

    def __init__(self, src: str, staging: str, layout: WorkLayout, classes: Sequence[str],
                 encode: EncodeOptions, task: str = record_schema.TASK_CLASSIFICATION) -> None:
        self._src, self._staging, self._classes, self._encode = src, staging, tuple(classes), encode
        self._layout, self._task = layout, task

    def setup(self) -> None:
        self._written = Metrics.counter(NAMESPACE, "images_written")
        self._reencoded = Metrics.counter(NAMESPACE, "images_reencoded")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")

    def start_bundle(self) -> None:
        self._progress = ProgressWriter(publish.work_dir(self._staging), "write")

    def process(self, element: tuple[tuple[str, int, int], Iterable[tuple[int, int]]]) -> Iterator[str]:
        (split, index, num_shards), slices = element
        name = record_schema.shard_filename(split, index, num_shards)
        saved = FileSystems.join(self._layout.work, staging_names.shard_result_name(name))
        if FileSystems.exists(saved):  # written whole before its result (a killed run this one resumes)
            result_json = filesystems.read_text(saved)
            self._progress.add(ShardResult.from_json(result_json).num_examples, resumed=True)
            yield result_json
            return
        slices = sorted(slices)
        items = (
            work_records.decode_accepted(record, split)
            for bucket, _ in slices
            for record in work_records.iter_file(self._layout.slice(split, index, bucket), work_records.ACCEPTED)
        )
        # The shard's rows of the records table, whole before its result says the shard is written.
        with filesystems.whole_file(self._layout.table_part(split, index)) as handle:
            rows = ShardRows(handle, index, self._task)
            result = write_shard(
                self._src, self._staging, split, index, num_shards, items, self._classes, self._encode,
                on_record=self._progress.add, work=self._layout.work, table=rows,
            )
            rows.close(split)
        expected = sum(count for _, count in slices)
        if result.num_examples != expected:
            raise RuntimeError(f"shard {result.file} got {result.num_examples} records from its slices, "
                               f"expected {expected}: a work file was lost or replaced during the run")
        filesystems.write_text(FileSystems.join(publish.work_dir(self._staging), staging_names.shard_result_name(result.file)), result.to_json())
        faults.point("shard-written")
        self._written.inc(result.num_examples)
        self._reencoded.inc(sum(result.reencoded.values()))
        self._shards.inc()
        self._bytes.inc(result.num_bytes)
        yield result.to_json()

    def finish_bundle(self) -> None:
        self._progress.flush()


def spread_tasks(tasks: beam.PCollection, label: str, spread: bool) -> beam.PCollection:
    """``tasks`` through a Reshuffle labelled ``label``, which spreads them over the workers; ``tasks`` as they are
    where there are no workers to spread them over (``spread`` False: a run in the launcher's one process), as a
    Reshuffle costs about 0.1 s of CPU a run to build and run, and changes no element."""
    return tasks | label >> beam.Reshuffle() if spread else tasks


def _first(pair: tuple):
    return pair[0]


def _second(pair: tuple):
    return pair[1]


def _split_of(result_json: str) -> tuple[str, tuple[int, int]]:
    """A shard's result -> ``(split, (num_shards, records))``: what its split's table join waits for."""
    result = ShardResult.from_json(result_json)
    return result.split, (result.num_shards, result.num_examples)


def _shards_and_records(shards: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """A split's shard count and records, from its shards' ``(num_shards, records)``."""
    shards = list(shards)
    return shards[0][0], sum(records for _, records in shards)


class SearchDuplicates(beam.PTransform):
    """Part ids -> one ``(DuplicateSummary, NearSummary)``: the exact and the near groups (stage 6), after
    ``after`` (validation's counts, a side input: the searches read the work files it wrote).

    ``chunk_records``: the near search's chunk, and the size past which a band value goes to block tasks
    (:func:`near_links.find_pairs`; the groups are the same whatever it is)."""

    def __init__(self, layout: WorkLayout, classes: Sequence[str], distance: int, after: beam.PCollection,
                 chunk_records: int = near_links.CHUNK_RECORDS, spread: bool = True) -> None:
        super().__init__()
        self._layout, self._classes, self._distance, self._after = layout, list(classes), distance, after
        self._chunk, self._spread = chunk_records, spread

    def expand(self, parts: beam.PCollection) -> beam.PCollection:
        layout, distance = self._layout, self._distance
        searches = parts | "ListSearches" >> beam.FlatMap(deal_searches, beam.pvalue.AsSingleton(self._after), layout)
        found = (spread_tasks(searches, "SpreadSearches", self._spread)
                 | "FindDuplicates" >> beam.Map(search, layout, self._classes, distance, self._chunk))
        # Side inputs as lists: an empty one is [] (no combine with a default to build and run for it).
        values = beam.pvalue.AsList(found | "ListValues" >> beam.FlatMap(_second))
        # Dealt from the part ids, as the buckets are: Dask's Reshuffle does not spread.
        blocks = parts | "ListBlocks" >> beam.FlatMap(deal_blocks, values, layout.num_parts)
        blocks_done = beam.pvalue.AsList(spread_tasks(blocks, "SpreadBlocks", self._spread)
                                         | "SearchBlocks" >> beam.Map(near_blocks.search_block, layout, distance))
        return (
            found
            | "Summaries" >> beam.Map(_first)
            # One summary a hash range, and never none (layout.hash_ranges >= 1): no default to inject.
            | "SumDuplicates" >> beam.CombineGlobally(merge_reports.SumDuplicates()).without_defaults()
            | "GroupNear" >> beam.Map(group_near, layout, self._classes, distance, values, blocks_done)
        )


class ConvertImages(beam.PTransform):
    """Part ids -> shard files, ``rejected.jsonl`` and ``duplicates.jsonl`` in ``staging``; counts in the work folder."""

    def __init__(self, options: ConvertOptions, staging: str, classes: Sequence[str], class_text: Sequence[str],
                 planned: Optional[Mapping[str, int]], layout: WorkLayout,
                 task: str = record_schema.TASK_CLASSIFICATION, spread: bool = True,
                 shard_bytes: Optional[Mapping[str, float]] = None):
        super().__init__()
        self._options, self._staging, self._task, self._spread = options, staging, task, spread
        self._planned = None if planned is None else dict(planned)  # None: --shards auto, sized from the bytes
        self._shard_bytes = dict(shard_bytes or {})  # an update's: its splits' shard size (sized_count)
        self._classes, self._class_text, self._layout = tuple(classes), tuple(class_text), layout

    def expand(self, parts: beam.PCollection) -> beam.PCollection:
        opts, layout, staging = self._options, self._layout, self._staging
        validated = (
            parts
            | "ValidateParts" >> beam.ParDo(ValidatePartFn(opts.src, layout, opts.seed, opts.encode))
            # One count a part, and never none (layout.num_parts >= 1): no default to inject.
            | "CountBuckets" >> beam.CombineGlobally(SumCounts()).without_defaults()
        )
        searched = parts | "SearchDuplicates" >> SearchDuplicates(layout, self._classes, opts.near_distance, validated,
                                                                  spread=self._spread)
        totals, dropped = validated, None
        if opts.drop_leaks:
            dropped = searched | "CollectDrops" >> beam.Map(
                lambda _, classes: drop_leaks.collect_drops(layout, opts.seed, classes), list(self._classes))
            totals = validated | "DropLeaks" >> beam.Map(without, beam.pvalue.AsSingleton(dropped))
        duplicates_written = searched | "WriteDuplicates" >> beam.Map(
            write_duplicates, layout, staging, self._classes,
            beam.pvalue.AsSingleton(dropped) if dropped is not None else None)
        counts_written = totals | "WriteCounts" >> beam.Map(
            lambda counts, path: filesystems.write_text(path, counts.to_json()), FileSystems.join(layout.work, COUNTS_FILE)
        )
        # Tasks are dealt from the part ids, not made from the one summed element: a runner keeps
        # a collection's partitioning, and Beam's DaskRunner (whose Reshuffle does nothing) would
        # otherwise order every bucket and write every shard in one partition, on one worker.
        buckets = parts | "ListBuckets" >> beam.FlatMap(deal_buckets, beam.pvalue.AsSingleton(totals), self._planned,
                                                        layout.num_parts, self._shard_bytes)
        shards_written = (
            spread_tasks(buckets, "SpreadBuckets", self._spread)
            | "OrderBuckets" >> beam.FlatMap(order, layout)
            | "GroupSlices" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteShardFn(opts.src, staging, layout, self._class_text, opts.encode,
                                                     self._task))
        )
        tables_written = (
            shards_written
            | "KeyBySplit" >> beam.Map(_split_of)
            | "GroupShards" >> beam.GroupByKey()
            | "JoinTables" >> beam.MapTuple(
                lambda split, shards: join_tables.join_split(layout, staging, split, *_shards_and_records(shards)))
        )
        rejections_written = validated | "MergeRejections" >> beam.Map(
            lambda _, path: merge_reports.merge_rejections(layout, path),
            FileSystems.join(staging, record_schema.REJECTED_FILE),
        )
        # One terminal step that depends on every branch: Beam's DaskRunner computes only the
        # graph behind the last transform, so side branches would silently not run there.
        return (
            (shards_written, tables_written, rejections_written, duplicates_written, counts_written)
            | "JoinBranches" >> beam.Flatten()
            | "Done" >> beam.Map(lambda _: None)
        )
