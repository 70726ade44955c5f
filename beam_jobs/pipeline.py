"""The conversion as an Apache Beam pipeline, and :func:`run`, which launches and publishes it.

Data flow (element shapes in comments)::

    chunk spans ((offset, length) of each line of the input list, a JSON array of CHUNK listed images)
      | SpreadChunks     -> the same, spread over the workers
      | ValidateImages   -> ("accepted", (split, [Accepted])) | ("rejected", JSON line) | ("content", [(sha, ...)])
      | SelectAccepted   -> (split, [Accepted])
      | GroupBySplit     -> (split, [[Accepted]])             keys and paths only
      | AssignShards     -> ((split, shard, n), [Accepted in order])   one element per shard
      | SpreadShards     -> the same, spread over the workers
      | WriteShards      -> ShardResult JSON (shard file written to staging)
    rejected | CollectRejections -> rejected.jsonl in staging
    content  | CollectContentHashes -> duplicates.json in staging

Only keys and paths are grouped; image bytes are read in the shard writer, so
memory does not grow with the dataset's bytes. Elements are chunks of images
and whole shards, never single images: Beam's per-element cost in Python
would otherwise rival the per-image work. Shard writing is a plain DoFn
after a GroupByKey, which every Beam runner supports (no reliance on a sink's
finalisation step).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Iterable, Iterator, Mapping, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

import record_schema
from beam_jobs import discover, faults, publish
from beam_jobs.manifest import ConvertSummary, build_manifest, check_results, summarize_duplicates
from beam_jobs.options import ConvertOptions, EncodeOptions
from beam_jobs.progress import ProgressBars, ProgressWriter
from beam_jobs.shard import assign_shards, plan_shard_counts
from beam_jobs.validate import Accepted, RejectedInput, validate_ref
from beam_jobs.write import ShardResult, write_shard

logger = logging.getLogger(__name__)

NAMESPACE = "converter"
DUPLICATES_FILE = "duplicates.json"


class ConversionFailedError(RuntimeError):
    """The Beam pipeline failed (a worker raised, a disk filled up...); nothing was published."""


class TooManyRejectedError(RuntimeError):
    """More inputs were rejected than --max-bad-fraction allows; nothing was published."""


# Images per pipeline element (see discover.iter_refs_jsonl).
CHUNK = 64


class ValidateImagesFn(beam.DoFn):
    """A chunk of listed images -> ``("accepted", (split, [Accepted]))`` per split in it.

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

    def __init__(self, src: str, encode: EncodeOptions, seed: int, progress_dir: str, input_list: str) -> None:
        self._src, self._encode, self._seed, self._progress_dir = src, encode, seed, progress_dir
        self._input_list = input_list

    def setup(self) -> None:
        self._accepted = Metrics.counter(NAMESPACE, "images_accepted")
        self._rejected = Metrics.counter(NAMESPACE, "images_rejected")

    def start_bundle(self) -> None:
        self._progress = ProgressWriter(self._progress_dir, "validate")

    def process(self, span: tuple[int, int]) -> Iterator:
        offset, length = span
        with FileSystems.open(self._input_list) as handle:
            handle.seek(offset)
            line = handle.read(length).decode("utf-8")
        by_split: dict[str, list[Accepted]] = {}
        content = []
        for ref in discover.refs_from_jsonl(line):
            result = validate_ref(self._src, ref, self._encode, self._seed)
            self._progress.add()
            if isinstance(result, RejectedInput):
                self._rejected.inc()
                Metrics.counter(NAMESPACE, f"rejected_{result.reason}").inc()
                logger.info("rejected %s: %s", result.relpath, result.detail)
                yield self.REJECTED, result.to_json()
            else:
                self._accepted.inc()
                by_split.setdefault(ref.split, []).append(result)
                # 128 bits of the hash are plenty to find duplicates, and halve this list's memory.
                content.append((result.source_sha256[:32], ref.split, ref.label, ref.relpath))
        for split_and_items in by_split.items():
            yield self.ACCEPTED, split_and_items
        if content:
            yield self.CONTENT, content

    def finish_bundle(self) -> None:
        self._progress.flush()


