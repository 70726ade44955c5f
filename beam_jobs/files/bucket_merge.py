"""One key bucket of many sorted work files, merged in key order, a bounded chunk at a time.

In:  the paths of sorted work files of one kind (a part's each) and a bucket number.
Out: :func:`key_chunks`: the bucket's records of every file in byte order, as consecutive sorted chunks of
     about ``chunk_records`` records, cut only where the 8-byte key changes (a key's records are in one chunk).

Why (#56 §1): a task that reads a bucket of every part whole holds the bucket's records of the run, which
grows with the part size (N / 64 images until the part cap): the near search's band range held ~1.2 KB a
record, 26 MB at 1M images and 258 MB at 10M. Each file's bucket is already sorted, so the task can take
them a piece at a time: from each file the records below the smallest key any file has not read past, a
sort of those (C's, on bytes), and on. Memory: a chunk, and ``read_bytes`` of each file read ahead; a key
that holds more records than a chunk (a band value shared by a million blank frames) is one chunk whole, or,
asked for, a stream the caller spills (:mod:`beam_jobs.stages.near_blocks`).
"""

from __future__ import annotations

import bisect
import itertools
from typing import Iterator, NamedTuple, Optional, Sequence, Union

import numpy as np

from beam_jobs.files import work_records

KEY = 8  # the bytes of a record's key that chunks are cut at (a NEAR record's band position)
# Read from a file at a time: about 400 NEAR records; a task merging 1,000 parts holds 64 MB of them at most,
# and a part's bucket is read in a few requests (the object stores' cost is per request).
READ_BYTES = 1 << 16


class _Reader:
    """One file's bucket, read ``read_bytes`` at a time (the file reopened for each piece, so a task merging a
    thousand parts holds no thousand open files), its records and their keys pending until taken."""

    def __init__(self, path: str, kind: int, bucket: int, read_bytes: int) -> None:
        self.path, self.read_bytes = path, read_bytes
        self.offset, self.stop = work_records.bucket_span(path, kind, bucket)
        self.tail = b""
        self.records: list[bytes] = []
        self.keys: list[bytes] = []

    def fill(self, want: int) -> None:
        """Read on until ``want`` records are pending or the bucket is read."""
        while len(self.records) < want and self.offset < self.stop:
            size = min(self.read_bytes, self.stop - self.offset)
            data = self.tail + work_records.read_span(self.path, self.offset, size)
            self.offset += size
            records, used = work_records.whole_records(data)
            self.tail = data[used:]
            if self.offset >= self.stop and self.tail:
                raise work_records.WorkFileError(f"{self.path}: a bucket ends inside a record")
            self.records += records
            self.keys += [record[:KEY] for record in records]

    def take_below(self, key: bytes) -> list[bytes]:
        """The pending records whose key is below ``key`` (they come first: the file is sorted)."""
        cut = bisect.bisect_left(self.keys, key)
        taken = self.records[:cut]
        del self.records[:cut], self.keys[:cut]
        return taken

    def key_pieces(self, key: bytes) -> Iterator[list[bytes]]:
        """Every record of the bucket whose key is ``key``, a read's worth at a time (reading on as far as they go)."""
        while True:
            cut = bisect.bisect_right(self.keys, key)
            taken = self.records[:cut]
            del self.records[:cut], self.keys[:cut]
            if taken:
                yield taken
            if self.records or self.offset >= self.stop:
                return
            self.fill(1)


class OversizedKey(NamedTuple):
    """A key holding more records than a chunk (:func:`key_chunks` with ``oversized``): its ``records``, an
    iterator the caller must exhaust before it asks for the next chunk, in no order (each file's in turn)."""

    key: bytes
    records: Iterator[bytes]


def key_chunks(paths: Sequence[str], kind: int, bucket: int, chunk_records: int, read_bytes: int = READ_BYTES,
               oversized: Optional[int] = None) -> Iterator[Union[list[bytes], OversizedKey]]:
    """The records of bucket ``bucket`` of every file of ``paths`` (sorted files of ``kind``), in byte order, as
    sorted chunks of about ``chunk_records`` records that never split one key's records.

    Every chunk holds the records below a cut: the smallest key among the last records each file has pending
    (no file holds a record below it that is not pending), so the chunks joined are the bucket's records
    sorted, as reading every file's bucket whole and sorting would give them. ``oversized``: a key of more
    records than that comes as an :class:`OversizedKey` (streamed, not held) in its place; None: as a chunk."""
    readers = [_Reader(path, kind, bucket, read_bytes) for path in paths]
    share = max(1, chunk_records // max(1, len(readers)))
    while True:
        for reader in readers:
            reader.fill(share)
        live = [reader for reader in readers if reader.records]
        if not live:
            return
        open_ends = [reader.keys[-1] for reader in live if reader.offset < reader.stop]
        if not open_ends:  # every file read to its end: the rest is one chunk
            chunk = [record for reader in live for record in reader.take_below(b"\xff" * (KEY + 1))]
        else:
            cut = min(open_ends)
            chunk = [record for reader in live for record in reader.take_below(cut)]
            if not chunk:  # one key holds more than a file's share: all of its records, whatever they take
                records = (record for reader in live for piece in reader.key_pieces(cut) for record in piece)
                if oversized is None:
                    chunk = list(records)
                else:
                    chunk = list(itertools.islice(records, oversized + 1))
                    if len(chunk) > oversized:  # streamed, not held (#56 §1: no task holds a band value whole)
                        yield OversizedKey(cut, itertools.chain(chunk, records))
                        continue
        chunk.sort()
        yield from _oversized_apart(chunk, oversized)


def _oversized_apart(chunk: list[bytes], oversized: Optional[int]) -> Iterator[Union[list[bytes], OversizedKey]]:
    """A sorted chunk, with each key of more than ``oversized`` records apart as an :class:`OversizedKey` (a
    chunk read ahead may hold one whole: its search still goes to the block tasks), the rest as chunks."""
    if oversized is None or len(chunk) <= oversized:
        yield chunk
        return
    keys = np.frombuffer(b"".join(record[:KEY] for record in chunk), dtype=">u8")
    if not (keys[oversized:] == keys[:-oversized]).any():  # no key holds more than ``oversized`` records
        yield chunk
        return
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    stops = np.append(starts[1:], len(chunk))
    taken = 0
    for start, stop in zip(starts.tolist(), stops.tolist()):
        if stop - start > oversized:
            if start > taken:
                yield chunk[taken:start]
            yield OversizedKey(chunk[start][:KEY], iter(chunk[start:stop]))
            taken = stop
    if taken < len(chunk):
        yield chunk[taken:]
