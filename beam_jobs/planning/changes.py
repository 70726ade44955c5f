"""What an update converts: SRC as listed now, compared with the images the latest version accounts for.

In:  the plan of SRC (its refs, labels, splits), the latest version's sources (:class:`record_files.versions.
     SourceRow`: path, split, shard file, stamp, SHA-256) and classes, ``--val-fraction`` and ``--seed``.
Out: :class:`Changes`: the refs to convert (new and changed images), the rows kept as they are (their shards
     reused), the survivors of shards that lost a record (copied, record by record, into compacted shards),
     the classes with stable ids, each listed image's stamp.

An image is unchanged when its path is the version's and its file's size and modification time are the
ones recorded (no byte read); with ``rehash``, or against a version that recorded no stamps (version 1), its
bytes' SHA-256 must equal the source file's the version recorded instead (version 1 recorded none: the stored
image's, which a re-encoded image's source never matches). A file gone since SRC was listed is deleted, but
one the version rejected as ``missing-file`` (a label file lists it, no file is there) stays rejected, unchanged;
one it rejected for another reason (corrupt...) whose file is gone now is a changed image: converted again, its
read rejects it afresh as ``missing-file`` (the reason it had no longer holds).
Its label must be the one its record holds too (a label file that labels it otherwise now: a changed image,
``relabelled``), and, without ``--val-fraction``, its split the one SRC states (a label file's split column).

Splits: an unchanged image keeps its split; without ``--val-fraction`` every image converted takes the split
SRC states; with it, a changed or relabelled image keeps the split it had (the same photo moved from train to
validation would be a leak between the versions a model saw), and a new image is carved by its key against a
fixed threshold (:func:`new_split`).

The comparison is a merge-join of the listing and the version's sources table, both in path order: the
unchanged rows go to a file in the scratch folder as they are found, and what is held grows with the change,
not with the dataset (an integer a survivor of a compacted shard aside). (docs/converter.md, "Updating a
dataset".)
"""

from __future__ import annotations

import array
import collections
import dataclasses
import hashlib
import heapq
import marshal
import os
import tempfile
from typing import BinaryIO, Container, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from beam_jobs import annotations
from beam_jobs.planning.carve import carve_key
from beam_jobs.planning.discover import class_order, display_path
from beam_jobs.stage_records import ImageRef
from record_files.versions import UNKNOWN, SourceRow, label_key

_KEY_SPACE = 1 << 128  # carve keys are 128-bit


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
                            row.source_sha256, row.label, ids))
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


@dataclasses.dataclass(frozen=True)
class Changes:
    """What an update does (see the module's docstring).

    ``refs``: to convert, sorted by (split, relpath); ``unchanged``: every unchanged image's row and class ids,
    stamped now, in path order (on disk: :class:`UnchangedRows`), whether its shard is reused or compacted, and
    the unchanged rejected images (``file`` ""); ``reused``: the shard files kept; ``compacted``: the shards
    that lost a record; ``survivors``: per compacted shard, its unchanged records' indices, ascending (a record's
    place in the compacted shard is its rank there); ``kept_labels``: records of each (split, label id) among
    the unchanged; ``rejected_kept``: the paths of the unchanged rejected images; ``stamps`` and ``files``: each
    image to convert's (size, mtime_ns) and file (under SRC) by path. Nothing here grows with the images that
    did not change but ``survivors``, an integer a record of a shard that lost one.
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
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)

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
        try:
            digest = file_sha256(self.files[path])
            stat = os.stat(self.files[path])
        except FileNotFoundError:
            return ""
        return digest if (stat.st_size, stat.st_mtime_ns) == self.stamps[path] else ""

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


def label_ids(ref: ImageRef) -> tuple[int, ...]:
    """The class ids ``ref`` labels its image with: its label, or a multi-label image's ids (its annotation)."""
    if ref.annotation:
        annotation = annotations.decode(ref.annotation)
        if isinstance(annotation, annotations.Labels):
            return annotation.ids
    return (ref.label,)


def _with_ids(ref: ImageRef, remap: Sequence[int]) -> ImageRef:
    """``ref``, an annotated image, with its multi-label ids the version's stable ids (``remap``: listed id ->
    stable id); objects are not updated (refused before)."""
    annotation = annotations.decode(ref.annotation)
    if isinstance(annotation, annotations.Labels):
        ids = tuple(sorted(remap[label] for label in annotation.ids))
        return ref._replace(annotation=annotations.encode(annotations.Labels(ids)))
    return ref._replace(label=remap[ref.label])


def stable_classes(before: Sequence[str], listed: Sequence[str]) -> tuple[str, ...]:
    """The version's classes: ``before``'s, in order (each keeps its id), then every new name in a conversion's
    order (numeric when every new name is an integer, as a label file's "10" follows "9")."""
    known = set(before)
    return tuple(before) + tuple(class_order({name for name in listed if name not in known}))


