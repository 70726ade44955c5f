"""What an update converts: SRC as listed now, compared with the images the latest version accounts for.

In:  the plan of SRC (its refs, labels, splits), the latest version's sources (:class:`record_files.versions.
     SourceRow`: path, split, shard file, stamp, SHA-256) and classes, ``--val-fraction`` and ``--seed``.
Out: :class:`Changes`: the refs to convert (new and changed images), the rows kept as they are (their shards
     reused), the survivors of shards that lost a record (copied, record by record, into compacted shards),
     the classes with stable ids, each listed image's stamp.

An image is unchanged when its path is the version's and its file's size and modification time are the
ones recorded (no byte read); with ``rehash``, or against a version that recorded no stamps (version 1), its
bytes' SHA-256 must equal the source file's the version recorded instead (version 1 recorded none: the stored
image's, which a re-encoded image's source never matches). A file gone since SRC was listed is deleted. (docs/converter.md, "Updating a dataset".)
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
from typing import Iterable, Mapping, Optional, Sequence

from beam_jobs.planning.carve import carve_key
from beam_jobs.planning.discover import display_path
from beam_jobs.stage_records import ImageRef
from record_files.versions import SourceRow

_KEY_SPACE = 1 << 128  # carve keys are 128-bit


@dataclasses.dataclass(frozen=True)
class Changes:
    """What an update does (see the module's docstring).

    ``refs``: to convert, sorted by (split, relpath); ``kept``: rows of the unchanged images whose shards are
    reused (and unchanged rejected images: ``file`` ""), stamped now; ``reused``: the shard files kept;
    ``compacted``: the shards that lost a record; ``survivors``: per compacted shard, the rows of its unchanged
    images (stamped now, by record index) with their label ids; ``kept_labels``: records of each (split, label
    id) in the reused shards and the survivors; ``stamps``: each listed image's (size, mtime_ns) by path;
    ``files``: each listed image's file (under SRC) by path.
    """

    refs: tuple[ImageRef, ...]
    kept: tuple[SourceRow, ...]
    reused: frozenset[str]
    compacted: frozenset[str]
    survivors: Mapping[str, tuple[tuple[SourceRow, int], ...]]
    classes: tuple[str, ...]
    kept_labels: Mapping[tuple[str, int], int]
    stamps: Mapping[str, tuple[int, int]]
    added: int
    changed: int
    deleted: int
    recompacted: int
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
        return {"added": self.added, "changed": self.changed, "deleted": self.deleted,
                "unchanged": sum(1 for row in self.kept if row.file) + self.recompacted,
                "recompacted": self.recompacted, "compacted_shards": len(self.compacted)}


def stable_classes(before: Sequence[str], listed: Sequence[str]) -> tuple[str, ...]:
    """The version's classes: ``before``'s, in order (each keeps its id), then every new name, sorted."""
    known = set(before)
    return tuple(before) + tuple(sorted(name for name in set(listed) if name not in known))


def new_split(ref: ImageRef, val_fraction: float, seed: int) -> str:
    """A new image's split: with ``--val-fraction``, validation when its carve key is below the fraction of the
    key space (a fixed threshold: no later image moves it), else train; without, the split its folder says."""
    if val_fraction <= 0:
        return ref.split
    key = int.from_bytes(carve_key(seed, ref.relpath), "big")
    return "validation" if key < int(val_fraction * _KEY_SPACE) else "train"


def compare(refs: Iterable[ImageRef], src: str, listed_classes: Sequence[str], previous: Iterable[SourceRow],
            classes_before: Sequence[str], val_fraction: float, seed: int, rehash: bool = False) -> Changes:
    """Compare SRC's ``refs`` (labels index ``listed_classes``) with the ``previous`` version's rows."""
    rows = {row.path: row for row in previous}
    classes = stable_classes(classes_before, listed_classes)
    ids = {name: index for index, name in enumerate(classes)}
    remap = [ids[name] for name in listed_classes]
    convert: list[ImageRef] = []
    kept: dict[str, tuple[SourceRow, ImageRef]] = {}
    stamps: dict[str, tuple[int, int]] = {}
    files: dict[str, str] = {}
    touched: set[str] = set()
    added = changed = 0
    for ref in refs:
        path = display_path(ref.relpath)
        try:
            stat = os.stat(os.path.join(src, ref.relpath))
        except FileNotFoundError:
            continue  # gone since SRC was listed: deleted, as if it had been gone then
        stamp = stamps[path] = (stat.st_size, stat.st_mtime_ns)
        files[path] = os.path.join(src, ref.relpath)
        ref = ref._replace(label=remap[ref.label])
        row = rows.get(path)
        same = None if row is None else _unchanged(row, stamp, files[path], rehash)
        if row is None:
            convert.append(ref._replace(split=new_split(ref, val_fraction, seed)))
            added += 1
        elif same is not None:
            kept[path] = (dataclasses.replace(row, size=stamp[0], mtime_ns=stamp[1], source_sha256=same), ref)
        else:
            convert.append(ref._replace(split=row.split or new_split(ref, val_fraction, seed)))
            changed += 1
            touched.add(row.file)
    deleted = [row for path, row in rows.items() if path not in stamps]
    touched.update(row.file for row in deleted)
    touched.discard("")
    survivors: dict[str, list[tuple[SourceRow, int]]] = collections.defaultdict(list)
    for row, ref in kept.values():
        if row.file in touched:
            survivors[row.file].append((row, ref.label))
    staying = [(row, ref) for row, ref in kept.values() if row.file not in touched]
    kept_labels: collections.Counter[tuple[str, int]] = collections.Counter(
        (row.split, ref.label) for row, ref in kept.values() if row.file)
    return Changes(
        refs=tuple(sorted(convert, key=lambda ref: (ref.split, ref.relpath))),
        kept=tuple(row for row, _ in staying),
        reused=frozenset(row.file for row, _ in staying if row.file),
        compacted=frozenset(touched), classes=classes, kept_labels=dict(kept_labels), stamps=stamps,
        survivors={file: tuple(sorted(rows, key=lambda item: item[0].index)) for file, rows in survivors.items()},
        added=added, changed=changed, deleted=len(deleted), recompacted=sum(map(len, survivors.values())),
        files=files,
    )


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
