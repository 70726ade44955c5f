"""The conversion's Beam transforms: thin DoFns around the per-image and per-shard functions.

Data flow (element shapes in comments)::

    chunk spans ((offset, length) of each line of the input list, a JSON array of CHUNK listed images),
    spread over the workers by the Create that makes them
      | ValidateImages   -> ("accepted", (split, AcceptedBatch)) | ("rejected", JSON line) | ("content", [(sha, ...)])
      | SelectAccepted   -> (split, AcceptedBatch)
      | GroupBySplit     -> (split, [AcceptedBatch])          keys and paths only
      | AssignShards     -> ((split, shard, n), AcceptedBatch in order)   one element per shard
      | SpreadShards     -> the same, spread over the workers
      | WriteShards      -> ShardResult JSON (shard file written to staging)
    rejected | CollectRejections -> rejected.jsonl in staging
    content  | CollectContentHashes -> duplicates.json in staging

Only keys and paths are grouped; image bytes are read in the shard writer (the
source file, or the bytes a re-encoded image was spilled to during
validation), so memory does not grow with the dataset's bytes. Elements are chunks of images
and whole shards, never single images: Beam's per-element cost in Python
would otherwise rival the per-image work. Shard writing is a plain DoFn after
a GroupByKey, which every Beam runner supports (no reliance on a sink's
finalisation step).
"""

from __future__ import annotations

import json
from typing import Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import record_schema
from beam_jobs import discover, faults, publish
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.progress import ProgressWriter
from beam_jobs.shard import assign_shards
from beam_jobs.validate import Accepted, AcceptedBatch, RejectedInput, validate_chunk
from beam_jobs.write import write_shard


NAMESPACE = "converter"
DUPLICATES_FILE = "duplicates.json"

# Images per pipeline element (see discover.iter_refs_jsonl).
CHUNK = 64


class ValidateImagesFn(beam.DoFn):
    """A chunk of listed images -> ``("accepted", (split, AcceptedBatch))`` per split in it.

    Outputs are tagged in the element, not with ``TaggedOutput``: Beam's
    DaskRunner mixes a DoFn's tagged outputs into its main output.
    The element is the chunk's ``(offset, length)`` in the input list file: the
    pipeline graph then stays tiny however many images there are (Dataflow
    caps a job graph at 10 MB), and no read transform is needed (Beam's
    DaskRunner cannot run ``ReadFromText``).

    Rejections come out as ``("rejected", JSON line)``; ``("content",
    [(sha256, split, label, path)])`` lists every accepted image, for the
    duplicate report.
    """

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    CONTENT = "content"

    def __init__(self, src: str, encode: EncodeOptions, work: str, input_list: str) -> None:
        self._src, self._encode, self._work = src, encode, work
        self._input_list = input_list

    def setup(self) -> None:
        self._accepted = Metrics.counter(NAMESPACE, "images_accepted")
        self._rejected = Metrics.counter(NAMESPACE, "images_rejected")

    def start_bundle(self) -> None:
        self._progress = ProgressWriter(self._work, "validate")

    def process(self, span: tuple[int, int]) -> Iterator:
        offset, length = span
        with FileSystems.open(self._input_list) as handle:
            handle.seek(offset)
            line = handle.read(length).decode("utf-8")
        by_split: dict[str, list[Accepted]] = {}
        content = []
        for result in validate_chunk(self._src, discover.refs_from_jsonl(line), self._encode, self._work,
                                     offset):
            self._progress.add()
            if isinstance(result, RejectedInput):
                self._rejected.inc()
                Metrics.counter(NAMESPACE, f"rejected_{result.reason}").inc()
                yield self.REJECTED, result.to_json()
            else:
                ref = result.ref
                self._accepted.inc()
                by_split.setdefault(ref.split, []).append(result)
                # 128 bits of the hash are plenty to find duplicates, and halve this list's memory.
                content.append((result.source_sha256[:16], ref.split, ref.label, discover.display_path(ref.relpath)))
        for split, items in by_split.items():
            yield self.ACCEPTED, (split, AcceptedBatch(tuple(items)))
        if content:
            yield self.CONTENT, content

    def finish_bundle(self) -> None:
        self._progress.flush()


def select(element: tuple[str, object], tag: str) -> Iterator:
    """The payload of ``element`` if it carries ``tag``."""
    if element[0] == tag:
        yield element[1]


def assign_split(element: tuple[str, Iterable[AcceptedBatch]], planned: Mapping[str, int], seed: int) -> Iterator:
    """``(split, [AcceptedBatch])`` -> one ``((split, shard, n), AcceptedBatch in order)`` per shard.

    Sorting by the keyed hash of (seed, path) gives the record order; the path
    breaks the (astronomically unlikely) ties so the order is total. The hash
    is computed here rather than carried from validation: it is cheap, and
    every byte carried per image is held in memory by the grouping steps.
    """
    split, chunks = element
    ordered = sorted(
        (item for chunk in chunks for item in chunk.items),
        key=lambda item: (discover.keyed_hash(seed, item.ref.relpath), item.ref.relpath),
    )
    shards: dict[tuple[str, int, int], list[Accepted]] = {}
    for shard, num_shards, _, item in assign_shards(ordered, planned[split]):
        shards.setdefault((split, shard, num_shards), []).append(item)
    for key, items in shards.items():
        yield key, AcceptedBatch(tuple(items))


