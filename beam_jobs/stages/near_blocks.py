"""Stage 6, near (a band value too large for one task): its records spilled, its block grid searched over tasks.

In:  the records of a band value that holds more than a chunk (:class:`bucket_merge.OversizedKey`), streamed
     by its band range's task (:func:`beam_jobs.stages.near_links.find_pairs` calls :func:`spill`).
Out: :func:`spill`: ``near/value-r-k.*`` (``reps``: one record of each class of copies, by hash and thumbnail;
     ``members``: the other records, each after its class's; ``blocks.json``: where each block of reps and its
     members start) and a :class:`BigValue` for the pipeline to deal. :func:`search_block`, a task a block of
     reps: ``pairs-b.jsonl`` and ``leaks-b.jsonl`` beside them (``near/value-r-k.pairs-b.jsonl``), in the range files' formats, which
     :func:`beam_jobs.stages.near_groups.group_near` reads with the ranges' own.

Why (#56 §1: no task holds more than a part's worth of records): a band value's records were one chunk, read
whole by one task whatever their number (~250 bytes a record: a million blank frames in a value took 250 MB),
and its pairs compared in that task alone. Here the range task streams the value into an external sort by
signature (hash, thumbnail, split, record: a class of copies is one run, its first the one
:func:`near_duplicates._signature_firsts` picks), keeps nothing, and the value's reps are cut into blocks of
``B`` (a chunk's records, more only to keep a value within :data:`MAX_BLOCKS` blocks). Task ``i`` holds block
``i`` and one other at a time: it joins block ``i`` with every block ``j >= i`` (links and leaks) and compares
its evaluation reps with the training reps of every block ``j < i`` (leaks only), so each evaluation rep's
closest training partner is found in its own task, and each pair is linked in one task.

The links a task writes are a spanning forest of its pairs (block ``i``'s groups carried from block to
block), not of the value's: a rep of block ``j`` near reps of many blocks is linked once by each of their
tasks, so a value whose reps all look alike writes up to reps x (blocks + 1) / 2 links where one task wrote
reps - 1 (the groups are the same: :func:`near_groups.group_near` joins every link). Values this large are rare
(a 16-bit band value holds N / 65,536 images on average); :data:`MAX_BLOCKS` bounds the factor.
"""

from __future__ import annotations

import json
import math
import struct
import tempfile
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np
from apache_beam.io.filesystem import CompressionTypes

from beam_jobs.files import external_sort, filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.stages import perceptual_hash
from beam_jobs.stages.near_duplicates import _BLOCK, _within, boruvka, member_text, pair_batches

MAX_BLOCKS = 64  # blocks of reps a value is cut into at most (larger blocks past it): tasks, and the links' factor
_REP = struct.Struct(">I")  # a member's class: its rep's place in the value
_PAIRS_AT_ONCE = 1 << 21  # pairs joined into block i's groups at once (Boruvka's arrays: ~100 MB at most)


class BigValue(NamedTuple):
    """A band value spilled by its range's task: ``near/value-r-k.*``, searched in ``blocks`` tasks."""

    near_range: int
    ordinal: int
    blocks: int


def _key(record: bytes) -> bytes:
    """A record as the spill sorts it: hash and thumbnail (its class of copies), split, then the record (its
    place in the value's byte order): a class is one run, led by its first of the earliest split."""
    head = record[:work_records.NEAR_HEAD.itemsize]
    split = work_records.NEAR_HEAD.fields["split"][1]
    phash = work_records.NEAR_HEAD.fields["phash"][1]
    return head[phash:phash + 8] + work_records.near_thumbnails([record]) + head[split:split + 1] + record


_SIGNATURE = 8 + perceptual_hash.THUMB_BYTES  # a sort key's class of copies; the split's byte follows, then the record