def new_split(ref: ImageRef, val_fraction: float, seed: int) -> str:
    """A new image's split: with ``--val-fraction``, validation when its carve key is below the fraction of the
    key space (a fixed threshold: no later image moves it), else train; without, the split its folder says."""
    if val_fraction <= 0:
        return ref.split
    key = int.from_bytes(carve_key(seed, ref.relpath), "big")
    return "validation" if key < int(val_fraction * _KEY_SPACE) else "train"


def compare(refs: Iterable[ImageRef], src: str, listed_classes: Sequence[str], previous: Iterable[SourceRow],
            classes_before: Sequence[str], val_fraction: float, seed: int, scratch: str,
            rehash: bool = False, missing_before: Container[str] = frozenset()) -> Changes:
    """Compare SRC's ``refs`` (labels index ``listed_classes``) with the ``previous`` version's rows, given in
    path order (a sources table's): a merge-join of the two, in memory flat in the images. ``missing_before``:
    the paths the version rejected as ``missing-file`` (its ``rejected.jsonl`` says why, its rows do not). The listing is put in
    path order by an external sort (runs of :data:`SORT_RUN` refs sorted in memory, spilled, merged) and the
    unchanged rows are spilled as found, both to ``scratch`` (a folder of the caller's, which must outlive the
    returned :class:`Changes`: its unchanged rows are read from there).
    """
    classes = stable_classes(classes_before, listed_classes)
    ids = {name: index for index, name in enumerate(classes)}
    remap = [ids[name] for name in listed_classes]
    return _merge_join(_in_path_order(refs, scratch), src, remap, previous, classes, val_fraction, seed, rehash,
                       scratch, missing_before)


# The listing's external sort: refs sorted in memory at a time (about 200 bytes each), runs merged at a time (each
# open with a read buffer and a block of refs: about 20 KB), refs a block of a run file holds.
SORT_RUN = 50_000
FAN_IN = 64
_RUN_BLOCK = 64


def _in_path_order(refs: Iterable[ImageRef], folder: str) -> Iterator[ImageRef]:
    """``refs`` by path: runs of :data:`SORT_RUN` sorted in memory, each spilled to ``folder`` (but a single
    run), merged :data:`FAN_IN` at a time until that many are left, then merged as read (a listing arrives in
    its lister's order: by split, then path, when ``--val-fraction`` carves class folders)."""
    runs: list[str] = []
    batch: list[ImageRef] = []
    for ref in refs:
        batch.append(ref)
        if len(batch) == SORT_RUN:
            runs.append(_spill_run(sorted(batch, key=_ref_path), folder))
            batch = []
    batch.sort(key=_ref_path)
    if not runs:
        yield from batch
        return
    runs.append(_spill_run(batch, folder))
    del batch
    while len(runs) > FAN_IN:
        runs = runs[FAN_IN:] + [_spill_run(_merged(runs[:FAN_IN]), folder)]  # each ref merged log(runs) times
    yield from _merged(runs)


def _ref_path(ref: ImageRef) -> str:
    return display_path(ref.relpath)


def _merged(runs: Sequence[str]) -> Iterator[ImageRef]:
    return heapq.merge(*(_read_run(run) for run in runs), key=_ref_path)


def _spill_run(refs: Iterable[ImageRef], folder: str) -> str:
    """Write ``refs`` (in path order) to a new file in ``folder``, :data:`_RUN_BLOCK` to a ``marshal`` record."""
    handle, path = tempfile.mkstemp(prefix="listing-run-", suffix=".marshal", dir=folder)
    with os.fdopen(handle, "wb") as out:
        block = []
        for ref in refs:
            block.append(tuple(ref))
            if len(block) == _RUN_BLOCK:
                marshal.dump(block, out)
                block = []
        if block:
            marshal.dump(block, out)
    return path


def _read_run(path: str) -> Iterator[ImageRef]:
    """The refs of a run file, which is removed once read."""
    try:
        with open(path, "rb") as handle:
            while True:
                try:
                    block = marshal.load(handle)
                except EOFError:
                    return
                yield from (ImageRef(*fields) for fields in block)
    finally:
        os.remove(path)


def _merge_join(refs: Iterator[ImageRef], src: str, remap: Sequence[int], previous: Iterable[SourceRow],
                classes: tuple[str, ...], val_fraction: float, seed: int, rehash: bool, folder: str,
                missing_before: Container[str]) -> Changes:
    """One pass over the listing and the previous rows, both in path order (see :func:`compare`)."""
    handle, path = tempfile.mkstemp(prefix="unchanged-rows-", suffix=".marshal", dir=folder)
    os.close(handle)
    unchanged = UnchangedRows(path)
    try:
        return _join(refs, src, remap, previous, classes, val_fraction, seed, rehash, unchanged, missing_before)
    except BaseException:
        unchanged.close()
        os.remove(path)
        raise


