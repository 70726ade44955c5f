"""The records an update keeps, fed to the narrowed conversion's duplicate searches (issue #59: a new validation
image that copies an old training one is a leak).

In:  the comparison's :class:`beam_jobs.planning.changes.Changes` (the shards reused whole; per shard that lost
     records, its survivors) and the latest version's manifest and records tables (each record's split, class
     ids, stored size, SHA-256 and perceptual hash, ``path``; :mod:`record_files.records_table`).
Out: in the narrowed conversion's work folder, per chunk of :data:`CHUNK` kept records (in the tables' order),
     ``content/kept-K`` (CONTENT records sorted by SHA-256, bucketed by the layout's hash ranges) and, when the
     run searches near-duplicates, ``near/kept-K`` (NEAR records sorted by band position, bucketed by its band
     ranges): the files a part's validation writes, which the searches merge with the parts' own
     (:meth:`beam_jobs.files.work_layout.WorkLayout.content_inputs` / ``near_inputs``).

No image byte is read: a kept record enters from its table row (:func:`work_records.encode_kept_content`), marked
``KEPT``. Its thumbnail was never kept (a conversion's work files are removed when it publishes), so a pair of a
kept record and a new one is judged on the hash distance alone, and a pair of two kept records is not reported
again (:func:`beam_jobs.stages.perceptual_hash.verified_pairs`); a kept record is never dropped (it is in a
reused shard). Memory: one chunk's records (about 700 bytes a record at the default distance), whatever N;
time linear in the kept records. A split whose latest version lists no records table (an update before tables)
feeds none (logged).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterator, Mapping

import numpy as np

import record_schema
from beam_jobs.files import store_files, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning import changes as change_plan
from beam_jobs.stages.near_duplicates import near_records
from record_files.records_table import RecordsTable

logger = logging.getLogger(__name__)

CHUNK = 1 << 14  # kept records a file holds: sorted in memory as a part's are (about 11 MB at distance 3)
_COLUMNS = ("shard", "index", "classes", "image_bytes", "sha256", "perceptual_hash", "path")


@dataclasses.dataclass(frozen=True)
class KeptRecords:
    """The records an update keeps (``count``), and where their rows are: what :func:`write` feeds the searches."""

    out: str
    manifest: Mapping  # the latest version's
    reused: frozenset
    survivors: Mapping[str, np.ndarray]
    count: int
    chunk: int = CHUNK

    @classmethod
    def of(cls, out: str, manifest: Mapping, found: change_plan.Changes, chunk: int = CHUNK) -> "KeptRecords":
        return cls(out, manifest, found.reused, found.survivors, found.counts()["unchanged"], chunk)

    def rows(self) -> Iterator[bytes]:
        """Each kept record's CONTENT record, split by split in the tables' order; nothing of a split without a
        table."""
        task = self.manifest.get("task", record_schema.TASK_CLASSIFICATION)
        for split, entry in self.manifest["splits"].items():
            listed = entry.get("records_table")
            if not listed:
                if entry.get("shards"):
                    logger.info("split %s of the latest version lists no records table: its kept records are not "
                                "searched for near-duplicates of the new images", split)
                continue
            shards = [shard["file"] for shard in entry["shards"]]
            for group in _row_groups(self.out, listed["file"], _COLUMNS):
                if not group.num_rows:
                    continue
                name = shards[int(group.column("shard")[0].as_py())]
                keep = self._kept(name, group.column("index").to_numpy())
                if not keep.any():
                    continue
                columns = group.to_pydict()
                for row in np.flatnonzero(keep).tolist():
                    classes = columns["classes"][row]
                    objects = task == record_schema.TASK_OBJECTS
                    yield work_records.encode_kept_content(
                        columns["sha256"][row], split, 0 if objects or not classes else max(classes[0], 0),
                        columns["perceptual_hash"][row], columns["image_bytes"][row],
                        len(classes) if objects else 0, columns["path"][row])

    def objects(self) -> int:
        """The objects the kept records hold (their rows' class ids: what was written, not what SRC lists), for
        ``--max-bad-fraction`` over the version. Streams the tables' ``classes``; 0 without tables."""
        found = 0
        for entry in self.manifest["splits"].values():
            if not entry.get("records_table"):
                continue
            shards = [shard["file"] for shard in entry["shards"]]
            for group in _row_groups(self.out, entry["records_table"]["file"], ("shard", "index", "classes")):
                if group.num_rows:
                    keep = self._kept(shards[int(group.column("shard")[0].as_py())], group.column("index").to_numpy())
                    found += int(np.diff(group.column("classes").combine_chunks().offsets.to_numpy())[keep].sum())
        return found

    def _kept(self, name: str, index: np.ndarray) -> np.ndarray:
        if name in self.reused:
            return np.ones(len(index), bool)
        return np.isin(index, self.survivors.get(name, np.zeros(0, np.int64)))

    def write(self, layout: WorkLayout) -> int:
        """Write the kept records' files into ``layout``'s work folder (``layout.kept_parts`` of them: those of
        a chunk beyond the rows found are empty); a file found whole (a resumed update) is not written again.
        Returns the records written."""
        written, rows = 0, self.rows()
        for kept in range(layout.kept_parts):
            chunk = [row for _, row in zip(range(self.chunk), rows)]
            written += len(chunk)
            if FileSystems.exists(layout.content_kept(kept)) and (
                    not layout.near_bands or FileSystems.exists(layout.near_kept(kept))):
                continue
            chunk.sort()
            if layout.near_bands:
                work_records.write_file(layout.near_kept(kept), work_records.NEAR,
                                        near_records(chunk, layout.near_bands - 1), layout.near_ranges)
            work_records.write_file(layout.content_kept(kept), work_records.CONTENT, chunk, layout.hash_ranges)
        if next(rows, None) is not None:  # the tables hold more kept rows than the comparison counted
            logger.warning("the latest version's records tables hold more kept records than the %d its sources "
                           "table counts: those past them are not searched for near-duplicates", self.count)
        return written


def _row_groups(out: str, name: str, columns) -> Iterator:
    """The row groups of OUT's records table ``name`` (on disk or in a store), ``columns`` only."""
    with store_files.open_in(out, name) as handle:
        yield from RecordsTable(handle, store_files.path_in(out, name)).row_groups(columns)
