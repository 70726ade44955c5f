"""The conversion's flags, in groups, and the options they make.

In: ``python -m converter [convert]``'s arguments. Out: an ``argparse`` parser (:func:`build_convert_parser`:
the flags grouped by what they are for: the conversion, then one group a source kind, image policy, duplicates
and leaks, the card, advanced) and, from its namespace, :class:`beam_jobs.options.ConvertOptions`
(:func:`convert_options`) with the warnings the old spellings earn (:func:`deprecations`).

Old spellings keep working for one release: each sets what its new spelling sets and leaves a warning naming
it (:data:`DEPRECATED`), which the command logs once logging is set up. Nothing here imports Beam or
TensorFlow: ``--help`` and a usage error cost the interpreter's start and argparse.
"""

from __future__ import annotations

import argparse
from typing import Callable, Optional, Union

from beam_jobs import options as opts
from converter.card import add_card_flags
from record_files.dataset_card import card_from_flags

NEAR_OFF = "off"  # --near-distance off: no perceptual hash, no near search (EncodeOptions.perceptual_hash=False)

DESCRIPTION = """\
Convert images into sharded TFRecord files of tf.train.Example records. SRC is read as the layout it holds:
class folders (SRC/<class>/**/<image>, optionally under train/validation/test folders), a label file (CSV, TSV,
JSON Lines), ImageNet as it ships, WebDataset tars, a Hugging Face dataset (Parquet, Arrow), COCO, Pascal VOC,
YOLO and CVAT exports, or images beside masks; any folder, SRC too, may be a tar or zip archive."""

# The old spellings: flag -> the warning it earns, naming what to type instead (removed the release after).
DEPRECATED = {
    "--no-near-duplicates": "--no-near-duplicates is deprecated: use --near-distance off (the same run); "
                            "the old spelling goes in the next release",
    "--dali-index": "--dali-index is deprecated and does nothing: every shard's record index (<shard>.idx, "
                    "NVIDIA DALI's format) is always written; drop the flag",
}


def word_or_int(*words: str, expected: str, low: Optional[int] = None,
                high: Optional[int] = None) -> Callable[[str], Union[int, str]]:
    """An argparse ``type``: one of ``words`` (any case) or an integer (within ``low..high`` when given); else
    an error saying ``expected``, which argparse prefixes with the flag."""

    def parse(text: str) -> Union[int, str]:
        word = text.strip().lower()
        if word in words:
            return word
        try:
            number = int(text)
        except ValueError:
            number = None
        if number is None or (low is not None and number < low) or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return number

    return parse


