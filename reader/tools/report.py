"""``report``: a converted dataset as one HTML page a person reads in a browser, and the same figures as JSON.

In: a dataset folder (manifest.json, the shards, rejected.jsonl, duplicates.jsonl, croissant.json if any).
Out: ``report.html`` (self-contained: images inline, no script, nothing fetched) and ``report.json`` in the
folder of the version reported (the dataset folder for version 1, ``versions/<N>/`` for a version ``--update``
wrote, as its card), or in ``dest``; both name the version.

The figures come from what the conversion recorded: the manifest's counts and re-encodings, the rejections
and duplicate groups, and each split's records table, whose footer holds the figures the converter summed per
shard and whose columns find the few records drawn (a contact sheet's tiles, the thumbnails of duplicates
shown), the only records read (:mod:`reader.tools.report_tables`). A dataset converted before records tables is
scanned instead: one pass over every record that parses its features and decodes no image but those drawn
(:mod:`reader.tools.report_stats`); the page and report.json say so. Memory is bounded by the number of classes
shown, never by the number of images. Modules, in the order the data flows: :mod:`reader.tools.report_inputs`
(the files beside the shards), :mod:`reader.tools.report_tables` and :mod:`reader.tools.report_stats` (the two passes),
:mod:`reader.tools.report_figures` (matplotlib), :mod:`reader.tools.report_sections` (what each section says),
:mod:`reader.tools.report_html` (the page).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Optional

from PIL import Image

import record_schema
from reader import storage
from reader.tools import report_inputs, report_sections
from reader.tools.contact_sheet import mask_classes, split_features
from reader.info import DatasetInfo, dataset_info, latest_version, open_records_table
from reader.tools.report_options import ReportOptions
from reader.tools.report_stats import SplitStats
from reader.tools.report_tables import Pass, SheetTiles, table_pass, thumbnail
from record_files import versions
from record_files.croissant import CROISSANT_FILE

logger = logging.getLogger(__name__)

HTML_FILE, JSON_FILE = record_schema.REPORT_FILES


@dataclasses.dataclass(frozen=True)
class ReportPaths:
    """The files written."""

    html: str
    json: str


def write_report(data_dir: str, dest: Optional[str] = None, options: ReportOptions = ReportOptions(),
                 scan: bool = False, version: Optional[int] = None) -> ReportPaths:
    """Write ``report.html`` and ``report.json`` of the dataset in ``data_dir`` into ``dest`` (default: the
    version's folder: ``data_dir`` for version 1, ``data_dir/versions/<N>/`` after, so no version's report
    overwrites another's, and version 1's stays where it always was).

    The figures come from the splits' records tables and only the drawn records are read; a dataset without
    them (converted before records tables), or ``scan``, has every record read instead, and the page says so.
    ``version``: the version of a dataset that grows to report (default: the latest), its own rejections,
    duplicates and card with it.

    Raises:
      DatasetNotFoundError: no manifest in ``data_dir``.
      ValueError: ``dest`` is not a folder; a shard is damaged, or rejected.jsonl / duplicates.jsonl has a line
        that does not parse (each naming the file and the record or line).
      ImportError: matplotlib is not installed (``pip install ".[report]"``).
    """
    info = dataset_info(data_dir, version=version)
    dest = dest or (data_dir if info.version == versions.FIRST_VERSION
                    else os.path.join(data_dir, versions.version_dir(info.version)))
    if not storage.isdir(dest):
        raise ValueError(f"cannot write the report into {dest}: not a folder (create it, or leave out --dest)")
    rejections = report_inputs.read_rejections(info.version_file(record_schema.REJECTED_FILE),
                                               options.rejections_shown)
    duplicates = report_inputs.read_duplicates(info.version_file(record_schema.DUPLICATES_FILE),
                                               options.duplicate_groups_shown)
    wanted = {image["path"] for group in duplicates.shown for image in group["images"][:report_sections.GROUP_SHOWN]}
    passed = the_pass(info, options, wanted, scan)
    src = (info.manifest.get("options") or {}).get("src")
    rejected_thumbs = [report_inputs.source_thumbnail(src, entry.get("path", ""), options.thumb)
                       for entry in rejections.first]
    croissant = info.version_file(CROISSANT_FILE)
    findings = report_sections.Findings(
        info=info, splits=passed.splits, rejections=rejections, rejected_thumbs=rejected_thumbs,
        duplicates=duplicates, duplicate_thumbs=passed.thumbs, sheets=passed.sheets,
        sheet_classes_left=passed.sheet_classes_left, masks_read=passed.masks_read, options=options,
        croissant=_href(croissant, dest) if storage.exists(croissant) else None, scanned=passed.scanned,
        manifest=_href(info.version_file(record_schema.MANIFEST_FILE), dest),
        dataset_name=versions.named(data_dir, info.version, latest_version(data_dir)))
    page, figures = report_sections.render(findings)
    paths = ReportPaths(os.path.join(dest, HTML_FILE), os.path.join(dest, JSON_FILE))
    storage.write_bytes(paths.json, json.dumps(figures, indent=1, ensure_ascii=False).encode("utf-8"))
    storage.write_bytes(paths.html, page.encode("utf-8"))
    return paths


def _href(path: str, dest: str) -> str:
    """A link from a page in ``dest`` to ``path``: relative when both are local, else the path as it is."""
    if "://" in path or "://" in dest:
        return path
    return os.path.relpath(path, dest)


def one_pass(info: DatasetInfo, options: ReportOptions, wanted_paths: set[str]) -> Pass:
    """Every record of every split, read once: features counted, a few records drawn (a dataset without records
    tables: converted before them, or another tool's).

    Raises:
      ValueError: a shard is damaged (naming it and the record).
    """
    tiles = SheetTiles(info, options)
    segmentation = info.task == record_schema.TASK_SEGMENTATION
    masks_read = 0
    wanted = {path.encode("utf-8"): path for path in wanted_paths}
    thumbs: dict[str, Image.Image] = {}
    splits = {}
    for name, split in info.splits.items():
        stats = SplitStats(name)
        for feature in split_features(info, split, "write the report"):
            classes = stats.add(feature, info.task)
            if segmentation and masks_read < options.masks_read and tiles.has_room():
                classes, masks_read = mask_classes(info, feature), masks_read + 1  # the PNG decoded
            tiles.file(feature, classes)
            if wanted:
                filename = feature[record_schema.FILENAME].bytes_list.value[0] \
                    if record_schema.FILENAME in feature else b""
                if filename in wanted:
                    thumbs[wanted.pop(filename)] = thumbnail(feature, options.thumb)
        splits[name] = stats.finish()
    sheets, left = tiles.finish()
    return Pass(splits, sheets, thumbs, left, masks_read, scanned=True)


def the_pass(info: DatasetInfo, options: ReportOptions, wanted_paths: set[str], scan: bool = False) -> Pass:
    """The records tables' pass when every split has one (and ``scan`` is not asked for), else the scan of every
    record, logged: a dataset converted before records tables reports as before, more slowly, and so does a
    version an update wrote before updates wrote tables (``beam_jobs.update.tables`` writes each version's)."""
    tables = None if scan else {name: open_records_table(split) for name, split in info.splits.items()}
    if tables and all(table is not None for table in tables.values()):
        return table_pass(info, options, wanted_paths, tables)
    if not scan and info.version > versions.FIRST_VERSION:
        logger.warning("version %d of %s has no records tables (an update before records tables wrote it): the "
                       "report reads every record of every shard instead; the next --update writes its version's",
                       info.version, info.data_dir)
    elif not scan:
        logger.warning("%s has no records tables (converted before them): the report reads every record of every "
                       "shard; converting again writes them, and the report then reads only what it draws",
                       info.data_dir)
    return one_pass(info, options, wanted_paths)