def select(element: tuple[str, object], tag: str) -> Iterator:
    """The payload of ``element`` if it carries ``tag``."""
    if element[0] == tag:
        yield element[1]


def assign_split(element: tuple[str, Iterable[list[Accepted]]], planned: Mapping[str, int]) -> Iterator:
    """``(split, [[Accepted]])`` -> one ``((split, shard, n), [Accepted in order])`` per shard.

    Sorting by the keyed hash gives the record order; the path breaks the
    (astronomically unlikely) ties so the order is total.
    """
    split, chunks = element
    ordered = sorted((item for chunk in chunks for item in chunk), key=lambda item: (item.sort_key, item.ref.relpath))
    shards: dict[tuple[str, int, int], list[Accepted]] = {}
    for shard, num_shards, _, item in assign_shards(ordered, planned[split]):
        shards.setdefault((split, shard, num_shards), []).append(item)
    yield from shards.items()


def find_duplicates(chunks: Iterable[list[tuple]]) -> list[list[tuple]]:
    """Groups of ``(split, label, path)`` whose images have the same SHA-256, sorted."""
    by_hash: dict[str, list[tuple]] = {}
    for chunk in chunks:
        for sha, split, label, path in chunk:
            by_hash.setdefault(sha, []).append((split, label, path))
    return sorted(sorted(group) for group in by_hash.values() if len(group) > 1)


class WriteShardFn(beam.DoFn):
    """``((split, shard, n), [Accepted])`` -> ShardResult JSON; writes the shard file."""

    def __init__(self, src: str, staging: str, classes: Sequence[str], encode: EncodeOptions) -> None:
        self._src, self._staging, self._classes, self._encode = src, staging, tuple(classes), encode

    def setup(self) -> None:
        self._written = Metrics.counter(NAMESPACE, "images_written")
        self._reencoded = Metrics.counter(NAMESPACE, "images_reencoded")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")

    def start_bundle(self) -> None:
        self._progress = ProgressWriter(publish.work_dir(self._staging), "write")

    def process(self, element: tuple[tuple[str, int, int], list[Accepted]]) -> Iterator[str]:
        (split, index, num_shards), items = element
        result = write_shard(
            self._src, self._staging, split, index, num_shards, items, self._classes, self._encode,
            on_record=self._progress.add,
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
        validate = ValidateImagesFn(opts.src, opts.encode, opts.seed, work, self._input_list)
        checked = (
            spans
            # Spread the chunks over the workers: a small input is a single bundle otherwise.
            | "SpreadChunks" >> beam.Reshuffle()
            | "ValidateImages" >> beam.ParDo(validate)
        )
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
            | "AssignShards" >> beam.FlatMap(assign_split, self._planned)
            # One element per shard; spread them so shards are written in parallel.
            | "SpreadShards" >> beam.Reshuffle()
            | "WriteShards" >> beam.ParDo(WriteShardFn(opts.src, self._staging, self._classes, opts.encode))
        )
        # One terminal step that depends on every branch: Beam's DaskRunner computes only the
        # graph behind the last transform, so side branches would silently not run there.
        return (
            (shards_written, rejections_written, duplicates_written)
            | "JoinBranches" >> beam.Flatten()
            | "Done" >> beam.Map(lambda _: None)
        )


def default_pipeline_options(pipeline_args: Sequence[str]) -> PipelineOptions:
    """Beam options from the user's flags; a local run uses every core by default.

    Without ``--runner``, the DirectRunner runs in multi-processing mode with
    one worker per core (``--direct_num_workers=0``). ``--runner=dask`` (or
    ``DaskRunner``) is short for Beam's ``...dask.dask_runner.DaskRunner``,
    with one element per Dask partition. Every flag the user gives wins over
    these defaults.
    """
    args = list(pipeline_args)
    runner = PipelineOptions(args).view_as(StandardOptions).runner
    if runner is None:
        defaults = ["--runner=DirectRunner", "--direct_num_workers=0", "--direct_running_mode=multi_processing"]
        return PipelineOptions(_with_defaults(args, defaults))
    if str(runner).lower() in ("dask", "daskrunner") or "dask_runner" in str(runner):
        try:
            # Registers DaskOptions (--dask_client_address...) before Beam parses them.
            from apache_beam.runners.dask import dask_runner
        except ImportError as err:
            raise ImportError("--runner=DaskRunner needs the dask extra: pip install '.[dask]'") from err
        args = [arg for arg in args if not arg.startswith("--runner")]
        # Beam's default packs 128 of our coarse elements (chunks of 64 images) into one Dask
        # partition, leaving workers idle; one per partition costs ~0.1 s of task overhead each.
        # Two partitions per worker thread balances the two.
        defaults = [f"--runner={dask_runner.__name__}.DaskRunner",
                    f"--dask_npartitions={2 * _dask_threads(PipelineOptions(args).view_as(dask_runner.DaskOptions))}"]
        return PipelineOptions(_with_defaults(args, defaults, exclusive={"--dask_npartitions": "--dask_partition_size"}))
    return PipelineOptions(args)


