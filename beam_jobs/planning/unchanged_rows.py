"""The unchanged images' rows an update's comparison finds (:mod:`beam_jobs.planning.changes`), spilled to a file.

In:  :class:`record_files.versions.SourceRow` rows with their class ids now, added in path order.
Out: the same rows, re-iterable in that order, read back a block at a time.
"""

from __future__ import annotations

import marshal
from typing import BinaryIO, Iterator, Optional

from record_files.versions import SourceRow


class UnchangedRows:
    """The unchanged images' rows, each with its class ids now, in path order, re-iterable: spilled to a file in
    the scratch folder as the comparison finds them, so the launcher holds none of them (a version of a
    billion images holds a billion).

    Each row is stamped now (its size and modification time as listed); ``file`` "" is a rejected image.
    Written and read in blocks of :data:`_BLOCK` rows (one ``marshal`` call a row costs more than the row).
    """

    _BLOCK = 1024

    def __init__(self, path: str) -> None:
        self._path, self._count, self._block = path, 0, []
        self._handle: Optional[BinaryIO] = open(path, "wb")

    def add(self, row: SourceRow, ids: tuple[int, ...]) -> None:
        self._block.append((row.path, row.split, row.file, row.index, row.size, row.mtime_ns, row.sha256,
                            row.source_sha256, row.label, row.annotation, ids))
        self._count += 1
        if len(self._block) == self._BLOCK:
            marshal.dump(self._block, self._handle)
            self._block = []

    def close(self) -> None:
        if self._handle is not None:
            if self._block:
                marshal.dump(self._block, self._handle)
                self._block = []
            self._handle.close()
            self._handle = None

    def __iter__(self) -> Iterator[tuple[SourceRow, tuple[int, ...]]]:
        self.close()
        with open(self._path, "rb") as handle:
            while True:
                try:
                    block = marshal.load(handle)
                except EOFError:
                    return
                for *fields, ids in block:
                    yield SourceRow(*fields), ids

    def __len__(self) -> int:
        return self._count
