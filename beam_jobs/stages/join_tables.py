"""Stage 5b: join a split's shard tables into its records table, once every shard of the split is written.

In:  ``(split, [num_shards, ...])`` (the split's shard results, only counted: they say every shard and its
     rows are written), and each shard's rows, ``tables/<split>-SSSSSS.parquet`` in the work folder, which
     the shard's writer wrote before its result (:class:`beam_jobs.stages.write.ShardRows`).
Out: ``<split>.records.parquet`` in staging (:mod:`record_files.records_table`: published with the shards or
     not at all), and ``tables/<split>.json`` in the work folder, written last: the manifest's
     ``records_table`` entry (file, rows, bytes, SHA-256), and the mark that the table is whole, so a resumed
     run does not join it again. Memory: one row group (at most 65,536 rows) and the figures.

The table's bytes are a function of its rows, in shard order, so a rerun, a resumed run and every runner
write the same file.
"""

from __future__ import annotations

import json
from typing import Iterable

import record_schema
from beam_jobs.files import filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from record_files import records_table


class TableCountError(RuntimeError):
    """A split's shard tables hold another number of rows than its shards hold records: a lost work file."""


def join_split(layout: WorkLayout, staging: str, split: str, num_shards: int, num_records: int) -> dict:
    """Join ``split``'s ``num_shards`` shard tables (``num_records`` rows in all) into its records table.

    Returns the manifest's ``records_table`` entry; a split joined by a killed run this one resumes is not
    joined again.
    """
    done = layout.table_result(split)
    if FileSystems.exists(done):
        return json.loads(filesystems.read_text(done))
    name = record_schema.records_table_filename(split)
    with filesystems.whole_file(FileSystems.join(staging, name)) as handle:
        written = records_table.join_tables(_parts(layout, split, num_shards), handle, split)
    if written.num_rows != num_records:
        raise TableCountError(f"the records table of split {split} got {written.num_rows} rows from its shards' "
                              f"tables, and its shards hold {num_records} records: a work file was lost or replaced")
    entry = {"file": name, "num_rows": written.num_rows, "num_bytes": written.num_bytes, "sha256": written.sha256}
    filesystems.write_text(done, json.dumps(entry, sort_keys=True))
    return entry


def _parts(layout: WorkLayout, split: str, num_shards: int) -> Iterable:
    """Each shard's table, in shard order, opened one at a time."""
    for shard in range(num_shards):
        with FileSystems.open(layout.table_part(split, shard)) as handle:
            yield handle


def read_entries(layout: WorkLayout) -> dict[str, dict]:
    """Each joined split's ``records_table`` entry (for the manifest), by split."""
    entries = {}
    for split in record_schema.SPLITS:
        path = layout.table_result(split)
        if FileSystems.exists(path):
            entries[split] = json.loads(filesystems.read_text(path))
    return entries
