"""The report's pass over a dataset's records tables: its figures from their footers, and only the drawn records read.

In: each split's records table (:mod:`record_files.records_table`, opened by :func:`reader.info.open_records_table`),
the classes given a contact sheet and their room, and the paths of the duplicate images shown.
Out: :class:`Pass`, what :func:`reader.tools.report.one_pass`'s scan of every record gives, the same figures and the same
tiles: the figures are the ones the converter summed per shard into each table's footer; a contact sheet's records
are found from the ``classes`` column, a duplicate's from the ``path`` column (a row group at a time, stopping once
every sheet is full and every image found), and only those records are read, each by one seek to its ``offset``.
:class:`SheetTiles` is the contact sheets both passes fill (the classes that get one, their room, the fonts).

Cost: the footers, the class and path columns up to where the last drawn record is, and the drawn records: a
1M-record dataset reports in seconds, in memory flat in N (one row group, about 64k rows, at a time). A
segmentation dataset's classes are in its masks, which the table does not hold: its sheets read the first
records' masks, as the scan does (at most ``ReportOptions.masks_read``).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
import struct
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf
from PIL import Image

import record_schema
from reader import storage
from reader.tools.contact_sheet import LabelFonts, mask_classes, record_tile, split_features
from reader.info import DatasetInfo
from reader.tools.report_options import ReportOptions
from record_files.record_stats import SplitStats
from record_files.records_table import RecordsTable
from record_files.tfrecord import FOOTER_BYTES, HEADER_BYTES, FrameError, read_frames


@dataclasses.dataclass
class Pass:
    """What a pass over the records gives: stats per split, contact-sheet tiles per class id, thumbnails of
    duplicates by path, how many classes got no sheet, and how many segmentation masks were decoded to file
    their records under the classes they hold."""

    splits: dict[str, SplitStats]
    sheets: dict[int, list[Image.Image]]
    thumbs: dict[str, Image.Image]
    sheet_classes_left: int
    masks_read: int = 0
    scanned: bool = False  # every record read (no records tables), not the tables' figures


def sheet_classes(info: DatasetInfo, options: ReportOptions) -> tuple[list[int], list[int]]:
    """``(drawn, sheet_ids)``: the classes that could have a contact sheet, and the first ones that get one."""
    named = [label for label, name in enumerate(info.classes) if name or info.task != record_schema.TASK_OBJECTS]
    segmentation = info.task == record_schema.TASK_SEGMENTATION
    drawn = [label for label in named if not (segmentation and info.classes[label].strip().lower() in (
        "background", "_background_"))]  # a mask's background is left clear: no sheet of its own
    return drawn, drawn[:options.max_sheet_classes]


class SheetTiles:
    """The contact sheets a pass fills, set up once for both passes: the classes that get one
    (:func:`sheet_classes`), each with room for ``options.per_class`` tiles, and the fonts tiles are drawn in."""

    def __init__(self, info: DatasetInfo, options: ReportOptions) -> None:
        self.info, self.options = info, options
        self.drawn, self.ids = sheet_classes(info, options)
        self.room = {class_id: options.per_class for class_id in self.ids}
        self.sheets: dict[int, list[Image.Image]] = collections.defaultdict(list)
        self.fonts, self.tag_fonts = LabelFonts(), LabelFonts(size=11)

    def has_room(self) -> bool:
        return any(self.room.values())

    def file(self, feature, classes) -> None:
        """The record's tile (drawn once) under each of ``classes`` that has room left, in order, once each."""
        needing = [c for c in dict.fromkeys(classes) if self.room.get(c, 0) > 0]
        if needing:
            tile = record_tile(self.info, feature, self.options.tile, self.fonts, self.tag_fonts)
            for class_id in needing:
                self.sheets[class_id].append(tile)
                self.room[class_id] -= 1

    def finish(self) -> tuple[dict[int, list[Image.Image]], int]:
        """The tiles by class id, and how many classes got no sheet; a warning names what no font draws."""
        missing = self.fonts.missing | self.tag_fonts.missing
        if missing:
            logging.getLogger("reader.tools.report").warning(
                "the report's contact sheets draw %s as boxes: no installed font has them", " ".join(sorted(missing)))
        return dict(self.sheets), max(len(self.drawn) - len(self.ids), 0)


# A record to read: (split's place in the manifest, shard, index in the shard) -> (offset, classes it fills,
# path it shows or "").
_Key = tuple[int, int, int]


def table_pass(info: DatasetInfo, options: ReportOptions, wanted_paths: set[str],
               tables: dict[str, RecordsTable]) -> Pass:
    """The report's figures and drawings from ``tables`` (one per split of ``info``), reading only drawn records.

    Raises:
      ValueError: a drawn record is damaged (naming the shard and record), or a table's footer has no figures.
    """
    tiles = SheetTiles(info, options)
    splits = {name: tables[name].stats(name) for name in info.splits}
    segmentation = info.task == record_schema.TASK_SEGMENTATION
    room = np.zeros(max(len(info.classes), 1), np.int64)
    room[tiles.ids] = 0 if segmentation else options.per_class  # a mask's classes are not in the table
    picks: dict[_Key, list] = {}
    wanted = set(wanted_paths)
    for place, name in enumerate(info.splits):
        if not room.any() and not wanted:
            break
        _find(tables[name], place, room, wanted, picks)
    thumbs: dict[str, Image.Image] = {}
    masks_read = _mask_sheets(info, options, tiles) if segmentation else 0
    # A table's shard is its file's place in the manifest: a masked file is one shard, however many runs.
    shards = [list(dict.fromkeys(shard.path for shard in split.shards)) for split in info.splits.values()]
    for (place, shard, index), (offset, classes, path) in sorted(picks.items()):
        feature = _record_at(info, shards[place][shard], offset, index)
        tiles.file(feature, classes)  # each class's first records: never past its room
        if path:
            thumbs[path] = thumbnail(feature, options.thumb)
    sheets, left = tiles.finish()
    return Pass(splits, sheets, thumbs, left, masks_read)


