"""What an update converts: SRC as listed now, compared with the images the latest version accounts for.

In:  the plan of SRC (its refs, labels, splits), the latest version's sources (:class:`record_files.versions.
     SourceRow`: path, split, shard file, stamp, SHA-256) and classes, ``--val-fraction`` and ``--seed``.
Out: :class:`Changes`: the refs to convert (new and changed images), the rows kept as they are (their shards
     reused), the survivors of shards that lost a record (copied, record by record, into compacted shards),
     the classes with stable ids, each listed image's stamp.

An image is unchanged when its path is the version's and its file's size and modification time are the
ones recorded (no byte read); with ``rehash``, or against a row without a stamp (a version 1 converted before
conversions wrote sources tables; a file changed during its conversion), its bytes' SHA-256 must equal the
source file's the version recorded instead (version 1 records none: the stored image's, which a re-encoded
image's source never matches). A file gone since SRC was listed is deleted, but
one the version rejected as ``missing-file`` (a label file lists it, no file is there) stays rejected, unchanged;
one it rejected for another reason (corrupt...) whose file is gone now is a changed image: converted again, its
read rejects it afresh as ``missing-file`` (the reason it had no longer holds).
Its label must be the one its record holds too (a label file that labels it otherwise now: a changed image,
``relabelled``), and, without ``--val-fraction``, its split the one SRC states (a label file's split column).
An object image's annotation digest must be its row's (:func:`beam_jobs.planning.stable_ids.annotation_digest`;
a row without one, an older version 1's, is compared by its objects' classes, or with ``rehash`` converted again).

Splits: an unchanged image keeps its split; without ``--val-fraction`` every image converted takes the split
SRC states; with it, a changed or relabelled image keeps the split it had (the same photo moved from train to
validation would be a leak between the versions a model saw), and the new images are carved per class, steered by
the class's running totals (:func:`beam_jobs.planning.carve.carve_new`): old images never move.

The comparison is a merge-join of the listing and the version's sources table, both in path order: the
unchanged rows go to a file in the scratch folder as they are found, and what is held grows with the change,
not with the dataset (an integer a survivor of a compacted shard aside). (docs/converter.md, "Updating a
dataset".)
"""

from __future__ import annotations

import array
import collections
import dataclasses
import marshal
import os
import tempfile
from typing import BinaryIO, Container, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from beam_jobs.files import external_sort
from beam_jobs.planning import stable_ids
from beam_jobs.planning.carve import carve_new
from beam_jobs.planning.item_stamps import FileStamps, same_item
from beam_jobs.planning.discover import display_path
from beam_jobs.stage_records import ImageRef
from beam_jobs.planning.unchanged_rows import UnchangedRows
from record_files.versions import NO_ANNOTATION, UNKNOWN, SourceRow