class _Deprecated(argparse.Action):
    """An old spelling taking no value: records itself in ``namespace.deprecated`` (for :func:`deprecations`)."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        given = getattr(namespace, "deprecated", [])
        namespace.deprecated = given + [option_string] if option_string not in given else given


def build_convert_parser(epilog: str = "") -> argparse.ArgumentParser:
    """The flags of a conversion in groups, each with its default in the help."""
    parser = argparse.ArgumentParser(prog="python -m converter", description=DESCRIPTION, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.set_defaults(deprecated=[])
    _conversion_flags(parser.add_argument_group("the conversion"))
    _source_flags(parser)
    _image_flags(parser.add_argument_group("image policy"))
    _duplicate_flags(parser.add_argument_group("duplicates and leaks"))
    add_card_flags(parser)
    _advanced_flags(parser.add_argument_group("advanced (never change the output)"))
    for flag in DEPRECATED:
        parser.add_argument(flag, action=_Deprecated)
    return parser


def _conversion_flags(group) -> None:
    add = group.add_argument
    add("--src", required=True, help="input folder or archive, in any layout above: SRC/<class>/**/<image>, "
        "SRC/<split>/<class>/**/<image>, or one of the layouts of the groups below")
    add("--out", default="", metavar="DIR", help=f"output folder (default: SRC with '{opts.OUT_SUFFIX}' appended, beside SRC)")
    add("--shards", metavar="N|auto", default=opts.DEFAULT_SHARDS,
        type=word_or_int(opts.AUTO, expected="a positive integer or 'auto'"),  # its range: the options' check
        help="shards of the train split; other splits get ceil(shards * their size / train size); 'auto': each "
        "split's count from its bytes, 64 MiB..1 GiB per shard as TFDS sizes them (default: %(default)s; "
        "never more shards than images)")
    add("--val-fraction", type=float, metavar="F", default=0.0,
        help="carve this fraction of each class out of a single-split tree as a validation split "
        "(default: %(default)s, off)")
    add("--seed", type=int, metavar="S", default=opts.DEFAULT_SEED,
        help="salt of the keyed hash that orders the records and carves validation (default: %(default)s)")
    add("--labels", dest="labels_file", default=None, metavar="FILE",
        help="the classes, one name a line. Where the source leaves the numbering to you, their ids in its "
        "order: class folders, label files, ImageNet, WebDataset from 0 (default: the names sorted); Pascal VOC, "
        "CVAT from 1 (0 is the background); masks beside images: the pixel values 0, 1, ... it names. Where the "
        "source numbers its classes itself (COCO, YOLO, the Hub): a check, a list that differs is refused")
    add("--overwrite", action="store_true",
        help="replace a dataset already in --out, once the new one is complete (default: refuse)")
    add("--update", action="store_true",
        help="write what changed in --src since --out's latest version as a new version: new and changed images "
        "into new shards, unchanged shards reused, splits and class ids kept (class folders; same flags as the "
        "conversion that made --out). Nothing changed: no version written")
    add("--rehash", action="store_true",
        help="with --update: read every file and compare its bytes, not its size and modification time")


def _source_flags(parser: argparse.ArgumentParser) -> None:
    """One group a source kind (beam_jobs/sources/): the flags only that kind reads."""
    add = parser.add_argument_group("label files (CSV, TSV, JSON Lines) and COCO JSON").add_argument
    add("--annotations", default=None, metavar="FILE",
        help="a label file listing the images instead of class folders: CSV/TSV with a header, or JSON Lines, "
        "with columns path, label and optionally split (train, validation/val, test), paths relative to --src; "
        "or a COCO instances JSON (objects) whose file_names are relative to --src")
    add("--annotation-columns", default=",".join(opts.ANNOTATION_COLUMNS), metavar="PATH,LABEL[,SPLIT]",
        help="the label file's names for the path, label and split columns, e.g. image,breed "
        "(default: %(default)s)")
    add("--label-separator", default=None, metavar="SEP",
        help="several labels an image: the label file's label cells hold class names separated by SEP "
        "(' ' for Planet's tags); records get image/class/label as a list")

    add = parser.add_argument_group("ImageNet as it ships").add_argument
    add("--val-labels", default=None, metavar="FILE",
        help="the labels of a flat SRC/val/ folder (LOC_val_solution.csv, or one class id per line in file-name "
        "order); train stays SRC/train/<class>/")
    add("--synsets", default=None, metavar="FILE",
        help="'ID text' per line: each class's text in the records (ImageNet's LOC_synset_mapping.txt)")

    add = parser.add_argument_group("WebDataset (img2dataset's tars)").add_argument
    add("--label-member", default=None, metavar="EXT|json:FIELD",
        help="label each image by its sibling member with the same key, the text of <key>.EXT (cls) or a field "
        "of <key>.json; folder and archive names are then not classes")

    add = parser.add_argument_group("the Hub's Parquet (Hugging Face datasets)").add_argument
    add("--config", default=None, metavar="NAME", help="a dataset with several configs: the one to convert")
    add("--image-column", default=None, metavar="NAME",
        help="the image column (default: the one column of the Hub's Image type)")
    add("--label-column", default=None, metavar="NAME",
        help="the label column (default: its one ClassLabel column; a column of text or, with --labels, of "
        "integers)")
    add("--bbox-format", default=None, choices=("coco", "pascal_voc", "yolo"),
        help="the objects column's bbox is [x, y, w, h] pixels (coco, the default), [xmin, ymin, xmax, ymax] "
        "pixels (pascal_voc) or [cx, cy, w, h] normalized (yolo)")
    add("--local-paths", action="store_true",
        help="rows that hold no image bytes but absolute paths (datasets' to_parquet of local files): read those "
        "files from this machine (off: data from elsewhere never reads this machine's files)")

    add = parser.add_argument_group("objects (COCO, Pascal VOC, YOLO, CVAT, the Hub's objects)", (
        "COCO's person_keypoints_<set>.json and captions_<set>.json beside instances_<set>.json are read too: each\n"
        "object's K keypoints (image/object/keypoint/*; K, the points' names and the flip their names give are in\n"
        "manifest.json's \"keypoints\", read with reader.ObjectTargets(keypoints=\"auto\")) and each image's captions\n"
        "(image/caption)")).add_argument
    add("--masks", action="store_true",
        help="COCO: write each object's segmentation (polygons, a crowd's RLE) as a PNG mask in its record "
        "(image/object/mask, Model Garden's include_mask; needs pip install '.[masks]'); YOLO: each polygon "
        "line's, the same way; Pascal VOC: the "
        "segmentation images with their class masks, and each object's from SegmentationObject/")
    add("--annotation-frame", choices=opts.ANNOTATION_FRAMES, default=opts.ANNOTATION_FRAMES[0],
        help="the frame boxes are in where an image's size cannot tell (EXIF orientations 2-4, square "
        "images, normalized coordinates): stored (pixels as the file holds them: COCO's tools) or upright (EXIF "
        "applied: CVAT, Label Studio, Roboflow, YOLO); auto: each source's convention (default: %(default)s)")
    add("--keep-partial-images", action="store_true",
        help="write an image without its objects that cannot be written (an unknown class, a box outside "
        "the image, a bad mask) instead of rejecting the image (default: rejected, naming the object)")

    add = parser.add_argument_group("archives (tar, zip: wherever a folder is read)").add_argument
    add("--archive-scan", choices=opts.ARCHIVE_SCANS, default="auto",
        help="who reads the headers of the tars under --src (a tar has no index; its headers are spread through "
        "it): the run's workers, or this process before they start; auto: the workers when the tars hold 4 GiB "
        "or more (default: %(default)s; the output is the same)")


def _image_flags(group) -> None:
    add = group.add_argument
    add("--max-side", type=int, default=None, metavar="PX",
        help="downsize images whose longer side exceeds this many pixels (default: keep sizes)")
    add("--min-side", type=int, default=None, metavar="PX",
        help="reject images whose shorter side is below this many pixels (default: keep all; the summary "
        "reports images under 32 px)")
    add("--quality", type=int, metavar="Q", default=opts.DEFAULT_QUALITY,
        help="JPEG quality for images that must be re-encoded (default: %(default)s)")
    add("--max-pixels", type=int, metavar="N", default=opts.DEFAULT_MAX_PIXELS,
        help="reject images with more pixels than this, before decoding (default: %(default)s)")
    add("--max-bad-fraction", type=float, metavar="F", default=opts.DEFAULT_MAX_BAD_FRACTION,
        help="fail and publish nothing when more than this fraction of the images is rejected "
        "(default: %(default)s)")


def _duplicate_flags(group) -> None:
    add = group.add_argument
    add("--near-distance", default=opts.AUTO, metavar="auto|BITS|off",
        type=word_or_int(opts.AUTO, NEAR_OFF, low=0, high=opts.MAX_NEAR_DISTANCE,
                         expected=f"'auto', 'off' or an integer in 0..{opts.MAX_NEAR_DISTANCE} (bits)"),
        help="images whose 64-bit perceptual hashes differ in at most BITS bits are near-duplicates, listed in "
        f"duplicates.jsonl with their distance (0..{opts.MAX_NEAR_DISTANCE}); auto: {opts.DEFAULT_NEAR_DISTANCE} "
        "up to about 8 million images, then 2, then 1 past about 400 million, so that the search stays linear "
        "in the images; off: no perceptual hash and no near search, identical files still found (was "
        "--no-near-duplicates) (default: %(default)s)")
    add("--drop-leaks", action="store_true",
        help="do not write the validation and test images that are byte-identical copies of an image of an "
        "earlier split, or within --near-distance of a training image (a direct pair: an image linked to the "
        "training split only through other near images is kept); dropped.jsonl lists each with its partner "
        "and distance")


def _advanced_flags(group) -> None:
    add = group.add_argument
    add("--part-size", type=int, default=None, metavar="N",
        help="images per unit of work (validation, and the ordering stage's memory: ~200 bytes per image); "
        "never changes the output (default: about 1/64 of the images, within 128..1048576)")
    add("--no-progress", dest="progress", action="store_false",
        help="no progress bars (on a terminal) or progress lines (into a pipe or a log file)")
    add("-v", "--verbose", action="store_true", help="log every rejected file and Beam's own messages")


def deprecations(args: argparse.Namespace) -> list[str]:
    """The warnings of the old spellings ``args`` holds, in the order given."""
    return [DEPRECATED[flag] for flag in args.deprecated]


def near_search(args: argparse.Namespace) -> tuple[Union[int, str], bool]:
    """``(near_distance, perceptual_hash)`` from ``--near-distance`` (and its old ``--no-near-duplicates``).

    ``off`` is the old spelling's run exactly: no hash, and the distance left at its default, so both
    spellings give the same options and the same manifest. The old spelling beside a distance is refused.
    """
    if "--no-near-duplicates" in args.deprecated:
        if args.near_distance not in (opts.AUTO, NEAR_OFF):
            raise ValueError(f"--no-near-duplicates and --near-distance {args.near_distance} disagree: give "
                             "--near-distance alone (off: no near search)")
        return opts.AUTO, False
    if args.near_distance == NEAR_OFF:
        return opts.AUTO, False
    return args.near_distance, True


def convert_options(args: argparse.Namespace) -> opts.ConvertOptions:
    """The parsed flags as options; a ValueError names the flag at fault."""
    near_distance, perceptual_hash = near_search(args)
    return opts.ConvertOptions(
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
                                  perceptual_hash=perceptual_hash),
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
        near_distance=near_distance,
        drop_leaks=args.drop_leaks,
        card=card_from_flags(args.card, args.license, args.citation),
    )
