"""Parse the command line and call the library; no conversion logic lives here.

``python -m converter --src DIR [options] [Beam pipeline options]`` converts.
The converter's own flags are parsed here; every other flag goes untouched to
Beam's ``PipelineOptions`` (the split Beam's wordcount example makes), so
``--runner``, ``--direct_num_workers``, ``--project`` and friends just work.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import signal
import sys
import traceback
from typing import Callable, Optional, Sequence

from beam_jobs import options as opts
from converter.card import add_card_flags, main as card_main
from beam_jobs.runtime import interrupt
from beam_jobs.runtime.log_filters import not_beam_noise
from record_files.dataset_card import card_from_flags

logger = logging.getLogger("converter")

SUBCOMMANDS = ("convert", "verify", "inspect", "report", "card", "reindex", "tfds-metadata")

_EPILOG = """\
Other commands:
  python -m converter verify OUT [--sample N]     check every shard and record against the manifest
  python -m converter inspect OUT [--grid F.png]  classes by split, shard sizes, rejections, duplicates
  python -m converter report OUT [--dest DIR]     report.html + report.json: figures, contact sheets, duplicates
  python -m converter card OUT [--card F]         write OUT/croissant.json (Croissant metadata)
  python -m converter reindex OUT [--all]         rebuild missing or damaged record indexes (.idx) from the shards
  python -m converter tfds-metadata OUT           write TFDS's metadata: tfds.builder_from_directory(OUT)

Any other flag is an Apache Beam pipeline option, passed to PipelineOptions untouched, e.g.
  --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp --setup_file=./setup.py
  --direct_num_workers=N   (local runs use every core by default)