@dataclasses.dataclass(frozen=True)
class Changes:
    """What an update does (see the module's docstring).

    ``refs``: to convert, sorted by (split, relpath); ``unchanged``: every unchanged image's row and class ids,
    stamped now, in path order (on disk: :class:`UnchangedRows`), whether its shard is reused or compacted, and
    the unchanged rejected images (``file`` ""); ``reused``: the shard files kept; ``compacted``: the shards
    that lost a record; ``survivors``: per compacted shard, its unchanged records' indices, ascending (a record's
    place in the compacted shard is its rank there); ``kept_labels``: records of each (split, label id) among
    the unchanged; ``rejected_kept``: the paths of the unchanged rejected images; ``stamps`` and ``files``: each
    image to convert's stamp (:mod:`beam_jobs.planning.item_stamps`) and ref by path; ``items``: how its bytes are
    read. Nothing here grows with the images that did not change but ``survivors``, an integer a record of a
    shard that lost one.
    """

    refs: tuple[ImageRef, ...]
    unchanged: UnchangedRows
    reused: frozenset[str]
    compacted: frozenset[str]
    survivors: Mapping[str, "np.ndarray"]
    classes: tuple[str, ...]
    kept_labels: Mapping[tuple[str, int], int]
    stamps: Mapping[str, tuple[int, int]]
    added: int
    changed: int
    deleted: int
    recompacted: int
    relabelled: int = 0  # of ``changed``: the same bytes under another label (a label file's)
    rejected_kept: frozenset[str] = frozenset()
    files: Mapping[str, ImageRef] = dataclasses.field(default_factory=dict)
    unlabelled: int = 0  # records compared whose row has no label (tables before the column): relabels unseen
    unannotated: int = 0  # object images compared whose row has no annotation digest (an older version 1)
    digests: Mapping[str, int] = dataclasses.field(default_factory=dict)  # each object image to convert's
    items: Optional[FileStamps] = None
    hashes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # read at the comparison (inflated members)

    @property
    def nothing(self) -> bool:
        """Nothing to write: no image added, changed or deleted, and no new class."""
        return not (self.added or self.changed or self.deleted or self.recompacted)

    def source_sha256(self, path: str) -> str:
        """The hex SHA-256 of image ``path``'s source file, read again after its conversion ("" when it is no
        longer the file the update stamped: the next ``--rehash`` then converts it again, as it should).

        The conversion's workers hashed it too, but keep the digest in their work files only; a second read
        of the new images alone is the small price of a sources table that ``--rehash`` can compare with.
        """
        if path in self.hashes:
            return self.hashes[path]
        try:
            digest = self.items.sha256(self.files[path])
            stamp = self.items.stamp(self.files[path])
        except (OSError, ValueError):  # gone; a member or row that no longer reads (validation said why)
            return ""
        return digest if stamp == self.stamps[path] else ""

    def counts(self) -> dict:
        """The manifest's ``changes``."""
        return {"added": self.added, "changed": self.changed, "relabelled": self.relabelled, "deleted": self.deleted,
                "unchanged": len(self.unchanged) - len(self.rejected_kept),
                "recompacted": self.recompacted, "compacted_shards": len(self.survivors),
                "emptied_shards": len(self.compacted) - len(self.survivors)}  # lost every record: not written

    def new_place(self, row: SourceRow, compacted_file: str) -> SourceRow:
        """``row``, a survivor of a compacted shard, at its place in ``compacted_file``."""
        index = int(np.searchsorted(self.survivors[row.file], row.index))
        return dataclasses.replace(row, file=compacted_file, index=index)


def compare(refs: Iterable[ImageRef], src: str, listed_classes: Sequence[str], previous: Iterable[SourceRow],
            classes_before: Sequence[str], val_fraction: float, seed: int, scratch: str,
            rehash: bool = False, missing_before: Container[str] = frozenset(), by_class: bool = True,
            items: Optional[FileStamps] = None) -> Changes:
    """Compare SRC's ``refs`` (labels index ``listed_classes``) with the ``previous`` version's rows, given in
    path order (a sources table's): a merge-join of the two, in memory flat in the images. ``missing_before``:
    the paths the version rejected as ``missing-file`` (its ``rejected.jsonl`` says why, its rows do not). The listing is put in
    path order by an external sort (runs of :data:`SORT_RUN_BYTES` sorted in memory, spilled, merged) and the
    unchanged rows are spilled as found, both to ``scratch`` (a folder of the caller's, which must outlive the
    returned :class:`Changes`: its unchanged rows are read from there). ``by_class``: the carve is stratified
    per class (one label an image), else over all images (objects, tags), as a conversion's. ``items``: how an
    item's stamp and bytes are had (archive members, Parquet rows, masks); plain files under ``src`` by default.
    """
    classes = stable_ids.stable_classes(classes_before, listed_classes)
    remap = stable_ids.remap(classes, listed_classes)
    settings = _Settings(src, remap, val_fraction, seed, rehash, missing_before, by_class, items or FileStamps(src))
    return _merge_join(_in_path_order(refs, scratch), previous, classes, settings, scratch)