def spill(layout: WorkLayout, near_range: int, ordinal: int, records: Iterable[bytes], block_records: int,
          run_bytes: int = external_sort.RUN_BYTES) -> BigValue:
    """Write band value ``ordinal`` of range ``near_range`` (its ``records``, in any order) as reps, members and
    blocks, for :func:`search_block`'s tasks. Memory: the external sort's run (on a local temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="near-value-") as scratch:
        by_signature = external_sort.ExternalSort(scratch, "value", run_bytes)
        position = b""
        for record in records:
            by_signature.add(_key(record))
            position = record[:8]
        reps = members = rep_bytes = member_bytes = 0
        starts, member_starts, last = [], [], None
        with filesystems.whole_file(layout.near_value(near_range, ordinal, "reps")) as rep_file, \
                filesystems.whole_file(layout.near_value(near_range, ordinal, "members")) as member_file:
            for item in by_signature.sorted():
                record = item[_SIGNATURE + 1:]
                if item[:_SIGNATURE] != last:
                    last = item[:_SIGNATURE]
                    if reps % block_records == 0:  # a page of reps; blocks are whole pages
                        starts.append(rep_bytes)
                        member_starts.append(member_bytes)
                    external_sort.write_frames(rep_file, (record,))
                    rep_bytes, reps = rep_bytes + 4 + len(record), reps + 1
                else:
                    external_sort.write_frames(member_file, (_REP.pack(reps - 1) + record,))
                    member_bytes, members = member_bytes + 8 + len(record), members + 1
    pages = math.ceil(len(starts) / MAX_BLOCKS)  # a block's pages: at most MAX_BLOCKS blocks, sized by the reps
    bands = layout.near_bands
    band = int.from_bytes(position, "big") // ((1 << 64) // bands) if bands > 1 else 0
    index = {"band": band, "block": pages * block_records, "reps": reps, "members": members,
             "starts": starts[::pages] + [rep_bytes], "member_starts": member_starts[::pages] + [member_bytes]}
    filesystems.write_text(layout.near_value(near_range, ordinal, "blocks.json"), json.dumps(index))
    return BigValue(near_range, ordinal, len(index["starts"]) - 1)


def values(near_range: int, layout: WorkLayout) -> list[BigValue]:
    """The values range ``near_range``'s task spilled (its listing, written before its pairs)."""
    path = layout.near_values(near_range)
    if not FileSystems.exists(path):
        return []
    return [BigValue(*value) for value in json.loads(filesystems.read_text(path))]


def list_values(layout: WorkLayout, near_range: int, found: Sequence[BigValue]) -> None:
    """Write range ``near_range``'s listing of spilled values (none: no file)."""
    if found:
        filesystems.write_text(layout.near_values(near_range), json.dumps([list(value) for value in found]))


def value_files(layout: WorkLayout, found: Iterable[BigValue], name: str) -> Iterator[str]:
    """The ``pairs`` or ``leaks`` files of every block task of ``found``, in order."""
    for value in sorted(found):
        for block in range(value.blocks):
            yield layout.near_value(value.near_range, value.ordinal, f"{name}-{block:06d}.jsonl")


class _Block(NamedTuple):
    """A block of a value's reps: their records, hashes, thumbnails and split ranks, and the first one's place."""

    first: int
    records: list[bytes]
    hashes: np.ndarray
    thumbnails: np.ndarray
    ranks: np.ndarray
    byte_order: np.ndarray  # each record's place among the block's records in byte order (a leak's tie-break)
    kept: np.ndarray  # an update's kept records (no thumbnail; never leaked)

    @classmethod
    def read(cls, path: str, index: dict, block: int) -> "_Block":
        start, stop = index["starts"][block], index["starts"][block + 1]
        records = list(_read_frames(path, start, stop, max(1, stop - start)))
        heads = np.frombuffer(b"".join(r[:work_records.NEAR_HEAD.itemsize] for r in records), dtype=work_records.NEAR_HEAD)
        thumbnails = np.frombuffer(work_records.near_thumbnails(records), np.uint8).reshape(-1, perceptual_hash.THUMB_BYTES)
        byte_order = np.empty(len(records), dtype=np.int64)
        byte_order[sorted(range(len(records)), key=records.__getitem__)] = np.arange(len(records))
        return cls(block * index["block"], records, heads["phash"].astype(np.uint64), thumbnails,
                   heads["split"].astype(np.int64), byte_order, (heads["hashed"] & work_records.KEPT).astype(bool))

    def subset(self, chosen: np.ndarray) -> "_Block":
        """The block's records ``chosen`` (indices), as a block of their own."""
        return _Block(self.first, [self.records[i] for i in chosen.tolist()], self.hashes[chosen],
                      self.thumbnails[chosen], self.ranks[chosen], self.byte_order[chosen], self.kept[chosen])


def _pairs_between(rows: _Block, columns: _Block, band: int, distance: int, diagonal: bool) -> Iterator[np.ndarray]:
    """The verified pairs ``(2, k)`` (row, column) of two blocks within ``distance`` whose first common band is
    ``band`` (found in an earlier band: not again), in sub-blocks of ``_BLOCK``, row by row."""
    values = rows.hashes if diagonal else np.concatenate([rows.hashes, columns.hashes])
    offset = 0 if diagonal else len(rows.records)
    earlier = np.array(perceptual_hash.band_masks(distance)[:band], dtype=np.uint64)
    for top in range(0, len(rows.records), _BLOCK):
        for left in range(top if diagonal else 0, len(columns.records), _BLOCK):
            found, across = _within(values, top, min(top + _BLOCK, len(rows.records)), offset + left,
                                    offset + min(left + _BLOCK, len(columns.records)), distance)
            across -= offset
            if earlier.size and found.size:
                differ = rows.hashes[found] ^ columns.hashes[across]
                keep = ((differ[:, None] & earlier[None, :]) != 0).all(axis=1)
                found, across = found[keep], across[keep]
            if found.size:
                yield from perceptual_hash.verified_pairs([np.stack([found, across])], rows.thumbnails,
                                                          columns.thumbnails, rows.kept, columns.kept)


