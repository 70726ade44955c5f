"""The rows of a Hugging Face dataset as items: a row's locator, and the workers' reader of its image bytes.

In:  a cell locator (``q:GROUP:ROW:COLUMN:FILE``: where a row's image is), in the order a part lists them.
Out: the image's bytes, each row group's image column read once; or a :class:`CellError` naming the file,
     row group and row (``missing-image``, ``corrupt-parquet``).

A row without bytes names a file beside its Parquet file (``datasets`` writes such rows), or, with
``--local-paths``, an absolute path of this machine (``datasets``' ``to_parquet`` of local files).
"""

from __future__ import annotations

import contextlib
import posixpath
from typing import Optional

from beam_jobs.files.filesystems import FileSystems
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.hub.hub_files import full_path
from beam_jobs.sources.hub.hub_tables import ArrowNotLocalError, first_line, open_table, read_errors

_LOCATOR = "q"  # a cell's locator kind, beside archive_members' "a", "w" and "!"

# A row of no bytes and a path of the machine that wrote the file: read with --local-paths (the error line says so).
ABSOLUTE_PATH = "absolute-path"


class CellError(archive_members.UnreadableItem):
    """A row whose image cannot be had: ``reason`` is the rejection's (``missing-image``...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail, reason)


def cell_locator(file: str, row_group: int, row: int, column: str) -> str:
    """The text that locates one row's image in ``file`` (relative to SRC)."""
    return f"{_LOCATOR}:{row_group}:{row}:{column}:{file}"


def is_cell(source: str) -> bool:
    return source.startswith(_LOCATOR + ":")


def parse_cell(source: str) -> tuple[str, int, int, str]:
    """``(file, row group, row, column)`` of a :func:`cell_locator`."""
    _, group, row, column, file = source.split(":", 4)
    return file, int(group), int(row), column


class CellReader:
    """Reads rows' images for one chunk of work: each row group's image column read once, then served row by row.

    A part lists a file's rows in order, so a chunk reads each row group once
    (by ranged reads: only that column's chunks). Memory: one row group's images.
    Each file is opened once for the chunk (its footer read once), kept open
    until :meth:`close`, as archives are for their members.
    """

    def __init__(self, src: str, local_paths: bool = False) -> None:
        self._src, self._local_paths = src, local_paths
        self._group: tuple[Optional[tuple[str, int, str]], list, list] = (None, [], [])
        self._tables: dict[str, object] = {}
        self._open = contextlib.ExitStack()

    def close(self) -> None:
        self._tables = {}
        self._open.close()

    def read(self, source: str) -> bytes:
        """The image bytes of the row ``source`` locates.

        Raises:
          CellError: the row has no image (``missing-image``), or its file cannot be read (``corrupt-parquet``).
        """
        file, group, row, column = parse_cell(source)
        if self._group[0] != (file, group, column):
            self._group = ((file, group, column), *self._load(file, group, column))
        images, paths = self._group[1], self._group[2]
        if row >= len(images):
            raise CellError("corrupt-parquet", f"{file} row group {group} has no row {row}")
        if images[row] is not None:
            return images[row]
        return self._beside(file, paths[row], group, row)

    def group_rows(self, file: str, group: int, column: str) -> int:
        """The rows of ``file``'s row ``group`` (read as :meth:`read` reads it; raises as it raises), so an update
        can digest a whole group's cells once (:mod:`beam_jobs.sources.source_stamps`)."""
        if self._group[0] != (file, group, column):
            self._group = ((file, group, column), *self._load(file, group, column))
        return len(self._group[1])

    def _load(self, file: str, group: int, column: str) -> tuple[list, list]:
        try:
            table = self._tables.get(file)
            if table is None:
                table = self._tables[file] = self._open.enter_context(open_table(self._src, file))
            images, paths = table.group(group, [f"{column}.bytes", f"{column}.path"])
        except ArrowNotLocalError:
            raise
        except read_errors() as err:
            raise CellError("corrupt-parquet", f"{file} row group {group}: {first_line(err)}") from err
        return images, paths

    def _beside(self, file: str, path: Optional[str], group: int, row: int) -> bytes:
        """A row whose bytes are null: the file its ``path`` names beside the Parquet file (``datasets`` writes those)."""
        where = f"{file or posixpath.basename(self._src)} row group {group} row {row}"
        if path and path.startswith("/"):  # datasets' to_parquet of local image files: their absolute paths
            if not self._local_paths:
                raise CellError(ABSOLUTE_PATH, f"{where}: no image bytes, only the absolute path {path!r}; "
                                "pass --local-paths to read it from this machine")
            try:
                with open(path, "rb") as handle:
                    return handle.read()
            except OSError as err:
                raise CellError("missing-image", f"{where}: no image bytes, and {path} cannot be read: "
                                f"{err.strerror}") from None
        if not path or ".." in path.split("/"):
            raise CellError("missing-image", f"{where}: no image bytes" + (f" and the path {path!r} is not "
                                                                         "relative to its file" if path else ""))
        folder = posixpath.dirname(file)
        target = full_path(self._src, posixpath.join(folder, path) if folder else path)
        try:
            with FileSystems.open(target) as handle:
                return handle.read()
        except OSError:
            raise CellError("missing-image", f"{where}: no image bytes, and {path} is not beside the file") from None
