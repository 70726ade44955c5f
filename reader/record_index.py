"""Record indexes make starts inside a shard fast; they never make reading fail.

Each shard's ``.idx`` (``offset size`` per record, NVIDIA DALI's format)
lets a stream or a resume start inside the shard with one seek. Datasets get
copied with ``cp *.tfrecord``, ``gsutil cp``, ``aws s3 sync --exclude`` or
rsync filters, so an index can be missing, cut short or replaced by garbage.
Reading then falls back to reading through the records before the start:
the same records, only slower to reach. Two checks, both cheap:

- when a pipeline is built (:func:`usable`): one listing of the shards'
  folder says which indexes exist and their sizes; an index whose size
  differs from the one the manifest records (or, for datasets written before
  sizes were recorded, is implausible for its record count) is not used.
  One warning names how many shards lack a usable index and the command that
  rebuilds them (:func:`rebuild`, ``python -m converter reindex OUT``);
- when an index is read (:func:`record_files.idx.offset_of` in Python, the
  graph's lookup in :mod:`reader.records`): its lines must parse and chain (each
  offset the previous offset plus size) up to the record wanted; otherwise
  the read goes through, as without one.

No O(records) work at build time: 1,024 shards cost one listing (a stat per
file locally; on S3, 1,000 keys a request).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Iterable, Optional, Sequence

from reader import storage
from reader.info import ShardInfo, SplitInfo, dataset_info, version_numbers
from reader.frames import file_sha256, iter_frames
from record_files import idx

logger = logging.getLogger(__name__)



def rebuild_command(data_dir: str) -> str:
    return f"python -m converter reindex {data_dir}"


def list_folders(paths: Iterable[str]) -> dict[str, dict[str, Optional[int]]]:
    """Folder -> (name -> size) of the folders holding ``paths``: one listing per folder."""
    return {folder: storage.list_sizes(folder) for folder in sorted({os.path.dirname(path) for path in paths})}


def problem(shard: ShardInfo, listings: dict[str, dict[str, Optional[int]]]) -> Optional[str]:
    """Why ``shard``'s index cannot be used, judged from a listing ("missing", "damaged"), or None."""
    if not shard.index_path:
        return None  # none was written (a dataset from before indexes): read through, as documented
    folder, name = os.path.split(shard.index_path)
    listing = listings.get(folder, {})
    if name not in listing:
        return "missing"
    size = listing[name]
    if size is None:
        return None  # a listing without sizes (gs://): the read checks the lines themselves
    if shard.index_bytes:
        return None if size == shard.index_bytes else "damaged"
    return None if idx.plausible_size(size, shard.records_in_file) else "damaged"


def usable(split: SplitInfo, listings: Optional[dict[str, dict[str, Optional[int]]]] = None) -> SplitInfo:
    """``split`` with the index of each shard whose index is missing or damaged left out, and one warning."""
    listings = listings if listings is not None else list_folders(shard.index_path or shard.path
                                                                  for shard in split.shards)
    bad = {shard.path: problem(shard, listings) for shard in split.shards}
    bad = {path: why for path, why in bad.items() if why}
    if not bad:
        return split
    first = next(shard.index_path for shard in split.shards if shard.path in bad)
    counts = {why: sum(1 for w in bad.values() if w == why) for why in ("missing", "damaged")}
    data_dir = os.path.dirname(first)
    logger.warning("split %s: %d of its %d shards have no usable record index (%s; the first: %s), so starts inside "
                   "them read through the records before (the same records, reached more slowly). Rebuild the "
                   "indexes with: %s", split.name, len(bad), len(split.shards),
                   ", ".join(f"{n} {why}" for why, n in counts.items() if n), first, rebuild_command(data_dir))
    shards = tuple(dataclasses.replace(shard, index_path="", index_bytes=0) if shard.path in bad else shard
                   for shard in split.shards)
    return dataclasses.replace(split, shards=shards)


def extent_offsets(extents: Sequence[ShardInfo]) -> list[int]:
    """The byte offset of each extent's first record, for reading a masked version's runs without a lookup each.

    A masked file is read as ~10 runs after 10 updates: the graph's lookup (:func:`reader.records.record_offset`,
    its ``.idx`` read and checked again for every run) cost more than reading the run's records did. Here each
    local file's index is read once, when the pipeline is built, and checked as that lookup checks it
    (:func:`record_files.idx.sound_offsets`). 0 for an extent from record 0; -1 where no sound local index gives
    it (none, unreadable, cut short, or in an object store: fetched where the run is read, as before), which
    the reader then looks up itself, or reads through. Memory: one file's offsets at a time.
    """
    return run_offsets([extent.index_path for extent in extents], [extent.first for extent in extents])


