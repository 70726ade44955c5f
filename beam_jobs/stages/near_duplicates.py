"""Stage 2's band records and stage 6's search kernels: which images look alike (perceptual hashes within a
distance), within and across splits.

In:  a part's CONTENT records (stage 2: :func:`near_records` writes ``near/part-P``, one NEAR record per band of
     each image's 64-bit hash, sorted by the band's position); a chunk of a band range's sorted NEAR records
     (stage 6: :func:`pair_indices`).
Out: NEAR records; the pairs within the distance among a chunk's records, each once, in the order a union-find
     takes them, and the links that join groups (:func:`spanning_links`). The band range's task that reads
     the records and writes ``near/pairs-r.jsonl`` and ``near/leaks-r.jsonl`` is
     :mod:`beam_jobs.stages.near_links`; the groups, :mod:`beam_jobs.stages.near_groups`.

Why bands: two 64-bit hashes within distance ``d`` agree exactly on at least one of ``d + 1`` disjoint
bands (pigeonhole), so comparing only images that share a band's value finds every pair, and a range of
band values is a task of bounded size. A pair that agrees on several bands is kept in its first one only,
so each pair is written once. Byte-identical images (same SHA-256) are compared once: the copies are
linked to their first copy at distance 0 (they are the exact search's groups too).

How fast (#49): every test on a band value's images is numpy over blocks of their hashes (the distance, the
"a < b" and the "first common band" filter), and the spanning forest is found in numpy over integer image
ids (:func:`spanning_links`, the same links a union-find taking the pairs in order writes): Python touches
only the links written. The comparisons still grow with the square of a band value's images (about n/45
of them for hashes spread evenly, more for alike photos), at a few ns a pair: ``bench/near_search.py``
measures it, and what wider bands probed within a radius (multi-index hashing) would save.

Why Boruvka in numpy, not ``scipy.sparse.csgraph`` (#58): the links a range writes are the spanning forest a
union-find taking its pairs in order writes (what the link files have always held, byte for byte), which
``connected_components`` does not give, and the groups need the same rounds over integer ids: 40 lines of numpy
serve both, where scipy would be a dependency of the core install (every Dataflow worker) for one of them.

Why the default distance is 3 (#56): four bands of 16 bits, so a band value holds N / 65,536 images on average
and the comparisons are about N**2 / 32,768 (1e9 at 10M images) where 10's eleven bands of 5-6 bits held
N / 64 each (N**2 / 10). :func:`perceptual_hash.expected_candidates` gives the figure for any distance.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii as _json_text
from typing import Iterable, Iterator, NamedTuple, Optional, Sequence

import numpy as np

from beam_jobs.files import work_records
from beam_jobs.stages import perceptual_hash

_BLOCK = 2048  # hashes compared at once in a bucket: a block of _BLOCK x _BLOCK distances, 32 MB
EVALUATION_SPLITS = ("validation", "test")


# --- stage 2: the band records ---------------------------------------------------------------------------------

def band_positions(hashes: Sequence[int], distance: int) -> np.ndarray:
    """``(len(hashes), distance + 1)`` uint64: where each hash's value on each band sorts.

    Band ``b``'s values start at :func:`band_start` and are spread evenly over the next ``S = 2**64 // bands``
    keys, so the work file's key buckets (equal key ranges) are ranges of band values, one band value never
    straddles two buckets, and with a multiple of ``bands`` buckets no bucket holds two bands.
    """
    cut = perceptual_hash.bands(distance)
    values = perceptual_hash.band_values(hashes, cut)
    span = (1 << 64) // len(cut)
    positions = np.empty_like(values)
    for band, bits in enumerate(cut):
        step = np.uint64(span >> len(bits))
        positions[:, band] = np.uint64(band_start(band, len(cut))) + values[:, band] * step
    return positions


def band_start(band: int, bands: int) -> int:
    """Where band ``band``'s positions start: ``ceil(band * 2**64 / bands)``, so that with a number of key
    buckets that is a multiple of ``bands`` every bucket holds one band's values only (a band range's task
    then holds each image once: :mod:`beam_jobs.stages.near_links`). Its values take less than ``2**64 //
    bands`` from there, so ``position // (2**64 // bands)`` is still the band."""
    return -(-(band << 64) // bands)


def near_records(content: Sequence[bytes], distance: int) -> list[bytes]:
    """The NEAR records of a part's CONTENT records (those with a hash), sorted: one per band of each hash.

    The hashes are read from the records' fixed heads at once and the band positions computed in numpy; Python
    only joins each position to its record (12 us an image went to 5 on 8x8 JPEGs, most of it decoding
    every CONTENT record whole)."""
    if not content:
        return []
    head = work_records.CONTENT_HEAD
    heads = np.frombuffer(b"".join(record[:head.itemsize] for record in content), dtype=head)
    hashed = np.flatnonzero(heads["hashed"] & work_records.HASHED).tolist()
    if not hashed:
        return []
    positions = band_positions(heads["phash"][hashed].astype(np.uint64), distance)
    packed = positions.astype(">u8").tobytes()  # row by row: an image's bands, each 8 bytes as encode_near packs it
    bands = positions.shape[1]
    return sorted(packed[8 * slot:8 * slot + 8] + content[hashed[slot // bands]] for slot in range(positions.size))


# --- stage 6: pairs among a band range's records -----------------------------------------------------------------------------

class Member(NamedTuple):
    """An image as the searches' link, leak and drop lines hold it (a JSON list of these, in this order)."""

    split: str
    label: int
    path: str  # relpath: the image's key in every list
    phash: Optional[int]
    sha: str  # the CONTENT record's SHA-256 prefix, hex
    stored_bytes: int
    objects: int

    @classmethod
    def of(cls, item: work_records.Content) -> "Member":
        return cls(item.split, item.label, item.relpath, item.perceptual_hash, item.sha.hex(), item.stored_bytes,
                   item.objects)


class Leak(NamedTuple):
    """An evaluation image ``--drop-leaks`` leaves out, its partner in an earlier split, and their distance."""

    member: Member
    partner: Member
    distance: int

    @classmethod
    def parse(cls, line: Sequence) -> "Leak":
        """A leak as ``json.loads`` gives it back (three lists)."""
        member, partner, bits = line
        return cls(Member(*member), Member(*partner), bits)

    def closer_than(self, other: Optional["Leak"]) -> bool:
        """The closer of two leaks of one image (by distance, then the partner's path: the same on every run)."""
        return other is None or (self.distance, self.partner.path) < (other.distance, other.partner.path)


def _heads(records: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(positions, shas, hashes)`` of NEAR records, as :func:`work_records.near_head` gives them one by one:
    uint64, ``(n, 16)`` uint8, uint64."""
    joined = b"".join(record[:work_records.NEAR_HEAD.itemsize] for record in records)
    heads = np.frombuffer(joined, dtype=work_records.NEAR_HEAD)
    shas = np.frombuffer(joined, dtype=np.uint8).reshape(-1, work_records.NEAR_HEAD.itemsize)[:, 8:24]
    return heads["position"].astype(np.uint64), shas, heads["phash"].astype(np.uint64)


def _bucket_pairs(band: int, shas: np.ndarray, hashes: np.ndarray, distance: int,
                  block: int = _BLOCK, signatures: Optional[np.ndarray] = None) -> Iterator[np.ndarray]:
    """The pairs (``(2, k)`` indices into one band value's records) within ``distance`` whose first common band
    is ``band``, in blocks, in the order a union-find takes them (:func:`beam_jobs.stages.near_links.find_pairs` keeps that order).

    The records are sorted as bytes: by SHA-256, then the rest of the image's CONTENT record, the same order in
    every band, so the first copy of a content is the same image in each; each pair is ``(earlier, later)``.
    Order: the copies' links to their first copy, then blocks of ``block`` x ``block`` hashes (rows, then
    columns, of the upper triangle), each block's pairs row by row. Every test is numpy over the block.

    ``signatures`` (``(n, k)`` uint8 rows: split, hash and thumbnail; given for a bucket of more than a block's
    records): images whose hash and thumbnail are the same are copies too (:func:`_signature_firsts`), so a
    bucket of a million blank frames compares its few distinct signatures, not 5e11 pairs (#56 §1).
    """
    if signatures is None:
        first = np.ones(len(shas), dtype=bool)
        first[1:] = (shas[1:] != shas[:-1]).any(axis=1)
        firsts_of = np.maximum.accumulate(np.where(first, np.arange(len(first)), 0))
    else:
        firsts_of = _signature_firsts(signatures)
        first = firsts_of == np.arange(len(firsts_of))
    if band == 0 and not first.all():  # copies share every band: linked once, in the first
        copies = np.flatnonzero(~first)
        yield np.stack([firsts_of[copies], copies])
    firsts = np.flatnonzero(first)
    if firsts.size < 2:
        return
    values = hashes[firsts]
    earlier = np.array(perceptual_hash.band_masks(distance)[:band], dtype=np.uint64)
    for start in range(0, firsts.size, block):
        for other in range(start, firsts.size, block):
            rows, columns = _within(values, start, min(start + block, firsts.size),
                                    other, min(other + block, firsts.size), distance)
            if earlier.size:  # found in an earlier band: it agrees with it there
                differ = values[rows] ^ values[columns]
                keep = ((differ[:, None] & earlier[None, :]) != 0).all(axis=1)
                rows, columns = rows[keep], columns[keep]
            if rows.size:
                yield np.stack([firsts[rows], firsts[columns]])


def _signature_firsts(signatures: np.ndarray) -> np.ndarray:
    """For each of a bucket's records (``(n, k)`` uint8 rows: split code, then hash and thumbnail), the record
    its copies are linked to: of the records with its hash and thumbnail, the first of the earliest split.

    Every pair of such records is within any distance and verified (their thumbnails are the same), and each
    pairs with whatever the others pair with: one link each to that first keeps the groups, and the first of
    the earliest split is the partner a leak of theirs would name (:class:`near_leaks.Leaks` extends its leaks to them).
    Byte-identical copies are such records: they get the first the SHA-256 order gives them.
    """
    rows = np.ascontiguousarray(signatures)
    keys = rows[:, 1:].view(np.dtype((np.void, rows.shape[1] - 1))).ravel()
    _, inverse = np.unique(keys, return_inverse=True)
    order = np.lexsort((np.arange(len(rows)), rows[:, 0], inverse.ravel()))  # by class, split, record
    classes = inverse.ravel()[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = classes[1:] != classes[:-1]
    first_of_class = np.empty(int(classes.max()) + 1 if len(order) else 0, dtype=np.int64)
    first_of_class[classes[starts]] = order[starts]
    return first_of_class[inverse.ravel()]


COLLAPSE_OVER = _BLOCK  # a bucket of more records has its records of one signature linked, not compared


_STRIP = 256  # rows of a diagonal block compared at once, each with the columns from its own on


def _within(values: np.ndarray, top: int, bottom: int, left: int, right: int,
            distance: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, columns)``: the pairs within ``distance`` of rows ``[top, bottom)`` and columns ``[left, right)``
    of the hashes' distances, row by row; on the diagonal (``top == left``) only the upper triangle (each pair
    once, not a hash with itself), compared in strips so that about half the block is computed."""
    if top != left:
        rows, columns = np.nonzero(perceptual_hash.pairwise_distances(values[top:bottom], values[left:right])
                                   <= distance)
        return rows + top, columns + left
    found = []
    for strip in range(top, bottom, _STRIP):
        end = min(strip + _STRIP, bottom)
        rows, columns = np.nonzero(perceptual_hash.pairwise_distances(values[strip:end], values[strip:right])
                                   <= distance)
        upper = rows < columns
        found.append((rows[upper] + strip, columns[upper] + strip))
    return np.concatenate([rows for rows, _ in found]), np.concatenate([columns for _, columns in found])


_SMALL = 64  # a band value's bucket of at most this many records is searched with others at once
_SMALL_PAIRS = 1 << 20  # the candidate pairs of the small buckets searched at once (about 50 MB of arrays)


def pair_indices(records: Sequence[bytes], bands: int, distance: int, block: int = _BLOCK,
                 thumbnails: Optional[np.ndarray] = None,
                 collapse_over: int = COLLAPSE_OVER) -> Iterator[np.ndarray]:
    """Every pair within ``distance`` among sorted NEAR records, each once (in its first common band), as
    ``(2, k)`` blocks of indices into ``records``, in the order a band range's task joins them.

    Most buckets hold a few records (a 16-bit band value: N / 65,536 on average), and numpy's cost per call
    would be most of the search: runs of consecutive small buckets are searched at once
    (:func:`_small_bucket_pairs`, the same pairs in the same order as one by one), larger ones in blocks.
    ``thumbnails`` (``(n, 64)`` uint8, by record): a bucket of more than ``collapse_over`` records links its
    records of one hash and thumbnail to one of them and compares that one only (:func:`_bucket_pairs`)."""
    if not records:
        return
    positions, shas, hashes = _heads(records)
    edges = np.flatnonzero(positions[1:] != positions[:-1]) + 1  # where each band value's bucket starts
    starts = np.concatenate([[0], edges])
    stops = np.concatenate([edges, [len(records)]])
    shared = stops - starts > 1
    starts, stops = starts[shared], stops[shared]
    if bands > 1:  # one band (distance 0) spans the whole key space: 2**64 is no uint64
        bands_of = (positions[starts] // np.uint64((1 << 64) // bands)).astype(np.int64)
    else:
        bands_of = np.zeros(starts.size, dtype=np.int64)
    small = stops - starts <= min(_SMALL, block, _STRIP)  # one block, one strip: its pairs row by row
    waiting, pending = [], 0
    for index in range(starts.size):
        if small[index]:
            size = int(stops[index] - starts[index])
            waiting.append(index)
            pending += size * (size - 1) // 2
            if pending < _SMALL_PAIRS and index + 1 < starts.size and small[index + 1]:
                continue
            chosen = np.array(waiting)
            pairs = _small_bucket_pairs(starts[chosen], stops[chosen], bands_of[chosen], shas, hashes, distance)
            waiting, pending = [], 0
            if pairs.shape[1]:
                yield pairs
            continue
        start, stop = int(starts[index]), int(stops[index])
        signatures = None
        if thumbnails is not None and stop - start > collapse_over:
            signatures = _signatures(records[start:stop], thumbnails[start:stop])
        for pairs in _bucket_pairs(int(bands_of[index]), shas[start:stop], hashes[start:stop], distance, block,
                                   signatures):
            yield pairs + start


def _signatures(records: Sequence[bytes], thumbnails: np.ndarray) -> np.ndarray:
    """``(n, 73)`` uint8: each NEAR record's split code, hash and thumbnail (what :func:`_signature_firsts` reads)."""
    heads = np.frombuffer(b"".join(record[:work_records.NEAR_HEAD.itemsize] for record in records), dtype=np.uint8)
    heads = heads.reshape(-1, work_records.NEAR_HEAD.itemsize)
    split = work_records.NEAR_HEAD.fields["split"][1]
    phash = work_records.NEAR_HEAD.fields["phash"][1]
    return np.hstack([heads[:, split:split + 1], heads[:, phash:phash + 8], thumbnails])


def _small_bucket_pairs(starts: np.ndarray, stops: np.ndarray, bands_of: np.ndarray, shas: np.ndarray,
                        hashes: np.ndarray, distance: int) -> np.ndarray:
    """:func:`_bucket_pairs` of many small buckets (``[starts[i], stops[i])`` of the records, in order, each of
    band ``bands_of[i]``) at once, as one ``(2, k)`` block of record indices in the same order: bucket by
    bucket, each one's copies linked to their first copy (band 0), then its pairs of firsts row by row."""
    sizes = stops - starts
    members = np.repeat(starts, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    bucket = np.repeat(np.arange(starts.size), sizes)  # each member's bucket (0..len(starts))
    opens = np.zeros(members.size, dtype=bool)
    opens[np.cumsum(sizes) - sizes] = True
    first = opens.copy()
    first[1:] |= (shas[members[1:]] != shas[members[:-1]]).any(axis=1)
    found = []  # (bucket, kind, order) keys with the pairs: copies (kind 0) before pairs (kind 1) in a bucket
    copies = np.flatnonzero(~first & (bands_of[bucket] == 0))  # copies share every band: linked once, in the first
    if copies.size:
        firsts_of = np.maximum.accumulate(np.where(first, np.arange(members.size), 0))
        found.append((bucket[copies], 0, np.stack([members[firsts_of[copies]], members[copies]])))
    firsts = np.flatnonzero(first)
    of_bucket = bucket[firsts]
    later = np.searchsorted(of_bucket, of_bucket, side="right") - np.arange(firsts.size) - 1  # firsts after each
    rows = np.repeat(np.arange(firsts.size), later)
    columns = rows + 1 + (np.arange(rows.size) - np.repeat(np.cumsum(later) - later, later))
    a, b = members[firsts[rows]], members[firsts[columns]]
    differ = hashes[a] ^ hashes[b]
    keep = np.bitwise_count(differ) <= distance
    rows, a, b, differ = rows[keep], a[keep], b[keep], differ[keep]
    masks = np.array(perceptual_hash.band_masks(distance), dtype=np.uint64)
    band = bands_of[of_bucket[rows]]
    agree = (differ[:, None] & masks[None, :]) == 0  # found in an earlier band: it agrees with it there
    earlier = np.cumsum(agree, axis=1)[np.arange(band.size), np.maximum(band - 1, 0)] * (band > 0)
    keep = earlier == 0
    found.append((of_bucket[rows[keep]], 1, np.stack([a[keep], b[keep]])))
    keys = np.concatenate([np.full(pairs.shape[1], kind) + 2 * owner for owner, kind, pairs in found])
    joined = np.concatenate([pairs for _, _, pairs in found], axis=1)
    return joined[:, np.argsort(keys, kind="stable")]


def member_text(record: bytes) -> str:
    """A NEAR record's image as a link or leak line holds it: its :class:`Member` as ``json.dumps`` writes it
    (a list of strings and ints), its strings by json's own ASCII encoder (a path that is not UTF-8,
    surrogate escapes, travels as \\udcNN escapes and comes back whole)."""
    item = work_records.decode_content(record[8:])  # a NEAR record: its position, then its CONTENT
    return (f"[{_json_text(item.split)}, {item.label}, {_json_text(item.relpath)}, "
            f"{item.perceptual_hash}, \"{item.sha.hex()}\", {item.stored_bytes}, {item.objects}]")


_LINK_BATCH = 1 << 21  # pairs joined at once: about 100 MB of indices and Boruvka's arrays at most


def spanning_links(pairs: Iterable[np.ndarray], images: np.ndarray, batch: int = _LINK_BATCH) -> np.ndarray:
    """The pairs (``(2, k)`` blocks of record indices; ``images[i]`` is record ``i``'s image id) that join two
    groups of the pairs before them: the links a union-find taking the pairs in order writes, as ``(2, links)``
    record indices in that order.

    They are the minimum spanning forest of the pairs when the ``i``-th pair weighs ``i`` (distinct weights:
    one forest, the greedy order's), found by Boruvka's rounds in numpy over batches of pairs, each batch
    over the groups the earlier ones left: no Python per pair, memory for a batch of pairs.
    """
    label = np.arange(int(images.max()) + 1 if images.size else 0)
    links = [joined[:, boruvka(images[joined[0]], images[joined[1]], label)] for joined in pair_batches(pairs, batch)]
    return np.concatenate(links, axis=1) if links else np.zeros((2, 0), dtype=np.int64)


def pair_batches(pairs: Iterable[np.ndarray], batch: int) -> Iterator[np.ndarray]:
    """The ``(2, k)`` blocks of ``pairs`` joined into batches of at least ``batch`` pairs (the last: the rest), in
    order: Boruvka's rounds cost numpy calls a batch, not a block."""
    waiting, pending = [], 0
    for block in pairs:
        waiting.append(block)
        pending += block.shape[1]
        if pending >= batch:
            yield np.concatenate(waiting, axis=1)
            waiting, pending = [], 0
    if waiting:
        yield np.concatenate(waiting, axis=1)


def boruvka(first: np.ndarray, second: np.ndarray, label: np.ndarray) -> np.ndarray:
    """The positions of the pairs ``(first[i], second[i])`` (weight ``i``) in the minimum spanning forest over
    the groups ``label`` holds (each image's group's image; updated in place to the groups after the pairs).

    Each round takes every group's lightest pair to another group (all of them in the forest: the cut
    property) and merges along them: a group points at the group across its pair, the two of a pair that
    chose each other (the only cycles, of length 2) have the lower one point at itself, and pointer jumping
    finds each tree's root.
    """
    chosen = np.zeros(first.size, dtype=bool)
    live = np.arange(first.size)
    none = first.size
    while live.size:
        a, b = label[first[live]], label[second[live]]
        across = a != b
        live, a, b = live[across], a[across], b[across]
        if not live.size:
            break
        lightest = np.full(label.size, none, dtype=np.int64)
        np.minimum.at(lightest, a, live)
        np.minimum.at(lightest, b, live)
        groups = np.flatnonzero(lightest < none)
        pair = lightest[groups]
        chosen[pair] = True
        ends = label[first[pair]]
        target = np.where(ends == groups, label[second[pair]], ends)
        pointer = np.arange(label.size)
        pointer[groups] = target
        mutual = (pointer[target] == groups) & (groups < target)
        pointer[groups[mutual]] = groups[mutual]
        while True:
            jumped = pointer[pointer]
            if np.array_equal(jumped, pointer):
                break
            pointer = jumped
        label[:] = pointer[label]
    return np.flatnonzero(chosen)