# The listing's external sort (beam_jobs.files.external_sort): refs held in memory at a time, in bytes (a ref's
# record, about 100 bytes, and its object: some 60,000 refs, as the 50,000 ImageRefs held before).
SORT_RUN_BYTES = 8 << 20


def _in_path_order(refs: Iterable[ImageRef], folder: str) -> Iterator[ImageRef]:
    """``refs`` by path, sorted on disk in ``folder`` a run of :data:`SORT_RUN_BYTES` at a time (a listing arrives
    in its lister's order: by split, then path, when ``--val-fraction`` carves class folders). Each ref a record
    of its path's UTF-8 bytes (whose byte order is the paths' order; a path holds no NUL), a NUL, then the ref."""
    order = external_sort.ExternalSort(folder, "listing", SORT_RUN_BYTES)
    for ref in refs:
        order.add(display_path(ref.relpath).encode("utf-8") + b"\0" + marshal.dumps(tuple(ref)))
    for record in order.sorted():
        yield ImageRef(*marshal.loads(record[record.index(b"\0") + 1:]))


@dataclasses.dataclass
class _Settings:
    """What the comparison of each image needs to know (see :func:`compare`)."""

    src: str
    remap: Sequence[int]
    val_fraction: float
    seed: int
    rehash: bool
    missing_before: Container[str]
    by_class: bool = True
    items: Optional[FileStamps] = None


@dataclasses.dataclass
class _Found:
    """What the merge-join has found so far: :class:`Changes` in the making."""

    unchanged: UnchangedRows
    items: FileStamps
    convert: list[ImageRef] = dataclasses.field(default_factory=list)
    stamps: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    files: dict[str, ImageRef] = dataclasses.field(default_factory=dict)
    hashes: dict[str, str] = dataclasses.field(default_factory=dict)
    touched: set[str] = dataclasses.field(default_factory=set)  # shard files that lost a record
    rejected_kept: set[str] = dataclasses.field(default_factory=set)
    kept_labels: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    added: int = 0
    changed: int = 0
    deleted: int = 0
    relabelled: int = 0
    unlabelled: int = 0
    unannotated: int = 0
    digests: dict[str, int] = dataclasses.field(default_factory=dict)
    strata: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (stratum, split): kept
    carving: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (stratum, place in convert)

    # With a carve: each deleted record's size, SHA-256 of its bytes and split, a line each in this scratch file (a
    # new path with those bytes is the same photo moved to another class folder, which keeps its split); memory:
    # none for them until the carve, which reads back those of the new images' sizes only.
    gone_path: str = ""
    _gone: Optional[BinaryIO] = None

    def delete(self, row: SourceRow) -> None:
        self.touched.add(row.file)
        self.deleted += 1
        if self.gone_path and row.file and row.size >= 0 and (row.source_sha256 or row.sha256):
            if self._gone is None:
                self._gone = open(self.gone_path, "wb")
            self._gone.write(f"{row.size}\t{row.source_sha256 or row.sha256}\t{row.split}\n".encode("ascii"))

    def to_convert(self, path: str, ref: ImageRef, stamp: tuple[int, int], stratum: int = 0,
                   split: str = "", carve: bool = False, digest: int = NO_ANNOTATION) -> None:
        """``ref`` to convert, in ``split`` (one it keeps: counted in its stratum) or, with ``carve``, one the
        carve of the new images gives it (:meth:`carve`); else in the split SRC states."""
        self.stamps[path], self.files[path] = stamp, ref
        if ref.source.startswith("w:"):  # an inflated archive's copy (archive_members.IN_WORK) moves into the
            self.hashes[path] = self._sha256(path)  # work folder before the new rows are made: hashed now
        if digest != NO_ANNOTATION:  # an object image's, for its new row (held for the images converted only)
            self.digests[path] = digest
        if split:
            self.strata[stratum, split] += 1
        elif carve:
            self.carving.append((stratum, len(self.convert)))
        self.convert.append(ref._replace(split=split or ref.split))

    def carve(self, fraction: float, seed: int) -> None:
        """The new images' splits, stratified (:func:`beam_jobs.planning.carve.carve_new`)."""
        self._keep_moved_splits()
        new: dict[int, list[str]] = collections.defaultdict(list)
        for stratum, at in self.carving:
            new[stratum].append(self.convert[at].relpath)
        validation = carve_new(new, self.strata, fraction, seed)
        for _, at in self.carving:
            ref = self.convert[at]
            self.convert[at] = ref._replace(split="validation" if ref.relpath in validation else "train")


    def _keep_moved_splits(self) -> None:
        """A new image whose bytes are a deleted record's (a photo moved to another class folder: how class
        folders relabel) keeps that record's split instead of being carved: a photo the model trained on must
        not come back as a validation image (the trial's finding). Only new images of a deleted record's size
        are read (their bytes are read again to convert them)."""
        if self._gone is None:
            return
        self._gone.close()
        if not self.carving:
            return
        sizes = {self.stamps[self.convert[at].relpath][0] for _, at in self.carving}
        gone: dict[tuple[int, str], str] = {}
        with open(self.gone_path, "rb") as handle:
            for line in handle:
                size, sha, split = line.decode("ascii").split()
                if int(size) in sizes:
                    gone.setdefault((int(size), sha), split)
        carving = []
        for stratum, at in self.carving:
            path = self.convert[at].relpath
            split = None
            if self.stamps[path][0] in sizes and gone:
                split = gone.get((self.stamps[path][0], self._sha256(path)))
            if split is None:
                carving.append((stratum, at))
            else:
                self.strata[stratum, split] += 1
                self.convert[at] = self.convert[at]._replace(split=split)
        self.carving = carving

    def _sha256(self, path: str) -> str:
        if path in self.hashes:
            return self.hashes[path]
        try:
            return self.items.sha256(self.files[path])
        except (OSError, ValueError):
            return ""