class _Leaks:
    """Block ``i``'s evaluation reps with a direct pair in the training split (and, under ``--update``, its new
    training reps with a direct pair among the kept evaluation ones): each one's closest partner (by
    distance, then the partner's record as bytes: the choice :class:`near_leaks.Leaks` makes over a chunk sorted
    as bytes, so a value searched in blocks names the partners it would name searched whole)."""

    def __init__(self, rows: _Block) -> None:
        self.rows = rows
        self.closest: dict[int, tuple[int, bytes]] = {}  # row -> (bits, partner's record)

    def see(self, pairs: np.ndarray, columns: _Block) -> None:
        """Note the pairs (row, column) whose row is an evaluation rep and column a training one (on the
        diagonal either way round)."""
        if columns is self.rows:
            self._see(pairs[::-1], columns)
        self._see(pairs, columns)

    def _see(self, pairs: np.ndarray, columns: _Block) -> None:
        mine, theirs = self.rows.ranks[pairs[0]], columns.ranks[pairs[1]]
        leaked = ~self.rows.kept[pairs[0]] & (  # a kept record never goes: a new training rep near a kept
            ((mine > 0) & (theirs == 0)) | ((mine == 0) & (theirs > 0) & columns.kept[pairs[1]]))  # evaluation one does
        if not leaked.any():
            return
        rows, partners = pairs[0, leaked], pairs[1, leaked]
        bits = np.bitwise_count(self.rows.hashes[rows] ^ columns.hashes[partners]).astype(np.int64)
        order = np.lexsort((columns.byte_order[partners], bits, rows))
        first = np.ones(order.size, dtype=bool)
        first[1:] = rows[order][1:] != rows[order][:-1]
        for row, bit, partner in zip(rows[order][first].tolist(), bits[order][first].tolist(),
                                     partners[order][first].tolist()):
            candidate = (bit, columns.records[partner])
            if row not in self.closest or candidate < self.closest[row]:
                self.closest[row] = candidate


def search_block(task: tuple[BigValue, int], layout: WorkLayout, distance: int) -> int:
    """Block ``b`` of a spilled value (``task``: the value and ``b``): ``pairs-b.jsonl`` (a spanning forest of
    the pairs it joins) and ``leaks-b.jsonl`` (its evaluation images, reps and their copies, with a direct pair
    in the training split: each one's closest partner). Returns the links written; a block whose pairs file
    exists (a killed run this one resumes) is not searched again. Memory: two blocks of reps, block ``b``'s
    leaks; the lines go to the files as they are found."""
    value, block = task
    out = layout.near_value(value.near_range, value.ordinal, f"pairs-{block:06d}.jsonl")
    if FileSystems.exists(out):
        return sum(1 for _ in _lines(out))
    index = json.loads(filesystems.read_text(layout.near_value(value.near_range, value.ordinal, "blocks.json")))
    reps = layout.near_value(value.near_range, value.ordinal, "reps")
    rows = _Block.read(reps, index, block)
    leaks = _Leaks(rows)
    label = np.arange(len(rows.records))  # block b's groups, each named by its first row
    with filesystems.whole_file(out) as pairs_file:  # closed last: it marks the block done
        links = _Writer(pairs_file)
        for other in range(value.blocks):
            columns = rows if other == block else _Block.read(reps, index, other)
            if other < block:  # their pairs with ours are linked in their tasks: only the leaks of ours here
                _leaks_before(rows, columns, index["band"], distance, leaks)
            else:
                found = _pairs_between(rows, columns, index["band"], distance, diagonal=other == block)
                label = _link(rows, columns, _seen(found, leaks, columns), label, links)
        leak_path = layout.near_value(value.near_range, value.ordinal, f"leaks-{block:06d}.jsonl")
        with filesystems.whole_file(leak_path) as leak_file:
            _copies(layout, value, index, block, leaks, links, _Writer(leak_file))
    return links.count


