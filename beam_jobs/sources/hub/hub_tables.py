"""A Parquet or Arrow file read by groups (Parquet row groups, Arrow record batches), columns at a time.

In:  a file of a Hugging Face dataset (Parquet anywhere Beam reads; Arrow on a local disk, mapped).
Out: its schema, its groups' row counts, and the values of the columns asked for in one group: the launcher
     reads the small ones (labels, image paths), a worker one group's images.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from beam_jobs.files.filesystems import FileSystems, open_for_ranges
from beam_jobs.planning.discover import InputError
from beam_jobs.sources.hub.hub_files import full_path

class _ParquetTable:
    """A Parquet file read by row groups; each read a ranged one (its footer, then the columns asked for)."""

    def __init__(self, handle) -> None:
        import pyarrow.parquet as pq

        self._file = pq.ParquetFile(handle)
        self.schema = self._file.schema_arrow
        self.num_groups = self._file.metadata.num_row_groups

    def group_rows(self) -> list[int]:
        return [self._file.metadata.row_group(i).num_rows for i in range(self.num_groups)]

    def group(self, index: int, columns: Sequence[str]) -> list[list]:
        table = self._file.read_row_group(index, columns=list(columns))
        flat = table.flatten()  # a struct's field by its dotted name (image.path); a whole struct by its own
        return [(flat if "." in name else table).column(name).to_pylist() for name in columns]


class _ArrowTable:
    """An Arrow IPC file (``save_to_disk``'s, the HF cache's) mapped into memory: its record batches are the
    groups, read without a copy (only the pages of the columns asked for are read from disk)."""

    def __init__(self, source) -> None:
        import pyarrow as pa

        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            self.batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        else:
            self.batches = list(reader)
        self.schema = reader.schema
        self.num_groups = len(self.batches)

    def group_rows(self) -> list[int]:
        return [batch.num_rows for batch in self.batches]

    def group(self, index: int, columns: Sequence[str]) -> list[list]:
        batch, values = self.batches[index], []
        for name in columns:
            column, _, child = name.partition(".")
            array = batch.column(column)
            values.append((array.field(child) if child else array).to_pylist())
        return values


class ArrowNotLocalError(InputError):
    """An Arrow file in an object store: a usage error, never taken for a damaged file."""


@contextlib.contextmanager
def open_table(src: str, path: str) -> Iterator:
    """A Parquet or Arrow file of the dataset, open for reading by groups (row groups, record batches)."""
    full = full_path(src, path)
    if not full.lower().endswith(".arrow"):
        with open_for_ranges(full) as handle:
            yield _ParquetTable(handle)
        return
    if FileSystems.get_scheme(full) not in (None, "file"):
        raise ArrowNotLocalError(f"{full}: Arrow files are read from a local disk (they are mapped into memory); "
                                 "copy the dataset's folder to one, or convert its Parquet files")
    import pyarrow as pa

    with pa.memory_map(full[len("file://"):] if full.startswith("file://") else full) as source:
        yield _ArrowTable(source)


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged Parquet file raises: pyarrow's own errors (some are not ValueErrors), and I/O's.

    Callers catch :class:`ArrowNotLocalError` (a ValueError too) before these: it is the user's to fix, not a
    damaged file to count as rejected.
    """
    import pyarrow.lib

    return (OSError, ValueError, EOFError, pyarrow.lib.ArrowException)


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