Exit status: 0 only when the dataset was published; 1 for a failed conversion; 2 for bad usage;
130 after Ctrl-C (SIGINT), 143 after SIGTERM, 129 after SIGHUP. A stopped run keeps its finished work
(the line it ends with says where) and the same command resumes from it.
"""


def build_convert_parser() -> argparse.ArgumentParser:
    """The flags of a conversion, each with its default in the help."""
    parser = argparse.ArgumentParser(
        prog="python -m converter",
        description="Convert a folder of images (one sub-folder per class, optionally under "
        "train/validation/test folders) into sharded TFRecord files of tf.train.Example records.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--src", required=True, help="input folder: SRC/<class>/**/<image> or SRC/<split>/<class>/**/<image>")
    add("--out", default="", help=f"output folder (default: SRC with '{opts.OUT_SUFFIX}' appended, beside SRC)")
    add("--shards", type=_shards, default=opts.DEFAULT_SHARDS,
        help="shards of the train split; other splits get ceil(shards * their size / train size); 'auto': each "
        "split's count from its bytes, 64 MiB..1 GiB per shard as TFDS sizes them (default: %(default)s; "
        "never more shards than images)")
    add("--val-fraction", type=float, default=0.0,
        help="carve this fraction of each class out of a single-split tree as a validation split "
        "(default: %(default)s, off)")
    add("--seed", type=int, default=opts.DEFAULT_SEED,
        help="salt of the keyed hash that orders the records and carves validation (default: %(default)s)")
    add("--labels", dest="labels_file", default=None,
        help="file with one class name per line. Class folders, label files, ImageNet, WebDataset: line i gets "
        "label i (default: the names sorted). Pascal VOC, CVAT: the classes in id order from 1 (id 0 is the "
        "background). COCO, YOLO, the Hub: they number their classes themselves, and --labels is checked against "
        "them")
    add("--annotations", default=None,
        help="label file listing the images instead of class folders: CSV/TSV with a header, or JSON Lines, "
        "with columns path, label and optionally split (train, validation/val, test); paths relative to --src")
    add("--annotation-columns", default=",".join(opts.ANNOTATION_COLUMNS), metavar="PATH,LABEL[,SPLIT]",
        help="the --annotations file's names for the path, label and split columns, e.g. image,breed "
        "(default: %(default)s)")
    add("--label-separator", default=None, metavar="SEP",
        help="several labels an image: the --annotations file's label cells hold class names separated by SEP "
        "(' ' for Planet's tags); records get image/class/label as a list")
    add("--val-labels", default=None,
        help="ImageNet-style: labels of a flat SRC/val/ folder (LOC_val_solution.csv, or one class id per line "
        "in file-name order); train stays SRC/train/<class>/")
    add("--label-member", default=None, metavar="EXT|json:FIELD",
        help="WebDataset samples (img2dataset shards): label each image by its sibling member with the same key, "
        "the text of <key>.EXT (cls) or a field of <key>.json; folder and archive names are then not classes")
    add("--archive-scan", choices=opts.ARCHIVE_SCANS, default="auto",
        help="who reads the headers of the tars under --src (a tar has no index; its headers are spread through "
        "it): the run's workers, or this process before they start; auto: the workers when the tars hold 4 GiB "
        "or more (default: %(default)s; the output is the same)")
    add("--config", default=None, metavar="NAME",
        help="a Parquet dataset (Hugging Face's) with several configs: the one to convert")
    add("--image-column", default=None, metavar="NAME",
        help="a Parquet dataset's image column (default: the one column of the Hub's Image type)")
    add("--label-column", default=None, metavar="NAME",
        help="a Parquet dataset's label column (default: its one ClassLabel column; a column of text or, with "
        "--labels, of integers)")
    add("--local-paths", action="store_true",
        help="a Parquet dataset whose rows hold no image bytes but absolute paths (datasets' to_parquet of local "
        "files): read those files from this machine (off: data from elsewhere never reads this machine's files)")
    add("--bbox-format", default=None, choices=("coco", "pascal_voc", "yolo"),
        help="a Parquet dataset's objects column: its bbox is [x, y, w, h] pixels (coco, the default), [xmin, ymin, "
        "xmax, ymax] pixels (pascal_voc) or [cx, cy, w, h] normalized (yolo)")
    add("--masks", action="store_true",
        help="COCO: write each object's segmentation (polygons, a crowd's RLE) as a PNG mask in its record "
        "(image/object/mask, Model Garden's include_mask); needs pip install '.[masks]'")
    add("--annotation-frame", choices=opts.ANNOTATION_FRAMES, default=opts.ANNOTATION_FRAMES[0],
        help="objects: the frame boxes are in where an image's size cannot tell (EXIF orientations 2-4, square "
        "images, normalized coordinates): stored (pixels as the file holds them: COCO's tools) or upright (EXIF "
        "applied: CVAT, Label Studio, Roboflow, YOLO); auto: each source's convention (default: %(default)s)")
    add("--keep-partial-images", action="store_true",
        help="objects: write an image without its objects that cannot be written (an unknown class, a box outside "
        "the image, a bad mask) instead of rejecting the image (default: rejected, naming the object)")
    add("--synsets", default=None, help="'ID text' per line: each class's text in the records "
        "(ImageNet's LOC_synset_mapping.txt)")
    add("--max-side", type=int, default=None,
        help="downsize images whose longer side exceeds this many pixels (default: keep sizes)")
    add("--min-side", type=int, default=None,
        help="reject images whose shorter side is below this many pixels (default: keep all; the summary "
        "reports images under 32 px)")
    add("--quality", type=int, default=opts.DEFAULT_QUALITY,
        help="JPEG quality for images that must be re-encoded (default: %(default)s)")
    add("--max-pixels", type=int, default=opts.DEFAULT_MAX_PIXELS,
        help="reject images with more pixels than this, before decoding (default: %(default)s)")
    add("--max-bad-fraction", type=float, default=opts.DEFAULT_MAX_BAD_FRACTION,
        help="fail and publish nothing when more than this fraction of the images is rejected "
        "(default: %(default)s)")
    add("--near-distance", type=_near_distance, default=opts.AUTO, metavar="BITS",
        help="images whose 64-bit perceptual hashes differ in at most BITS bits are near-duplicates, listed in "
        f"duplicates.jsonl with their distance (0..{opts.MAX_NEAR_DISTANCE}, or auto: {opts.DEFAULT_NEAR_DISTANCE} "
        "up to about 8 million images, then 2, then 1 past about 400 million, so that the search stays linear "
        "in the images; default: %(default)s)")
    add("--no-near-duplicates", dest="near_duplicates", action="store_false",
        help="no perceptual hash and no near-duplicate search (identical files are still found)")
    add("--drop-leaks", action="store_true",
        help="do not write the validation and test images that are byte-identical copies of an image of an "
        "earlier split, or within --near-distance of a training image (a direct pair: an image linked to the "
        "training split only through other near images is kept); dropped.jsonl lists each with its partner "
        "and distance")
    add("--dali-index", action="store_true", default=None, help=argparse.SUPPRESS)  # deprecated: always on
    add("--part-size", type=int, default=None,
        help="images per unit of work (validation, and the ordering stage's memory: ~200 bytes per image); "
        "never changes the output (default: about 1/64 of the images, within 128..1048576)")
    add("--overwrite", action="store_true",
        help="replace a dataset already in --out, once the new one is complete (default: refuse)")
    add("--no-progress", dest="progress", action="store_false", help="no progress bars (on a terminal) or progress lines (into a pipe or a log file)")
    add("-v", "--verbose", action="store_true", help="log every rejected file and Beam's own messages")
    add_card_flags(parser)
    return parser


def _shards(text: str):
    """``--shards``: a count, or ``auto``."""
    if text.strip().lower() == opts.AUTO:
        return opts.AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}") from None


def _near_distance(text: str):
    """``--near-distance``: bits, or ``auto`` (the range is the options' to check, naming the flag)."""
    if text.strip().lower() == opts.AUTO:
        return opts.AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer in 0..{opts.MAX_NEAR_DISTANCE}, "
                                         f"got {text!r}") from None