def find_duplicates(chunks: Iterable[list[tuple]]) -> list[list[tuple]]:
    """Groups of ``(split, label, path)`` whose images have the same SHA-256, sorted."""
    by_hash: dict[bytes, list[tuple]] = {}
    for chunk in chunks:
        for sha, split, label, path in chunk:
            by_hash.setdefault(sha, []).append((split, label, path))
    return sorted(sorted(group) for group in by_hash.values() if len(group) > 1)


class WriteShardFn(beam.DoFn):
    """``((split, shard, n), AcceptedBatch)`` -> ShardResult JSON; writes the shard file."""

    def __init__(self, src: str, staging: str, classes: Sequence[str], encode: EncodeOptions,
                 dali_index: bool = False) -> None:
        self._src, self._staging, self._classes, self._encode = src, staging, tuple(classes), encode
        self._dali_index = dali_index

    def setup(self) -> None:
        self._written = Metrics.counter(NAMESPACE, "images_written")
        self._reencoded = Metrics.counter(NAMESPACE, "images_reencoded")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")

    def start_bundle(self) -> None:
        self._progress = ProgressWriter(publish.work_dir(self._staging), "write")

    def process(self, element: tuple[tuple[str, int, int], AcceptedBatch]) -> Iterator[str]:
        (split, index, num_shards), batch = element
        result = write_shard(
            self._src, self._staging, split, index, num_shards, batch.items, self._classes, self._encode,
            on_record=self._progress.add, work=publish.work_dir(self._staging), dali_index=self._dali_index,
        )
        publish.write_text(FileSystems.join(publish.work_dir(self._staging), f"{result.file}.json"), result.to_json())
        faults.point("shard-written")
        self._written.inc(result.num_examples)
        self._reencoded.inc(sum(result.reencoded.values()))
        self._shards.inc()
        self._bytes.inc(result.num_bytes)
        yield result.to_json()

    def finish_bundle(self) -> None:
        self._progress.flush()


def write_rejections(lines: list[str], path: str) -> None:
    """Write the rejection report, sorted by path so reruns give the same file."""
    publish.write_text(path, "".join(line + "\n" for line in sorted(lines)))


class ConvertImages(beam.PTransform):
    """Listed images -> shard files in ``staging`` and ``rejected.jsonl``."""

    def __init__(self, options: ConvertOptions, staging: str, classes: Sequence[str], planned: Mapping[str, int],
                 input_list: str):
        super().__init__()
        self._options, self._staging, self._classes, self._planned = options, staging, classes, dict(planned)
        self._input_list = input_list

    def expand(self, spans: beam.PCollection) -> beam.PCollection:
        opts = self._options
        work = publish.work_dir(self._staging)
        validate = ValidateImagesFn(opts.src, opts.encode, work, self._input_list)
        checked = spans | "ValidateImages" >> beam.ParDo(validate)
        rejections_written = (
            checked
            | "SelectRejections" >> beam.FlatMap(select, ValidateImagesFn.REJECTED)
            | "CollectRejections" >> beam.combiners.ToList()
            | "WriteRejections" >> beam.Map(
                write_rejections, FileSystems.join(self._staging, record_schema.REJECTED_FILE)
            )
        )
        duplicates_written = (
            checked
            | "SelectContentHashes" >> beam.FlatMap(select, ValidateImagesFn.CONTENT)
            | "CollectContentHashes" >> beam.combiners.ToList()
            | "WriteDuplicates" >> beam.Map(
                lambda chunks, path: publish.write_text(path, json.dumps(find_duplicates(chunks))),
                FileSystems.join(work, DUPLICATES_FILE),
            )
        )
        shards_written = (
            checked
            | "SelectAccepted" >> beam.FlatMap(select, ValidateImagesFn.ACCEPTED)
            | "GroupBySplit" >> beam.GroupByKey()
            | "AssignShards" >> beam.FlatMap(assign_split, self._planned, opts.seed)
            # One element per shard; spread them so shards are written in parallel.
            | "SpreadShards" >> beam.Reshuffle()
            | "WriteShards" >> beam.ParDo(WriteShardFn(opts.src, self._staging, self._classes, opts.encode,
                                                           opts.dali_index))
        )
        # One terminal step that depends on every branch: Beam's DaskRunner computes only the
        # graph behind the last transform, so side branches would silently not run there.
        return (
            (shards_written, rejections_written, duplicates_written)
            | "JoinBranches" >> beam.Flatten()
            | "Done" >> beam.Map(lambda _: None)
        )