def _dask_threads(options: PipelineOptions) -> int:
    """Worker threads of the Dask cluster the run will use (this machine's cores for a local cluster)."""
    address = options.get_all_options().get("address")
    if not address:
        return os.cpu_count() or 1
    import distributed

    with distributed.Client(address, timeout=30) as client:
        return max(1, sum(client.nthreads().values()))


def _with_defaults(args: list[str], defaults: list[str], exclusive: Optional[dict[str, str]] = None) -> list[str]:
    """``args`` plus each default flag the user did not give (nor its mutually exclusive partner)."""
    given = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    exclusive = exclusive or {}
    extra = [flag for flag in defaults
             if flag.split("=", 1)[0] not in given and exclusive.get(flag.split("=", 1)[0]) not in given]
    return args + extra


def is_local_run(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    return runner is None or "Direct" in str(runner) or "Prism" in str(runner)


def run(
    options: ConvertOptions,
    pipeline_args: Sequence[str] = (),
    show_progress: Optional[bool] = None,
) -> ConvertSummary:
    """Convert ``options.src`` into a published dataset at ``options.out``.

    Args:
      options: the conversion's own options.
      pipeline_args: Beam pipeline flags (``--runner``, ``--direct_num_workers``...).
      show_progress: tqdm bars; default on for local runs.

    Returns:
      What was written; the dataset is complete at ``options.out``.

    Raises:
      discover.InputError: SRC or --labels is unusable.
      publish.PublishError: OUT cannot be (over)written.
      TooManyRejectedError: the error budget was exceeded; nothing published.
      ConversionFailedError: the pipeline failed (disk full, an input changed
        during the run...); nothing published.
    """
    started = time.monotonic()
    beam_options = default_pipeline_options(pipeline_args)
    out = options.out
    with publish.output_lock(out):
        faults.point("locked")
        publish.recover_and_clean(out)
        publish.check_out(out, options.overwrite)
        labels = discover.read_labels_file(options.labels_file) if options.labels_file else None
        plan = discover.plan_inputs(
            discover.list_tree(options.src), labels, options.val_fraction, options.seed, src=options.src
        )
        if plan.skipped:
            logger.info("skipped without reading: %s", plan.skipped)
        planned = plan_shard_counts(plan.split_sizes(), options.shards)
        staging = publish.new_staging(out)
        try:
            manifest = _convert(options, plan, planned, staging, beam_options, show_progress)
            faults.point("before-commit")
            publish.commit(staging, out, manifest)
            faults.point("committed")
        except BaseException:
            _remove_quietly(staging)
            raise
    _remove_quietly(_rejected_report_path(out))
    return ConvertSummary.from_manifest(out, manifest, time.monotonic() - started)


def _convert(
    options: ConvertOptions,
    plan: discover.InputPlan,
    planned: Mapping[str, int],
    staging: str,
    beam_options: PipelineOptions,
    show_progress: Optional[bool],
) -> dict:
    """Run the pipeline into ``staging``; return the manifest to commit."""
    work = publish.work_dir(staging)
    input_list = FileSystems.join(work, "inputs.jsonl")
    lines = [line.encode("utf-8") for line in discover.iter_refs_jsonl(plan.refs, CHUNK)]
    publish.write_text(input_list, b"".join(lines).decode("utf-8"))
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    spans = [(start, end - start) for start, end in zip(offsets, offsets[1:])]
    publish.write_text(FileSystems.join(staging, record_schema.LABELS_FILE), "".join(c + "\n" for c in plan.classes))
    faults.point("listed")

    progress = is_local_run(beam_options) if show_progress is None else show_progress
    with ProgressBars(work, len(plan.refs), enabled=progress), _private_tempdir():
        try:
            with beam.Pipeline(options=beam_options) as pipeline:
                _ = (
                    pipeline
                    | "ListChunks" >> beam.Create(spans)
                    | "ConvertImages" >> ConvertImages(options, staging, plan.classes, planned, input_list)
                )
        except Exception as err:  # runners re-raise worker errors as assorted types; name the outcome
            raise ConversionFailedError(
                f"the conversion failed and nothing was published ({options.out} is unchanged): {_first_line(err)}"
            ) from err

    faults.point("pipeline-done")
    rejected = [
        json.loads(line)
        for line in publish.read_text(FileSystems.join(staging, record_schema.REJECTED_FILE)).splitlines()
    ]
    _check_error_budget(options, plan, rejected, staging)
    split_of = {ref.relpath: ref.split for ref in plan.refs}
    accepted = dict(plan.split_sizes())
    for item in rejected:
        accepted[split_of[item["path"]]] -= 1
    results = _read_results(work)
    check_results(results, accepted)
    groups = json.loads(publish.read_text(FileSystems.join(work, DUPLICATES_FILE)))
    duplicates = summarize_duplicates(groups, plan.classes)
    if duplicates["cross_label"] or duplicates["cross_split"]:
        logger.info(
            "%d identical images carry different labels and %d sit in more than one split (see manifest.json "
            "'duplicates', or python -m converter inspect)",
            duplicates["num_cross_label"], duplicates["num_cross_split"],
        )
    return build_manifest(plan, results, rejected, options, duplicates)


def _first_line(err: BaseException) -> str:
    """The gist of a runner's error: the last line that names an exception, without Beam's stack dump."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.split(":")[0]]
    return (named[-1] if named else lines[-1] if lines else type(err).__name__)[:500]


def _check_error_budget(
    options: ConvertOptions, plan: discover.InputPlan, rejected: list[dict], staging: str
) -> None:
    """Fail, keeping the rejection report beside OUT, when too many inputs were rejected."""
    fraction = len(rejected) / len(plan.refs)
    if fraction <= options.max_bad_fraction and len(rejected) < len(plan.refs):
        return
    report = _rejected_report_path(options.out)
    FileSystems.rename([FileSystems.join(staging, record_schema.REJECTED_FILE)], [report])
    raise TooManyRejectedError(
        f"{len(rejected)} of {len(plan.refs)} images ({fraction:.1%}) were rejected, more than "
        f"--max-bad-fraction {options.max_bad_fraction:g}; nothing was published. "
        f"The reasons are in {report}"
    )


def _rejected_report_path(out: str) -> str:
    """Where the rejection report of a run that exceeded the error budget is kept."""
    return out.rstrip("/") + ".rejected.jsonl"


@contextlib.contextmanager
def _private_tempdir() -> Iterator[None]:
    """Point temporary files of the runner and its local workers at a folder removed afterwards.

    Beam's portable local runners leave empty ``beam-temp*`` and ``tmp*``
    folders in the system temp folder on every run; this keeps them contained.
    Local worker processes inherit ``TMPDIR``.
    """
    folder = tempfile.mkdtemp(prefix="imgshards-run-")
    saved_env, saved_default = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield
    finally:
        tempfile.tempdir = saved_default
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(folder, ignore_errors=True)


def _read_results(work: str) -> list[ShardResult]:
    matches = FileSystems.match([FileSystems.join(work, "*.tfrecord.json")])[0].metadata_list
    return [ShardResult.from_json(publish.read_text(meta.path)) for meta in matches]


def _remove_quietly(path: str) -> None:
    try:
        if FileSystems.exists(path):
            FileSystems.delete([path])
    except OSError as err:
        logger.warning("could not remove %s: %s", path, err)