def _merge_join(refs: Iterator[ImageRef], previous: Iterable[SourceRow], classes: tuple[str, ...],
                settings: _Settings, folder: str) -> Changes:
    """One pass over the listing and the previous rows, both in path order (see :func:`compare`)."""
    handle, path = tempfile.mkstemp(prefix="unchanged-rows-", suffix=".marshal", dir=folder)
    os.close(handle)
    unchanged = UnchangedRows(path)
    gone = path + ".gone" if settings.val_fraction > 0 else ""  # deleted records, for the carve to recognise moves
    try:
        return _join(refs, previous, classes, settings, unchanged, gone)
    except BaseException:
        unchanged.close()
        os.remove(path)
        raise
    finally:
        if gone and os.path.exists(gone):
            os.remove(gone)


def _join(refs: Iterator[ImageRef], previous: Iterable[SourceRow], classes: tuple[str, ...], settings: _Settings,
          unchanged: UnchangedRows, gone: str = "") -> Changes:
    found = _Found(unchanged, settings.items, gone_path=gone)
    rows = iter(previous)
    row = next(rows, None)
    for ref in refs:
        path = display_path(ref.relpath)
        while row is not None and row.path < path:  # in the version, not in SRC: deleted
            found.delete(row)
            row = next(rows, None)
        match = row if row is not None and row.path == path else None
        if match is not None:
            row = next(rows, None)
        _compare_one(ref, path, match, settings, found)
    while row is not None:
        found.delete(row)
        row = next(rows, None)
    found.touched.discard("")
    found.carve(settings.val_fraction, settings.seed)
    unchanged.close()
    survivors, reused = _survivors(unchanged, found.touched)
    return Changes(
        refs=tuple(sorted(found.convert, key=lambda ref: (ref.split, ref.relpath))), unchanged=unchanged,
        reused=frozenset(reused), compacted=frozenset(found.touched), survivors=survivors, classes=classes,
        kept_labels=dict(found.kept_labels), stamps=found.stamps, added=found.added, changed=found.changed,
        deleted=found.deleted, relabelled=found.relabelled, recompacted=sum(map(len, survivors.values())),
        rejected_kept=frozenset(found.rejected_kept), files=found.files, unlabelled=found.unlabelled,
        unannotated=found.unannotated, digests=found.digests, items=settings.items, hashes=found.hashes,
    )


