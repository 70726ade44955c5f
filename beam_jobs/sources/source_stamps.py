"""An update's view of one item of any source: its stamp (what tells, without reading its bytes, that it did not
change) and, where a stamp cannot tell, its bytes' SHA-256 (:class:`beam_jobs.planning.item_stamps.FileStamps`'
contract, for every kind of item the sources list).

In:  an :class:`ImageRef` of SRC's plan: a plain file (``source`` ""), an archive member (its locator,
     :mod:`beam_jobs.sources.archives.archive_members`), a Parquet row (:mod:`beam_jobs.sources.hub.hub_cells`), or
     one listed to be rejected (a refusal); SRC, and the compressed archives the listing inflated.
Out: :meth:`SourceStamps.stamp`: ``(size, stamp)``, what the sources table's ``size`` and ``mtime_ns`` hold, or None
     when the item is gone; :meth:`SourceStamps.sha256`: the hex SHA-256 of its bytes (what ``--rehash`` and a
     changed Parquet file compare: the sources table's ``source_sha256``).

The stamps (docs/update.md, "Archives, the Hub's Parquet, masks"):

* a file: its size and modification time (``os.stat``), as the writer's stamp;
* an archive member: its inflated size and its header's stamp (a tar member's modification time, a zip member's
  CRC-32), as its locator carries them from the listing: an unchanged archive lists the same headers, so all its
  members are unchanged, and no member byte is read; a changed one's members are compared one by one. A tar
  member's header time says nothing where writers fix it (tarfile's default 0, ``tar --mtime``, reproducible
  builds) and a fixed-size format never changes size: so the members of a tar whose own (size, mtime) differs
  from what the latest version recorded (the manifest's ``source_archives``) are compared by their bytes
  (:meth:`SourceStamps.stamp_decides`), whatever their headers say; where no identity was recorded, those whose
  header time is 0;
* a Parquet row: its file's size and modification time: a file unchanged leaves all its rows unchanged; a row of
  a changed file is compared by its cell's bytes (:meth:`SourceStamps.reads_bytes`: reading the cell is
  unavoidable there, a row has no stamp of its own);
* a refused item whose path holds no file (a member refused for its name, a link...): a digest of the refusal,
  so a rejection that stays the same is unchanged;
* an image with a semantic mask (``class_mask``: VOC's class PNG, a mask folder's): the mask file's own stamp
  folded into the image's modification time (a changed mask PNG makes its image changed), and its bytes into
  the image's SHA-256. An object's polygons or RLE are in its annotation, which its digest compares.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import posixpath
from types import MappingProxyType
from typing import Iterable, Mapping, Optional

import record_schema
from beam_jobs.planning.item_stamps import FileStamps, Stamp
from beam_jobs.sources.archives import archive_members
from beam_jobs.sources.archives.archive_members import Located
from beam_jobs.sources.archives.archives import archive_kind
from beam_jobs.sources.archives.compressed import Inflated
from beam_jobs.sources.hub import hub_cells
from beam_jobs.stage_records import ImageRef
from record_files.versions import UNKNOWN

_GROUPS_HELD = 16  # row groups whose cells' digests are held (a group's: 64 bytes a row)
_MISSING = archive_members.refusal("missing-file", "").rstrip("\t")
_UNREAD = object()  # stamp()'s class_mask when the caller has not decoded the annotation


class SourceStamps(FileStamps):
    """Stamps and bytes of SRC's items (see the module). ``inflated``: the compressed archives the listing inflated
    (their members' locators name the copy); ``masks``: read each object image's semantic mask too."""

    def __init__(self, src: str, inflated: Iterable[Inflated] = (), masks: bool = False,
                 archives: Mapping[str, str] = MappingProxyType({}),
                 recorded: Optional[Mapping[str, str]] = None) -> None:
        """``archives``: each top-level archive of SRC -> its identity now (the plan's); ``recorded``: the
        identities the latest version's manifest holds (``source_archives``), None where it holds none."""
        super().__init__(src)
        self._masks = masks
        self._inflated = {item.name: item.local for item in inflated}
        # An inflated copy's archive under SRC (``archives``: the plan's top-level ones, as it names them), whose
        # ctime says whether its members' stamps may be recorded; an archive inflated from inside another has none.
        self._originals = {Inflated.named(name, "").name: self._top(name) for name in archives}
        self._names = {Inflated.named(name, "").name: name for name in archives}  # inflated copy -> its archive
        # Top-level archives whose own identity is not the recorded one (None: nothing recorded): their tar
        # members are compared by their bytes (see the module).
        self._changed = None if recorded is None else frozenset(
            name for name, identity in archives.items() if recorded.get(name) != identity)
        self._files: dict[str, Stamp] = {}  # Parquet file -> its stamp (a few files, many rows each)
        self._cells: Optional[hub_cells.CellReader] = None
        # Each cell's SHA-256 of the last row groups read (a changed Parquet file's rows come in path order, which
        # need not be its rows' order: a group is read once while it is among these, not once a row).
        self._group_digests: collections.OrderedDict[tuple[str, int, str], list[str]] = collections.OrderedDict()

    def stamp(self, ref: ImageRef, ctime_before: int = 0, class_mask=_UNREAD) -> Optional[Stamp]:
        """``ref``'s stamp (see the module), None when it is gone or, with ``ctime_before``, changed since then.
        ``class_mask``: its annotation's semantic mask entry where the caller decoded it already (None: none)."""
        stamp = self._own(ref, ctime_before)
        if stamp is None or not self._masks:
            return stamp
        mask = self._class_mask(ref) if class_mask is _UNREAD else class_mask
        if mask is None:
            return stamp
        path, locator = mask[0], mask[1]
        held = self._own(ImageRef("", path, 0, locator), ctime_before) or (UNKNOWN, UNKNOWN)
        return stamp[0], _fold(f"{stamp[1]}:{held[0]}:{held[1]}")

    def reads_bytes(self, ref: ImageRef) -> bool:
        """Whether an item whose stamp differs is compared by its bytes (a Parquet row: its file's stamp is all
        it has; a member of a changed tar), rather than taken as changed."""
        return hub_cells.is_cell(ref.source) or not self.stamp_decides(ref)

    def stamp_decides(self, ref: ImageRef) -> bool:
        """Whether an equal stamp tells ``ref`` is unchanged: not for a tar member whose archive's own stamp
        changed (or, where the latest version recorded no archive, whose header time is 0: see the module)."""
        source = ref.source
        if not source or source.startswith(archive_members.REFUSED) or hub_cells.is_cell(source):
            return True
        located = archive_members.parse_locator(source)
        # None: an inner archive inflated into the work folder (which top-level archive holds it is not known).
        name = self._names.get(located.file) if located.in_work else \
            located.file or posixpath.basename(self._src.rstrip("/"))
        if not located.in_work and (archive_kind(posixpath.basename(name)) or ("",))[0] == "zip":
            return True  # a zip member's stamp is its CRC-32 (a tar stored inside a zip is read as the zip's)
        if self._changed is None:
            return located.member.stamp != 0
        return name is not None and name not in self._changed

    def sha256(self, ref: ImageRef) -> str:
        """The hex SHA-256 of ``ref``'s bytes (with its semantic mask's after them). Raises OSError when gone, and
        ValueError (:class:`beam_jobs.sources.archives.archive_members.UnreadableItem`) when it does not read."""
        if hub_cells.is_cell(ref.source):
            return self._cell_sha256(ref.source)
        digest = hashlib.sha256(self._bytes(ref))
        mask = self._class_mask(ref) if self._masks else None
        if mask is not None:
            try:
                digest.update(hashlib.sha256(self._bytes(ImageRef("", mask[0], 0, mask[1]))).digest())
            except (OSError, ValueError):
                digest.update(b"no mask")
        return digest.hexdigest()

    def _cell_sha256(self, source: str) -> str:
        file, group, row, column = hub_cells.parse_cell(source)
        key = (file, group, column)
        digests = self._group_digests.get(key)
        if digests is None:
            if self._cells is None:
                self._cells = hub_cells.CellReader(self._src)
            digests = []
            for at in range(self._cells.group_rows(file, group, column)):
                try:
                    digests.append(hashlib.sha256(self._cells.read(hub_cells.cell_locator(file, group, at, column)))
                                   .hexdigest())
                except hub_cells.CellError:
                    digests.append("")  # a row without its image: validation rejects it, named
            self._group_digests[key] = digests
            if len(self._group_digests) > _GROUPS_HELD:
                self._group_digests.popitem(last=False)
        self._group_digests.move_to_end(key)
        if row >= len(digests) or not digests[row]:
            raise hub_cells.CellError("missing-image", f"{file} row group {group} row {row}")
        return digests[row]

    def close(self) -> None:
        if self._cells is not None:
            self._cells.close()
            self._cells = None

    def _own(self, ref: ImageRef, ctime_before: int) -> Optional[Stamp]:
        source = ref.source
        if source and hub_cells.is_cell(source):
            return self._parquet_file(hub_cells.parse_cell(source)[0], ctime_before)
        if source and not source.startswith(archive_members.REFUSED):
            located = archive_members.parse_locator(source)
            if ctime_before and not self._older(located, ctime_before):
                return None
            return located.member.length, located.member.stamp
        stamp = super().stamp(ref, ctime_before)
        if stamp is None and source and not source.startswith(_MISSING) and not os.path.lexists(self.file(ref)):
            return 0, _fold(source)  # refused, and no file there (a member's path, a link): the refusal is its stamp
        return stamp  # a missing file is none: the comparison keeps it rejected while listed (changes.py)

    def _parquet_file(self, file: str, ctime_before: int) -> Optional[Stamp]:
        if file not in self._files:
            try:
                stat = os.stat(os.path.join(self._src, file) if file else self._src)
            except FileNotFoundError:
                return None
            fresh = not ctime_before or 0 < stat.st_ctime_ns < ctime_before
            self._files[file] = (stat.st_size, stat.st_mtime_ns) if fresh else (UNKNOWN, UNKNOWN)
        stamp = self._files[file]
        return None if stamp[0] == UNKNOWN else stamp

    def _top(self, name: str) -> str:
        if os.path.isfile(self._src) and name == os.path.basename(self._src.rstrip("/")):
            return self._src
        return os.path.join(self._src, name)

    def _older(self, located: Located, ctime_before: int) -> bool:
        path = self._originals.get(located.file, "") if located.in_work else self._archive_path(located)
        try:
            return 0 < os.stat(path).st_ctime_ns < ctime_before
        except FileNotFoundError:
            return False

    def _archive_path(self, located: Located) -> str:
        if located.in_work:
            return self._inflated.get(located.file, "")
        return os.path.join(self._src, located.file) if located.file else self._src

    def _bytes(self, ref: ImageRef) -> bytes:
        source = ref.source
        if source and not source.startswith(archive_members.REFUSED):
            located = archive_members.parse_locator(source)
            with open(self._archive_path(located), "rb") as handle:
                return archive_members.read_member(handle, located.member)
        with open(self.file(ref), "rb") as handle:
            return handle.read()

    @staticmethod
    def _class_mask(ref: ImageRef) -> Optional[list]:
        """An object image's semantic mask, ``[path in SRC, locator, ...]``, or None."""
        if not ref.annotation.startswith(b'["objects"'):
            return None
        value = json.loads(ref.annotation)
        return value[9] if len(value) > 9 and value[9] else None


def _fold(text: str) -> int:
    """63 bits of BLAKE2b of ``text``: a stamp that is no time (never UNKNOWN)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big") >> 1


def for_plan(options, plan, recorded: Optional[Mapping[str, str]] = None) -> SourceStamps:
    """The stamps of ``plan``'s items (a :class:`beam_jobs.planning.discover.InputPlan` of ``options.src``): its
    inflated archives' copies, and semantic masks read when ``--masks`` is given or the plan is of class masks;
    ``recorded``: the latest version's archive identities (its manifest's ``source_archives``, None: none)."""
    masks = bool(options.masks) or plan.task == record_schema.TASK_SEGMENTATION
    return SourceStamps(options.src, plan.inflated, masks, plan.archives, recorded)