def _join(refs: Iterator[ImageRef], src: str, remap: Sequence[int], previous: Iterable[SourceRow],
          classes: tuple[str, ...], val_fraction: float, seed: int, rehash: bool,
          unchanged: UnchangedRows, missing_before: Container[str]) -> Changes:
    convert: list[ImageRef] = []
    stamps: dict[str, tuple[int, int]] = {}
    files: dict[str, str] = {}
    touched: set[str] = set()
    rejected_kept: set[str] = set()
    kept_labels: collections.Counter[tuple[str, int]] = collections.Counter()
    added = changed = deleted = relabelled = 0
    rows = iter(previous)
    row = next(rows, None)
    for ref in refs:
        path = display_path(ref.relpath)
        while row is not None and row.path < path:  # in the version, not in SRC: deleted
            touched.add(row.file)
            deleted += 1
            row = next(rows, None)
        match = row if row is not None and row.path == path else None
        if match is not None:
            row = next(rows, None)
        if ref.annotation:  # a multi-label image: its ids in its annotation
            ref = _with_ids(ref, remap)
            ids = label_ids(ref)
            key = label_key(ids)
        else:  # one label (a call less an image: the comparison's cost is per image of SRC)
            key = remap[ref.label]
            ref, ids = ref._replace(label=key), (key,)
        try:
            stat = os.stat(os.path.join(src, ref.relpath))
        except FileNotFoundError:
            if match is not None and not match.file and path in missing_before:  # still missing: the same rejection
                unchanged.add(match, ())
                rejected_kept.add(path)
            elif match is not None and not match.file:  # rejected as corrupt..., gone now: rejected anew, missing
                stamps[path], files[path] = (UNKNOWN, UNKNOWN), os.path.join(src, ref.relpath)
                convert.append(ref._replace(split=new_split(ref, val_fraction, seed)))
                changed += 1
            elif match is not None:  # gone since SRC was listed: deleted, as if it had been gone then
                touched.add(match.file)
                deleted += 1
            continue
        stamp = (stat.st_size, stat.st_mtime_ns)
        same = None if match is None else _unchanged(match, stamp, os.path.join(src, ref.relpath), rehash)
        # Recorded (a record's, not a rejection's) and other now: what the label file says it is, where it says.
        other_label = match is not None and match.file and match.label not in (UNKNOWN, key)
        other_split = match is not None and match.file and val_fraction <= 0 and match.split != ref.split
        if same is not None and not (other_label or other_split):
            unchanged.add(SourceRow(match.path, match.split, match.file, match.index, stamp[0], stamp[1],
                                    match.sha256, same, key if match.file else UNKNOWN), ids)
            if match.file:
                for label in ids:
                    kept_labels[match.split, label] += 1
            else:
                rejected_kept.add(path)
            continue
        stamps[path], files[path] = stamp, os.path.join(src, ref.relpath)
        if match is None:
            convert.append(ref._replace(split=new_split(ref, val_fraction, seed)))
            added += 1
        else:
            kept_split = match.split if val_fraction > 0 else ""  # without a carve, SRC states the split
            convert.append(ref._replace(split=kept_split or new_split(ref, val_fraction, seed)))
            changed += 1
            relabelled += bool(other_label and same is not None)
            touched.add(match.file)
    while row is not None:
        touched.add(row.file)
        deleted += 1
        row = next(rows, None)
    touched.discard("")
    unchanged.close()
    survivors, reused = _survivors(unchanged, touched)
    return Changes(
        refs=tuple(sorted(convert, key=lambda ref: (ref.split, ref.relpath))), unchanged=unchanged,
        reused=frozenset(reused), compacted=frozenset(touched), survivors=survivors, classes=classes,
        kept_labels=dict(kept_labels), stamps=stamps, added=added, changed=changed, deleted=deleted,
        relabelled=relabelled,
        recompacted=sum(map(len, survivors.values())), rejected_kept=frozenset(rejected_kept), files=files,
    )


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


def _unchanged(row: SourceRow, stamp: tuple[int, int], path: str, rehash: bool) -> Optional[str]:
    """The source SHA-256 to record when the image at ``path`` is the one ``row`` records, else None.

    The same stamp (no byte read), or, with ``rehash`` or no stamp recorded, the same bytes: the source
    file's SHA-256 the row recorded (``source_sha256``), or, in a row without one (version 1, older tables),
    the stored image's, which only a pass-through image matches: a re-encoded image of version 1 is
    converted again. A rejected image without a source hash is unchanged by its stamp only.
    """
    if row.stamped and not rehash:
        return row.source_sha256 if (row.size, row.mtime_ns) == stamp else None
    expected = row.source_sha256 or row.sha256
    if not expected:
        return None
    try:
        digest = file_sha256(path)
    except FileNotFoundError:
        return None  # gone since its stat: converted as changed, where its read names it
    return digest if digest == expected else None


def file_sha256(path: str) -> str:
    """The hex SHA-256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
