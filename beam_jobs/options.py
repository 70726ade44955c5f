"""Options of a conversion, as frozen dataclasses validated on construction.

The CLI builds these from flags; Python callers build them directly. Every
check raises ``ValueError`` naming the option (by its CLI spelling) and the bad
value, so a typo fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import posixpath
from typing import Optional, Union

from record_files.dataset_card import DatasetCard

DEFAULT_SHARDS = 64
AUTO = "auto"  # --shards auto
DEFAULT_QUALITY = 95
DEFAULT_SEED = 0
# The columns of an --annotations file: path, label, split.
ANNOTATION_COLUMNS = ("path", "label", "split")
# --archive-scan: who reads the tars' headers (beam_jobs.sources.archives.archive_scan).
ARCHIVE_SCANS = ("auto", "launcher", "workers")
# --annotation-frame: which frame boxes are in where an image's size cannot tell (beam_jobs.annotations.place).
ANNOTATION_FRAMES = ("auto", "stored", "upright")
# Larger than nearly any photograph (a 100 MP medium-format frame) yet small
# enough that one decode cannot exhaust a worker (300 MB of RGB). Pillow itself
# refuses images over ~179 MP as decompression bombs.
DEFAULT_MAX_PIXELS = 100_000_000
# Real collections carry a few broken files; more than 5% usually means the
# wrong folder or a broken copy, which should stop the run, not be published.
DEFAULT_MAX_BAD_FRACTION = 0.05
# --near-distance: perceptual hashes (64 bits) this many bits apart or fewer are near-duplicates. By default
# ("auto") the widest distance up to DEFAULT_NEAR_DISTANCE whose search compares at most
# beam_jobs.stages.perceptual_hash.MAX_COMPARISONS_PER_IMAGE pairs an image on average: 3 (four bands of 16 bits:
# about N**2 / 32,768 pairs) up to about 8 million images, 2 up to about 400 million, then 1, so the search stays
# linear in N (#56; 10, the release before, compared about N**2 / 10). Measured by bench/near_duplicates.py on
# planted copies of real photos: resized to half and re-encoded at quality 40 found 90-93% at 3 (100% at 6 and 10);
# crops mostly need more (docs/benchmarks.md). Wider distances are a flag away and warned of with the pairs they
# compare at the run's size.
DEFAULT_NEAR_DISTANCE = 3
MAX_NEAR_DISTANCE = 12  # beam_jobs.stages.perceptual_hash.MAX_DISTANCE: past it the search's bands are too narrow
OUT_SUFFIX = "-tfrecords"


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def default_out(src: str) -> str:
    """Default output folder: ``<SRC>-tfrecords`` beside SRC (never inside it).

    ``--src .`` or ``--src ..`` name their folder only once resolved: the
    default is then beside the resolved folder (``/data/imgs-tfrecords``), not a
    hidden ``.-tfrecords`` inside it.
    """
    if _is_local(src):
        normal = os.path.normpath(_local(src)) if src else ""
        if os.path.basename(normal) in ("", ".", ".."):
            normal = os.path.abspath(normal or ".")
        if normal in ("/", "") or os.path.basename(normal) == "":
            raise ValueError(f"--src {src!r} has no folder name to derive --out from; pass --out")
        return normal + OUT_SUFFIX
    stripped = src.rstrip("/")
    if stripped.endswith(":") or stripped.endswith(":/"):
        raise ValueError(f"--src {src!r} has no folder name to derive --out from; pass --out")
    return stripped + OUT_SUFFIX


def check_out_and_src(src: str, out: str) -> None:
    """OUT must not be SRC, nor inside it (later runs would ingest it as images), nor hold it."""
    if _is_local(src) and _is_local(out):
        real_src, real_out = os.path.realpath(_local(src)), os.path.realpath(_local(out))
    elif not _is_local(src) and not _is_local(out):
        real_src, real_out = posixpath.normpath(src.rstrip("/")), posixpath.normpath(out.rstrip("/"))
    else:
        return
    if real_out == real_src:
        raise ValueError(f"--out {out!r} must differ from --src {src!r}")
    if real_out.startswith(real_src.rstrip("/") + "/"):
        raise ValueError(
            f"--out {out!r} is inside --src {src!r}: later runs would read the dataset as images. "
            f"Put it beside the images, e.g. --out {default_out(src)}"
        )
    if real_src.startswith(real_out.rstrip("/") + "/"):
        raise ValueError(f"--src {src!r} is inside --out {out!r}: the output would replace the images")


@dataclasses.dataclass(frozen=True)
class EncodeOptions:
    """How each image is validated and, when needed, re-encoded.

    Attributes:
      quality: JPEG quality (1-100) for images that must be re-encoded.
      max_side: if set, images whose longer side exceeds it are downsized to it.
      max_pixels: images with more pixels are rejected before decoding
        (decompression bombs).
      min_side: if set, images whose shorter side is below it are rejected
        (TF Model Garden's crop op fails on 1-3 px images).
      local_paths: a Parquet row without image bytes may name an absolute path on this machine
        (``datasets``' ``to_parquet`` of local image files writes such rows), which workers then read.
        Off by default: a dataset from elsewhere must not make the converter read this machine's files.
      annotation_frame: ``--annotation-frame``: the frame an object dataset's boxes are in where the image's
        size cannot tell (EXIF orientations 2-4, a square image, normalized coordinates, no size given):
        ``stored`` (the pixels as the file holds them: COCO's tools, Model Garden's scripts), ``upright``
        (EXIF applied: CVAT, Label Studio, Roboflow, Ultralytics), or ``auto`` (each source's convention).
      keep_partial_images: ``--keep-partial-images``: an image with an object that has an extent but cannot be
        written (an unknown class, a box outside the image, a bad mask) is written without that object; by default
        it is rejected, naming the object (written without it, the object would train as background).
      perceptual_hash: take each accepted image's perceptual hash from the decode the validation does anyway
        (the near-duplicate search needs it); ``--near-distance off`` turns it off.
    """

    quality: int = DEFAULT_QUALITY
    max_side: Optional[int] = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    min_side: Optional[int] = None
    local_paths: bool = False
    annotation_frame: str = ANNOTATION_FRAMES[0]
    perceptual_hash: bool = True
    keep_partial_images: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise ValueError(f"--quality must be an integer in 1..100, got {self.quality!r}")
        if self.max_side is not None and (not isinstance(self.max_side, int) or self.max_side < 16):
            raise ValueError(f"--max-side must be an integer >= 16, got {self.max_side!r}")
        if self.min_side is not None and (not isinstance(self.min_side, int) or self.min_side < 1):
            raise ValueError(f"--min-side must be a positive integer, got {self.min_side!r}")
        if self.min_side is not None and self.max_side is not None and self.min_side > self.max_side:
            raise ValueError(f"--min-side {self.min_side} is larger than --max-side {self.max_side}")
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"--max-pixels must be a positive integer, got {self.max_pixels!r}")
        if self.annotation_frame not in ANNOTATION_FRAMES:
            raise ValueError(f"--annotation-frame must be one of {', '.join(ANNOTATION_FRAMES)}, got "
                             f"{self.annotation_frame!r}")


@dataclasses.dataclass(frozen=True)
class LabelMember:
    """What ``--label-member`` names: the member's extension, and the JSON field when it is ``json:FIELD``."""

    extension: str
    field: str = ""

    @classmethod
    def parse(cls, text: str) -> "LabelMember":
        """``cls``, ``txt``, ``json:FIELD`` (raises ValueError naming the flag otherwise)."""
        extension, _, field = text.partition(":")
        extension = extension.strip().lstrip(".").lower()
        if not extension or "/" in extension or (extension == "json") != bool(field.strip()):
            raise ValueError(f"--label-member takes an extension (cls, txt) or json:FIELD, got {text!r}")
        return cls(extension, field.strip())


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Everything a conversion needs besides the Beam pipeline options.

    Attributes:
      src: input folder: ``SRC/<class>/...`` or ``SRC/<split>/<class>/...``.
      out: output folder; defaults to ``<SRC>-tfrecords``.
      shards: shard count of the train split; other splits get a proportional
        count (see ``beam_jobs.planning.shard.plan_shard_counts``). ``"auto"``: each
        split's count from its bytes, TFDS's 64 MiB..1 GiB per shard
        (``beam_jobs.planning.shard.auto_shard_count``).
      val_fraction: fraction of each class carved out as a validation split of
        a single-split tree (0 disables).
      seed: salt of the keyed hash that orders the records.
      labels_file: optional file with one class name per line, pinning label ids.
      encode: per-image options.
      max_bad_fraction: the run fails, publishing nothing, when more than this
        fraction of the listed images is rejected.
      overwrite: replace an existing dataset in ``out`` once the new one is complete.
      annotations: a label file (CSV, TSV or JSON Lines of path, label[, split])
        listing the images under ``src`` instead of class folders.
      annotation_columns: the label file's names for the path, label and split
        columns (a Kaggle CSV's ``image,breed``, say).
      label_separator: the label file's label cells hold several class names separated by this
        (a multi-label dataset: records get ``image/class/label`` as a list).
      val_labels: a ground-truth file labelling a flat ``src/val/`` folder
        (ImageNet's ``LOC_val_solution.csv`` or one class per line).
      synsets: ``ID text`` per line: each class's text in the records (ImageNet's
        ``LOC_synset_mapping.txt``).
      label_member: WebDataset samples: each image's label is its sibling member
        of this extension (``cls``), or a field of its JSON member (``json:FIELD``);
        folder and archive names are then not classes.
      part_size: images per part, the unit of work of validation and of the
        ordering stage's memory (about 200 bytes per image); default: about
        1/64 of the images, within [128, 2**20]. It never changes the output.
      archive_scan: who reads the headers of the tars under ``src`` (a tar has
        no index: its headers are spread through it): ``"workers"``, spread
        over the run's workers; ``"launcher"``, this process, before they
        start; ``"auto"``: the workers when the tars hold 4 GiB or more. It
        never changes the output.
      near_distance: ``--near-distance``: images whose perceptual hashes differ in at most this many of
        their 64 bits are near-duplicates (``duplicates.jsonl``'s near groups); 0..12, or ``"auto"``: chosen by
        the number of images (:func:`beam_jobs.stages.perceptual_hash.auto_distance`), before the run plans
        its work, and recorded as chosen (the manifest's options and ``duplicates.near_threshold``).
      drop_leaks: ``--drop-leaks``: an image of an evaluation split (validation, test) that is a copy (exact
        or near) of an image in an earlier split (train, then validation) is not written; the manifest's
        ``duplicates.dropped`` lists each one.
      card: ``--card``, ``--license``, ``--citation``: what only the user knows of the dataset, for its
        Croissant card (``croissant.json``); never changes the shards.
    """

    src: str
    out: str = ""
    shards: int | str = DEFAULT_SHARDS
    val_fraction: float = 0.0
    seed: int = DEFAULT_SEED
    labels_file: Optional[str] = None
    encode: EncodeOptions = dataclasses.field(default_factory=EncodeOptions)
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
    overwrite: bool = False
    annotations: Optional[str] = None
    annotation_columns: tuple[str, ...] = ANNOTATION_COLUMNS
    label_separator: Optional[str] = None
    val_labels: Optional[str] = None
    synsets: Optional[str] = None
    part_size: Optional[int] = None
    label_member: Optional[str] = None
    archive_scan: str = "auto"
    # A Parquet dataset (Hugging Face's): which config, and which columns hold the image and the label.
    config: Optional[str] = None
    image_column: Optional[str] = None
    label_column: Optional[str] = None
    bbox_format: Optional[str] = None  # a Parquet dataset's objects: coco (default), pascal_voc or yolo boxes
    masks: bool = False  # COCO: each object's segmentation as a PNG mask in its record (pycocotools, .[masks])
    near_distance: Union[int, str] = AUTO
    drop_leaks: bool = False
    card: Optional[DatasetCard] = None

    def __post_init__(self) -> None:
        if not self.src:
            raise ValueError("--src is required: the folder holding one sub-folder per class")
        if not self.out:
            object.__setattr__(self, "out", default_out(self.src))
        check_out_and_src(self.src, self.out)
        self._check_annotation_columns()
        if self.label_separator is not None and (not self.annotations or not self.label_separator):
            raise ValueError("--label-separator splits the label cells of an --annotations file: give that file, "
                             "and a non-empty separator")
        given = [flag for flag, value in (("--annotations", self.annotations), ("--val-labels", self.val_labels),
                                          ("--label-member", self.label_member)) if value]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are ways to label images; give one")
        if self.label_member:
            LabelMember.parse(self.label_member)
        if self.bbox_format is not None and self.bbox_format not in ("coco", "pascal_voc", "yolo"):
            raise ValueError(f"--bbox-format must be coco, pascal_voc or yolo, got {self.bbox_format!r}")
        if self.archive_scan not in ARCHIVE_SCANS:
            raise ValueError(f"--archive-scan must be one of {', '.join(ARCHIVE_SCANS)}, got {self.archive_scan!r}")
        if self.val_labels and self.val_fraction:
            raise ValueError("--val-labels labels the validation folder; --val-fraction would carve another")
        if self.shards != AUTO and (not isinstance(self.shards, int) or isinstance(self.shards, bool)
                                    or self.shards < 1):
            raise ValueError(f"--shards must be a positive integer or 'auto', got {self.shards!r}")
        if not (isinstance(self.val_fraction, (int, float)) and 0.0 <= self.val_fraction < 1.0):
            raise ValueError(f"--val-fraction must be in [0, 1), got {self.val_fraction!r}")
        if self.part_size is not None and (not isinstance(self.part_size, int) or self.part_size < 1):
            raise ValueError(f"--part-size must be a positive integer, got {self.part_size!r}")
        if self.near_distance != AUTO and (not isinstance(self.near_distance, int)
                                           or isinstance(self.near_distance, bool)
                                           or not 0 <= self.near_distance <= MAX_NEAR_DISTANCE):
            raise ValueError(f"--near-distance must be 'auto' or an integer in 0..{MAX_NEAR_DISTANCE} (bits of the "
                             f"64-bit perceptual hash), got {self.near_distance!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--seed must be a non-negative integer, got {self.seed!r}")
        if not (
            isinstance(self.max_bad_fraction, (int, float))
            and math.isfinite(self.max_bad_fraction)
            and 0.0 <= self.max_bad_fraction <= 1.0
        ):
            raise ValueError(f"--max-bad-fraction must be in [0, 1], got {self.max_bad_fraction!r}")

    def _check_annotation_columns(self) -> None:
        columns = tuple(self.annotation_columns)
        if columns != ANNOTATION_COLUMNS and not self.annotations:
            raise ValueError("--annotation-columns names the columns of an --annotations file; give that file too")
        if not 2 <= len(columns) <= 3 or not all(isinstance(c, str) and c.strip() for c in columns) \
                or len(set(columns)) != len(columns):
            raise ValueError("--annotation-columns takes two or three different column names, PATH,LABEL[,SPLIT] "
                             f"(e.g. image,breed), got {','.join(map(str, columns))!r}")
        object.__setattr__(self, "annotation_columns", columns + ANNOTATION_COLUMNS[len(columns):])

    def to_json(self) -> dict:
        """The options as recorded in the manifest (plain JSON types)."""
        return dataclasses.asdict(self)