def _compare_one(ref: ImageRef, path: str, match: Optional[SourceRow], settings: _Settings, found: _Found) -> None:
    """Image ``ref`` of SRC (``path``) against the version's row of it (``match``, None for a new image): unchanged,
    to convert (new, changed, relabelled, moved to another split), deleted or still rejected, into ``found``."""
    ref, ids, key, digest = stable_ids.stable_ref(ref, settings.remap)
    stratum = key if settings.by_class else 0  # the carve's: a class, or all images (tags, objects)
    stamp = settings.items.stamp(ref)
    if stamp is None:
        if match is not None and not match.file and path in settings.missing_before:  # still missing: kept
            found.unchanged.add(match, ())
            found.rejected_kept.add(path)
        elif match is not None and not match.file:  # rejected as corrupt..., gone now: rejected anew, missing
            found.to_convert(path, ref, (UNKNOWN, UNKNOWN), stratum, carve=settings.val_fraction > 0, digest=digest)
            found.changed += 1
        elif match is not None:  # gone since SRC was listed: deleted, as if it had been gone then
            found.delete(match)
        return
    same = None if match is None else same_item(match, stamp, ref, settings.items, settings.rehash)
    found.unlabelled += bool(match is not None and match.file and match.label == UNKNOWN)
    # Recorded (a record's, not a rejection's) and other now: what the label file says it is, where it says. An
    # object image with digests on both sides is judged by them: its row's label is its record's classes, which
    # leave out a box that placing dropped (an empty box, one past the edge), so a label key from SRC's boxes
    # would differ at every update and convert it again each time (the review's finding).
    objects_digested = digest != NO_ANNOTATION and match is not None and match.annotation != NO_ANNOTATION
    other_label = match is not None and match.file and not objects_digested and match.label not in (UNKNOWN, key)
    other_split = match is not None and match.file and settings.val_fraction <= 0 and match.split != ref.split
    # An object image's annotation: its digest against the row's; a row without one (an older version 1) is compared
    # by its objects' classes only (the records tables'), and stays without one, or, with --rehash, is converted again.
    unknown = match is not None and digest != NO_ANNOTATION and match.annotation == NO_ANNOTATION
    found.unannotated += bool(unknown and not settings.rehash)
    other_objects = settings.rehash if unknown else match is not None and match.annotation != digest
    if same is not None and not (other_label or other_split or other_objects):
        found.unchanged.add(SourceRow(match.path, match.split, match.file, match.index, stamp[0], stamp[1],
                                      match.sha256, same, key if match.file else UNKNOWN,
                                      NO_ANNOTATION if unknown else digest), ids)  # unknown kept: --rehash sees it
        if match.file:
            found.strata[stratum, match.split] += 1
            for label in ids:
                found.kept_labels[match.split, label] += 1
        else:
            found.rejected_kept.add(path)
        return
    # Without a carve SRC states the split; with one, a changed image keeps its split, a new one is carved.
    kept_split = match.split if match is not None and settings.val_fraction > 0 else ""
    found.to_convert(path, ref, stamp, stratum, kept_split, carve=settings.val_fraction > 0, digest=digest)
    if match is None:
        found.added += 1
    else:
        found.changed += 1
        found.relabelled += bool(other_label and same is not None)
        found.touched.add(match.file)


def _survivors(unchanged: UnchangedRows, touched: set[str]) -> tuple[dict[str, np.ndarray], set[str]]:
    """Per shard that lost a record, its unchanged records' indices, ascending; and the shards reused whole."""
    indices: dict[str, array.array] = collections.defaultdict(lambda: array.array("q"))
    reused: set[str] = set()
    for row, _ in unchanged:
        if row.file in touched:
            indices[row.file].append(row.index)
        elif row.file:
            reused.add(row.file)
    return {file: np.sort(np.frombuffer(found, dtype=np.int64)) for file, found in indices.items()}, reused