def run_offsets(index_paths: Sequence[str], firsts: Sequence[int]) -> list[int]:
    """:func:`extent_offsets` of extents given as their files' index paths and first records."""
    offsets, file, known = [], None, []
    for index_path, first in zip(index_paths, firsts):
        if first == 0:
            offsets.append(0)
            continue
        if not index_path or ("://" in index_path and not index_path.startswith("file://")):
            offsets.append(-1)
            continue
        if index_path != file:  # a file's extents come one after another in a split
            file, known = index_path, _local_offsets(index_path)
        offsets.append(known[first] if first < len(known) else -1)
    return offsets


def runs_by_file(extents: Sequence[ShardInfo]) -> list[range]:
    """The places of a split's extents, grouped by file: each group one file's runs, in file order.

    A manifest lists a masked file once, its ``live`` runs ascending, so a file's extents come one after another
    in a split (as :func:`run_offsets` relies on too); a whole file is a group of one.
    """
    groups: list[range] = []
    for place, extent in enumerate(extents):
        if groups and extents[groups[-1].start].path == extent.path:
            groups[-1] = range(groups[-1].start, place + 1)
        else:
            groups.append(range(place, place + 1))
    return groups


def _local_offsets(index_path: str) -> list[int]:
    """The sound offsets of a local index (none when it cannot be read: the reader reads through, as ever)."""
    try:
        with open(index_path.removeprefix("file://"), "rb") as handle:
            return idx.sound_offsets(handle.read())
    except OSError:
        return []


def index_text(path: str) -> str:
    """The record index of a TFRecord file, read from its frames (both CRCs of every record checked)."""
    return idx.index_text(iter_frames(path))


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """What :func:`rebuild` did."""

    written: tuple[str, ...]  # index files written
    intact: int  # indexes left as they were
    failed: tuple[str, ...]  # shards whose index could not be rebuilt, each with why
    unindexed: int = 0  # shards the manifest names no index for (datasets written before indexes)

    def format(self) -> str:
        lines = [f"rebuilt {len(self.written)} record index{'es' if len(self.written) != 1 else ''}, "
                 f"{self.intact} intact"]
        lines += [f"  wrote {path}" for path in self.written[:20]]
        if len(self.written) > 20:
            lines.append(f"  ... and {len(self.written) - 20} more")
        lines += [f"  not rebuilt: {why}" for why in self.failed]
        if self.unindexed:
            lines.append(f"{self.unindexed} shards have no index in the manifest (converted before indexes were "
                         "written): convert again to add them; they read correctly without")
        return "\n".join(lines)


def rebuild(data_dir: str, every: bool = False) -> Rebuilt:
    """Write the record index of each shard of ``data_dir`` whose index is missing or damaged (``every``: all).

    A shard is indexed only when it is the one the manifest describes (its
    size and SHA-256 match): an index of another file would be worse than none.
    The manifest is never changed, so the dataset's fingerprint (and every
    saved :class:`reader.Position`) stays valid. A dataset that grows (``--update``): the shards of every
    version not pruned, each once (a copy without its ``.idx`` files lost those of every version).
    """
    dataset_info(data_dir)  # not a dataset: the error that names why
    shards = list({shard.path: shard for number in version_numbers(data_dir)
                   for split in dataset_info(data_dir, version=number).splits.values()
                   for shard in split.shards}.values())
    listings = list_folders([shard.path for shard in shards] + [s.index_path for s in shards if s.index_path])
    written, intact, failed = [], 0, []
    for shard in shards:
        if not shard.index_path:
            continue
        if not every and problem(shard, listings) is None and _sound(shard):
            intact += 1
            continue
        why = _not_the_manifests(shard, listings)
        if why:
            failed.append(f"{shard.path}: {why}")
            continue
        text = index_text(shard.path).encode("ascii")
        if shard.index_bytes and len(text) != shard.index_bytes:
            failed.append(f"{shard.path}: its index would be {len(text)} bytes, the manifest says {shard.index_bytes}")
            continue
        storage.write_bytes(shard.index_path, text)
        written.append(shard.index_path)
    return Rebuilt(tuple(written), intact, tuple(failed), sum(1 for shard in shards if not shard.index_path))


def _sound(shard: ShardInfo) -> bool:
    """The whole index chains and ends where the shard ends (read in full: the rebuild command may take time)."""
    try:
        text = storage.read_bytes(shard.index_path)
    except (FileNotFoundError, OSError):
        return False
    return idx.is_complete(text, shard.records_in_file, shard.num_bytes)


def _not_the_manifests(shard: ShardInfo, listings: dict[str, dict[str, Optional[int]]]) -> Optional[str]:
    """Why ``shard``'s file is not the one the manifest describes, or None."""
    folder, name = os.path.split(shard.path)
    if name not in listings.get(folder, {}):
        return "the shard itself is missing"
    size = storage.size(shard.path)
    if size != shard.num_bytes:
        return f"{size} bytes, the manifest says {shard.num_bytes}"
    if shard.sha256 and file_sha256(shard.path) != shard.sha256:
        return "its SHA-256 differs from the manifest's"
    return None