class _Writer:
    """Lines written to a file as they come, counted."""

    def __init__(self, handle) -> None:
        self.handle, self.count = handle, 0

    def add(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.handle.write((line + "\n").encode("utf-8"))
            self.count += 1


def _leaks_before(rows: _Block, columns: _Block, band: int, distance: int, leaks: _Leaks) -> None:
    """The leaks of block b's evaluation reps to the training reps of an earlier block: those rows against
    those columns only (a fifth of the rows against four fifths of the columns at 80/10/10 splits, not the
    whole block pair: comparing it all made a spilled value cost twice its search whole)."""
    for leaking, partners in ((rows.ranks > 0, columns.ranks == 0),  # and an update's new training reps near
                              ((rows.ranks == 0) & ~rows.kept, (columns.ranks > 0) & columns.kept)):  # kept ones
        evaluation, training = np.flatnonzero(leaking), np.flatnonzero(partners)
        if not (evaluation.size and training.size):
            continue
        for pairs in _pairs_between(rows.subset(evaluation), columns.subset(training), band, distance, diagonal=False):
            leaks.see(np.stack([evaluation[pairs[0]], training[pairs[1]]]), columns)


def _seen(pairs: Iterable[np.ndarray], leaks: _Leaks, columns: _Block) -> Iterator[np.ndarray]:
    for block in pairs:
        leaks.see(block, columns)
        yield block


def _link(rows: _Block, columns: _Block, pairs: Iterable[np.ndarray], label: np.ndarray, links: _Writer) -> np.ndarray:
    """Join block b's groups (``label``) along the pairs with ``columns``, a link line for each pair that joins
    two groups (ids: rows ``0..n``, columns ``n..``; on the diagonal rows only); returns block b's groups after."""
    diagonal = columns is rows
    size = len(rows.records)
    joined = label if diagonal else np.concatenate([label, np.arange(size, size + len(columns.records))])
    for first, second in pair_batches(pairs, _PAIRS_AT_ONCE):
        chosen = boruvka(first, second if diagonal else second + size, joined)
        links.add(f"[{member_text(rows.records[a])}, {member_text(columns.records[b])}]"
                  for a, b in zip(first[chosen].tolist(), second[chosen].tolist()))
    if diagonal:
        return joined
    lowest = np.full(joined.size, size, dtype=np.int64)  # each group named by its first row again
    np.minimum.at(lowest, joined[:size], np.arange(size))
    return lowest[joined[:size]]


def _copies(layout: WorkLayout, value: BigValue, index: dict, block: int, leaks: _Leaks, links: _Writer,
            leak_lines: _Writer) -> None:
    """The block's leak lines: each leaked rep, and each of its copies (of an evaluation split, as it is) with
    the rep's partner; in band 0 each copy's link to its rep, and each copy of a training rep in an evaluation
    split as a leak at distance 0 (copies share every band: they are joined once, in band 0)."""
    rows, band = leaks.rows, index["band"]
    for row in sorted(leaks.closest):
        bits, partner = leaks.closest[row]
        leak_lines.add([f"[{member_text(rows.records[row])}, {member_text(partner)}, {bits}]"])
    if not (leaks.closest or band == 0):
        return
    split = work_records.NEAR_HEAD.fields["split"][1] + _REP.size
    path = layout.near_value(value.near_range, value.ordinal, "members")
    for framed in _read_frames(path, index["member_starts"][block], index["member_starts"][block + 1]):
        row = _REP.unpack_from(framed)[0] - rows.first
        record, rank = framed[_REP.size:], framed[split]
        kept = bool(framed[split + _HASHED_AFTER_SPLIT] & work_records.KEPT)  # never leaked
        if band == 0 and not (kept and rows.kept[row]):  # two kept records: the version that converted them linked them
            links.add([f"[{member_text(rows.records[row])}, {member_text(record)}]"])
            if rank > 0 and rows.ranks[row] == 0 and not kept:
                leak_lines.add([f"[{member_text(record)}, {member_text(rows.records[row])}, 0]"])
        if row in leaks.closest and not kept:  # (a class's copies are of its rep's split or later)
            bits, partner = leaks.closest[row]
            leak_lines.add([f"[{member_text(record)}, {member_text(partner)}, {bits}]"])


_HASHED_AFTER_SPLIT = work_records.NEAR_HEAD.fields["hashed"][1] - work_records.NEAR_HEAD.fields["split"][1]


def _read_frames(path: str, start: int, stop: int, read_bytes: int = 1 << 16) -> Iterator[bytes]:
    """The frames of ``path`` from ``start`` to ``stop``, read ``read_bytes`` at a time."""
    tail = b""
    while start < stop:
        size = min(read_bytes, stop - start)
        data = tail + work_records.read_span(path, start, size)
        start += size
        position = 0
        while position + 4 <= len(data) and position + 4 + _REP.unpack_from(data, position)[0] <= len(data):
            length = _REP.unpack_from(data, position)[0]
            yield data[position + 4:position + 4 + length]
            position += 4 + length
        tail = data[position:]
    if tail:
        raise work_records.WorkFileError(f"{path}: a spilled band value's members end inside a record")


def _lines(path: str) -> Iterator[bytes]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        yield from handle
