"""An update's test of one item of SRC against the row the latest version recorded of it: by stamp, else by bytes.

In:  an :class:`ImageRef` of SRC's plan, its row (:class:`record_files.versions.SourceRow`), and the item's stamp
     now (``(size, stamp)``: what the sources table's ``size`` and ``mtime_ns`` hold).
Out: :func:`same_item`: the source SHA-256 to record when the item is the one the row records, else None.

:class:`FileStamps` stamps plain files under SRC (size and modification time, as the writer's stamp) and reads
their bytes; a source's items (archive members, Parquet rows, semantic masks) are stamped by
:class:`beam_jobs.sources.source_stamps.SourceStamps`, which the update hands to the comparison (this layer does not
know sources). (docs/update.md, "Archives, the Hub's Parquet, masks".)
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

from beam_jobs.stage_records import ImageRef
from record_files.versions import SourceRow

Stamp = tuple[int, int]


class FileStamps:
    """Stamps and bytes of plain files under ``src`` (an item's ``relpath``)."""

    def __init__(self, src: str) -> None:
        self._src = src

    def file(self, ref: ImageRef) -> str:
        """The file under SRC at ``ref``'s path."""
        return os.path.join(self._src, ref.relpath)

    def stamp(self, ref: ImageRef, ctime_before: int = 0) -> Optional[Stamp]:
        """``ref``'s stamp, None when it is gone; with ``ctime_before``, None also for a file changed since then
        (ctime moves on every change and no call sets it back: an older file holds the bytes its record has)."""
        try:
            stat = os.stat(self.file(ref))
        except (FileNotFoundError, NotADirectoryError):  # gone; or a path through a file (an archive's member)
            return None
        if ctime_before and not 0 < stat.st_ctime_ns < ctime_before:
            return None
        return stat.st_size, stat.st_mtime_ns

    def reads_bytes(self, ref: ImageRef) -> bool:
        """Whether an item whose stamp differs is compared by its bytes rather than taken as changed (a file: no)."""
        return False

    def stamp_decides(self, ref: ImageRef) -> bool:
        """Whether an equal stamp tells the item is unchanged (a file: yes; a member of a changed tar: no, its
        bytes do, :class:`beam_jobs.sources.source_stamps.SourceStamps`)."""
        return True

    def sha256(self, ref: ImageRef) -> str:
        """The hex SHA-256 of ``ref``'s bytes, read in 1 MiB blocks. Raises OSError when it is gone."""
        digest = hashlib.sha256()
        with open(self.file(ref), "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()


def same_item(row: SourceRow, stamp: Stamp, ref: ImageRef, items: FileStamps, rehash: bool) -> Optional[str]:
    """The source SHA-256 to record when the item ``ref`` is the one ``row`` records, else None.

    The same stamp (no byte read) where a stamp decides, or, with ``rehash``, no stamp recorded, an item whose
    stamp does not decide (a member of a changed tar), or another stamp of an item compared by its bytes (a row of
    a changed Parquet file), the same bytes: the source's SHA-256 the row recorded
    (``source_sha256``), or, in a row without one (version 1, older tables), the stored image's, which only a
    pass-through image matches: a re-encoded image of version 1 is converted again. A rejected image without a
    source hash is unchanged by its stamp only.
    """
    if row.stamped and not rehash:
        if (row.size, row.mtime_ns) == stamp and items.stamp_decides(ref):
            return row.source_sha256
        if not items.reads_bytes(ref):
            return None
    expected = row.source_sha256 or row.sha256
    if not expected:
        return None
    try:
        digest = items.sha256(ref)
    except (OSError, ValueError):
        return None  # gone since its stat, or no longer reads: converted as changed, where its read names it
    return digest if digest == expected else None