def _our_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def _reject_near_misses(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> None:
    """A flag that is almost one of ours is a typo, not a Beam option: say so."""
    ours = _our_flags(parser)
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, ours, n=1, cutoff=0.8)
        if close:
            parser.error(f"unknown option {name}; did you mean {close[0]}?")


def convert(argv: Sequence[str]) -> int:
    """``python -m converter [convert] --src ...``."""
    parser = build_convert_parser()
    args, pipeline_args = parser.parse_known_args(argv)
    _reject_near_misses(parser, pipeline_args)
    _configure_logging(args.verbose)
    if args.dali_index:
        logger.warning("--dali-index is deprecated and does nothing: every shard's record index (<shard>.idx, "
                       "NVIDIA DALI's format) is always written; drop the flag")
    try:
        options = opts.ConvertOptions(
            src=args.src,
            out=args.out,
            shards=args.shards,
            val_fraction=args.val_fraction,
            seed=args.seed,
            labels_file=args.labels_file,
            encode=opts.EncodeOptions(quality=args.quality, max_side=args.max_side, max_pixels=args.max_pixels,
                                      min_side=args.min_side, local_paths=args.local_paths,
                                      annotation_frame=args.annotation_frame,
                                      keep_partial_images=args.keep_partial_images,
                                      perceptual_hash=args.near_duplicates),
            max_bad_fraction=args.max_bad_fraction,
            overwrite=args.overwrite,
            annotations=args.annotations,
            annotation_columns=tuple(name.strip() for name in args.annotation_columns.split(",")),
            label_separator=args.label_separator,
            val_labels=args.val_labels,
            label_member=args.label_member,
            synsets=args.synsets,
            part_size=args.part_size,
            archive_scan=args.archive_scan,
            config=args.config,
            image_column=args.image_column,
            label_column=args.label_column,
            bbox_format=args.bbox_format,
            masks=args.masks,
            near_distance=args.near_distance,
            drop_leaks=args.drop_leaks,
            card=card_from_flags(args.card, args.license, args.citation),
        )
    except ValueError as err:
        parser.error(str(err))
    # OUT is known before Beam loads (seconds), so a stop while it loads says the same as any other.
    interrupt.set_exit_message(_stop_line("{verb}", options.out, published=False))
    if not any(arg.startswith(("--runner", "--direct_running_mode")) for arg in pipeline_args):
        from beam_jobs.runtime import worker_start

        # only for runs with workers, whose Beam then loads beside the launcher's (worker_start)
        worker_start.start_for(options.src, pipeline_args, downsizing=options.encode.max_side is not None)
    from beam_jobs import pipeline  # Beam loads only now, after logging is set
    from beam_jobs.files import publish
    from beam_jobs.planning import discover
    from beam_jobs.runtime import runners

    interrupt.raise_if_received()  # a signal while Beam loaded whose exception Python lost in an import callback
    try:
        summary = pipeline.run(options, pipeline_args, show_progress="auto" if args.progress else False)
    except interrupt.Interrupted as err:
        # Cleanup (workers, scratch, lock) ran on the way out; nothing else is worth a traceback.
        line = _stop_line(err.verb, options.out, err.published) + (f". {err.kept}" if err.kept else "")
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            print("\n" + line, file=sys.stderr)
        return err.exit_status
    except runners.UnknownFlagError as err:
        if err.flag.startswith("-"):
            hint = runners.suggest(err.flag, _our_flags(parser) + runners.beam_flag_names())
            parser.error(f"unknown option {err.flag}{hint} (not an option of the converter nor of Apache Beam)")
        parser.error(str(err))
    except runners.BadFlagValueError as err:
        parser.error(str(err))
    except (discover.InputError, publish.PublishError, pipeline.TooManyRejectedError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except pipeline.ConversionFailedError as err:
        if args.verbose:
            traceback.print_exception(err.__cause__ or err, file=sys.stderr)
        print(f"error: {err}" + ("" if args.verbose else "\n(run with -v for the full trace)"), file=sys.stderr)
        return 1
    print(summary.format())
    return 0


def _stop_line(verb: str, out: str, published: bool) -> str:
    """The one line a stopped conversion prints."""
    if published:
        return f"{verb}: the signal came while publishing, so {out} was published whole first"
    return f"{verb}: nothing was published; {out} is unchanged"


class _CliFormatter(logging.Formatter):
    """``warning: ...`` as the summary's warnings and ``error: ...`` read; ``-v`` adds level and logger names."""

    def __init__(self, verbose: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s" if verbose else None)
        self._verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        if self._verbose:
            return super().format(record)
        return f"{record.levelname.lower()}: {record.getMessage()}"


def _configure_logging(verbose: bool) -> None:
    """Our warnings and errors; with ``-v`` our own messages too, and Beam's warnings, never its chatter."""
    handler = logging.StreamHandler()
    handler.setFormatter(_CliFormatter(verbose))
    handler.addFilter(not_beam_noise)
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, handlers=[handler])
    if verbose:
        # Beam's INFO lines (57 "Converting string literal type hint" for 12 images, each worker's start-up
        # and shutdown) say nothing about the conversion; its warnings do. Workers follow (pipeline.py).
        logging.getLogger("apache_beam").setLevel(logging.WARNING)
    else:
        for name in ("converter", "beam_jobs", "reader"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # A failed pipeline is reported once, by us; Beam would log the worker's whole stack first.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)


def _dataset_command(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of a subcommand that takes a converted dataset's folder (local, gs:// or s3://).

    It takes the converter's (Beam's) ``--s3_*`` flags too, so the command
    that wrote a dataset into an S3 endpoint can check it with the same flags.
    """
    parser = argparse.ArgumentParser(prog=f"python -m converter {name}", description=description,
                                     epilog="s3:// datasets are reached as the AWS environment says (AWS_ENDPOINT_URL, "
                                     "AWS_ACCESS_KEY_ID...), or as these --s3_* flags do.")
    parser.add_argument("out", help="the dataset folder (a local path, gs://... or s3://...)")
    s3 = parser.add_argument_group("S3 (the converter's flags, default: the AWS environment)")
    for flag in ("endpoint_url", "access_key_id", "secret_access_key", "session_token", "region_name"):
        s3.add_argument(f"--s3_{flag}", default=None, metavar=flag.upper())
    s3.add_argument("--s3_verify", default=None, help="false, or a CA bundle's path")
    s3.add_argument("--s3_disable_ssl", action="store_true", default=None)
    return parser


def _configure_s3(args: argparse.Namespace) -> None:
    """Hand the ``--s3_*`` flags to the reader's S3 client."""
    from reader import storage

    verify = args.s3_verify
    if isinstance(verify, str) and verify.lower() in ("false", "0", "no"):
        verify = False
    storage.configure_s3(endpoint_url=args.s3_endpoint_url, access_key_id=args.s3_access_key_id,
                         secret_access_key=args.s3_secret_access_key, session_token=args.s3_session_token,
                         region_name=args.s3_region_name, verify=verify,
                         use_ssl=False if args.s3_disable_ssl else None)


def verify(argv: Sequence[str]) -> int:
    """``python -m converter verify OUT [--sample N]``: exit 0 only when every check holds."""
    parser = _dataset_command(
        "verify", "Check a converted dataset: manifest, shard list, every record's CRCs, keys, labels, "
        "SHA-256 and image decode, and counts, bytes and checksums against the manifest.")
    parser.add_argument("--sample", type=int, default=None,
                        help="decode only the first N images of each shard (default: all)")
    args = parser.parse_args(argv)
    if args.sample is not None and args.sample < 0:
        parser.error(f"--sample must be >= 0, got {args.sample}")

    def check(args: argparse.Namespace) -> int:
        from reader.verify import verify as run_verify

        report = run_verify(args.out, sample=args.sample)
        print(report.format())
        return 0 if report.ok else 1

    return _on_dataset(args, check)


def _quiet_tensorflow() -> None:
    """TensorFlow loaded through ``reader`` (without its start-up lines: reader.quiet_start), its warnings hidden
    too unless the environment sets a level: a dataset command's output is its report."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import reader  # noqa: F401


def _on_dataset(args: argparse.Namespace, act: Callable[[argparse.Namespace], int],
                also: tuple[type[Exception], ...] = ()) -> int:
    """Run a dataset command's ``act`` with TensorFlow quiet and the ``--s3_*`` flags applied; a missing or
    malformed dataset (or one of ``also``) is one ``error:`` line and exit 1."""
    _quiet_tensorflow()
    _configure_s3(args)
    from reader.info import DatasetNotFoundError

    try:
        return act(args)
    except (DatasetNotFoundError, ValueError, *also) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def inspect(argv: Sequence[str]) -> int:
    """``python -m converter inspect OUT [--grid FILE.png]``."""
    parser = _dataset_command(
        "inspect", "Show classes by split, shard sizes, rejected inputs by reason and content duplicates.")
    parser.add_argument("--grid", default=None, help="also write a contact sheet of sample images to this PNG "
                        "(with their boxes and class names, class masks, or class names)")
    parser.add_argument("--split", default=None, help="split of the contact sheet (default: the first)")
    parser.add_argument("--per-class", type=int, default=8, help="images per class on the sheet; objects, masks, "
                        "several labels: its columns (default: %(default)s)")
    args = parser.parse_args(argv)
    _configure_logging(verbose=False)
    _quiet_tensorflow()
    _configure_s3(args)
    from reader.info import DatasetNotFoundError, dataset_info
    from reader.inspect import check_sheet_path, contact_sheet, summarize

    try:
        if args.grid:
            check_sheet_path(args.grid)
        if args.split:
            dataset_info(args.out).split(args.split)  # fail before printing anything
        print(summarize(args.out))
        if args.grid:
            print(f"contact sheet: {contact_sheet(args.out, args.grid, args.split, args.per_class)}")
    except (DatasetNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def reindex(argv: Sequence[str]) -> int:
    """``python -m converter reindex OUT [--all]``: exit 0 when every shard has a sound record index."""
    parser = _dataset_command(
        "reindex", "Rebuild the record index (<shard>.idx) of every shard whose index is missing or damaged, from "
        "the shard itself, once its size and SHA-256 match the manifest. A dataset copied without its .idx files "
        "reads correctly anyway, but starts inside a shard (streams, resuming) then read through the records "
        "before them.")
    parser.add_argument("--all", action="store_true", help="rebuild every index, not only the missing or damaged")

    def fix(args: argparse.Namespace) -> int:
        from reader.record_index import rebuild

        result = rebuild(args.out, every=args.all)
        print(result.format())
        return 1 if result.failed else 0

    return _on_dataset(parser.parse_args(argv), fix)


def tfds_metadata(argv: Sequence[str]) -> int:
    """``python -m converter tfds-metadata OUT``: make OUT readable by ``tfds.builder_from_directory``."""
    parser = _dataset_command(
        "tfds-metadata", "Write TensorFlow Datasets' metadata (dataset_info.json, features.json, the label list) "
        "into a converted dataset, so tfds.builder_from_directory(OUT) reads it. Needs tensorflow-datasets.")

    def write(args: argparse.Namespace) -> int:
        from reader.tfds_metadata import write_tfds_metadata

        names = write_tfds_metadata(args.out)
        print(f"wrote {', '.join(names)} into {args.out}; read it with tfds.builder_from_directory({args.out!r})")
        return 0

    return _on_dataset(parser.parse_args(argv), write, also=(ImportError,))


def report(argv: Sequence[str]) -> int:
    """``python -m converter report OUT [--dest DIR] [--open]``: the dataset's HTML report and report.json."""
    _configure_logging(verbose=False)
    _quiet_tensorflow()
    from reader.report import main as report_main

    return report_main(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the process exit status.

    ``python -m converter --src ...`` (or ``convert --src ...``) converts;
    ``verify OUT`` and ``inspect OUT`` check and describe a dataset.
    """
    # First, before Beam or TensorFlow load (seconds): a signal at any moment is one line and an exit status.
    interrupt.install(exit_message="{verb}")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "convert"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    try:
        return {"convert": convert, "verify": verify, "inspect": inspect, "reindex": reindex,
                "report": report, "card": card_main, "tfds-metadata": tfds_metadata}[command](rest)
    except KeyboardInterrupt as err:  # before or after the run itself (while loading, verifying...)
        stop = err if isinstance(err, interrupt.Interrupted) else interrupt.Interrupted(signal.SIGINT)
        with contextlib.suppress(OSError):
            print("\n" + interrupt.exit_line(stop.signum), file=sys.stderr)
        return stop.exit_status