def _find(table: RecordsTable, place: int, room: np.ndarray, wanted: set[str], picks: dict[_Key, list]) -> None:
    """The records of one split to draw: for each class with room, its first records in order (``room`` taken
    from as they are found), and the records whose path is ``wanted`` (removed from it as they are found)."""
    columns = ["shard", "index", "offset"] + (["classes"] if room.any() else []) + (["path"] if wanted else [])
    for group in table.row_groups(columns):
        shard, index, offset = (group.column(name).to_numpy() for name in ("shard", "index", "offset"))
        if "classes" in columns and room.any():
            for row, class_id in _first_rows(group.column("classes").combine_chunks(), room):
                picks.setdefault((place, int(shard[row]), int(index[row])), [int(offset[row]), [], ""])[1].append(
                    class_id)
        if "path" in columns and wanted:
            paths = group.column("path")
            for row in np.flatnonzero(pc.is_in(paths, value_set=pa.array(sorted(wanted))).to_numpy(
                    zero_copy_only=False)):
                path = paths[int(row)].as_py()
                wanted.discard(path)
                picks.setdefault((place, int(shard[row]), int(index[row])), [int(offset[row]), [], ""])[2] = path
        if not room.any() and not wanted:
            return


def _first_rows(classes: pa.ListArray, room: np.ndarray) -> list[tuple[int, int]]:
    """``(row, class id)`` of each class's first ``room[class]`` rows holding it (rows of this row group, each
    class once a row), taken from ``room``; in class order, then row order."""
    if classes.offset:
        classes = pa.concat_arrays([classes])
    starts = classes.offsets.to_numpy()
    values = classes.values.to_numpy(zero_copy_only=False)[starts[0]:starts[-1]].astype(np.int64)
    rows = np.repeat(np.arange(len(classes), dtype=np.int64), np.diff(starts))
    inside = (values >= 0) & (values < len(room))
    rows, values = rows[inside], values[inside]
    needed = room[values] > 0
    rows, values = rows[needed], values[needed]
    if not rows.size:
        return []
    keys = np.sort(values * len(classes) + rows)  # by class then row
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]  # each (class, row) once (np.unique hashes: slow)
    class_of, row_of = keys // len(classes), keys % len(classes)
    rank = np.arange(len(keys)) - np.searchsorted(class_of, class_of, "left")
    keep = rank < room[class_of]
    class_of, row_of = class_of[keep], row_of[keep]
    room -= np.bincount(class_of, minlength=len(room))
    return list(zip(row_of.tolist(), class_of.tolist()))


def _record_at(info: DatasetInfo, path: str, offset: int, index: int):
    """Record ``index`` of the shard at ``path``, whose frame starts at ``offset``: its parsed features (both CRCs
    checked)."""
    try:
        header = storage.read_range(path, offset, HEADER_BYTES)
        (length,) = struct.unpack("<Q", header[:8]) if len(header) == HEADER_BYTES else (0,)
        rest = storage.read_range(path, offset + HEADER_BYTES, length + FOOTER_BYTES) if length else b""
        frame = next(read_frames(io.BytesIO(header + rest), path, index, offset), None)
        if frame is None:
            raise FrameError("the records table points past the end of the shard", index, path)
    except FrameError as err:
        raise ValueError(f"cannot write the report: {err}. python -m converter verify {info.data_dir} "
                         "checks every shard") from None
    return tf.train.Example.FromString(frame.data).features.feature


def _mask_sheets(info: DatasetInfo, options: ReportOptions, tiles: SheetTiles) -> int:
    """A segmentation dataset's sheets, as the scan draws them: its first records' masks decoded (at most
    ``options.masks_read``), each record filed under the classes its mask holds; the masks decoded."""
    masks_read = 0
    for feature in _first_records(info, options.masks_read):
        if not tiles.has_room():
            break
        masks_read += 1
        tiles.file(feature, mask_classes(info, feature))
    return masks_read


def _first_records(info: DatasetInfo, count: int) -> Iterator:
    """The parsed features of the dataset's first ``count`` records, in split and shard order."""
    for split in info.splits.values():
        for feature in split_features(info, split, "write the report"):
            if count <= 0:
                return
            count -= 1
            yield feature


def thumbnail(feature, side: int) -> Image.Image:
    """A record's image fitted into ``side`` pixels (decoded at a reduced scale where JPEG allows)."""
    with Image.open(io.BytesIO(feature[record_schema.IMAGE_ENCODED].bytes_list.value[0])) as image:
        image.draft("RGB", (side, side))
        thumb = image.convert("RGB")
    thumb.thumbnail((side, side))
    return thumb
