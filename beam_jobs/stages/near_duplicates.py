"""Stage 6, near: groups of images that look alike (perceptual hashes within a distance), within and across splits.

In:  ``near/part-P`` of every part (NEAR records, written by stage 2 from its CONTENT records: one per band
     of each image's 64-bit hash, sorted by the band's position: :func:`near_records`).
Out: per band range ``r`` (:func:`find_pairs`, one task each, as the exact search's hash ranges):
     ``near/pairs-r.jsonl``, the links between the pairs within the distance that first agree on a band of
     the range (a spanning forest of them: as many lines as images at most).
     Memory: the range's records (about a part's worth of images per band range).
     Then once (:func:`group_near`): the links joined into groups (connected components), written as
     ``near/groups.jsonl`` (the near lines of ``duplicates.jsonl``, sorted), with a :class:`NearSummary`
     and, for ``--drop-leaks``, ``near/dropped.json``. Memory: the images that have a near pair (not all).

Why bands: two 64-bit hashes within distance ``d`` agree exactly on at least one of ``d + 1`` disjoint
bands (pigeonhole), so comparing only images that share a band's value finds every pair, and a range of
band values is a task of bounded size. A pair that agrees on several bands is kept in its first one only,
so each pair is written once. Byte-identical images (same SHA-256) are compared once: the copies are
linked to their first copy at distance 0 (they are the exact search's groups too).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from typing import Iterable, Iterator, Sequence

import numpy as np
from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs.stages import perceptual_hash
from beam_jobs.files import filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning.discover import display_path

MAX_LISTED = 20  # near groups listed in the manifest; every one is in duplicates.jsonl
_BLOCK = 2048  # hashes compared at once in a bucket: a block of _BLOCK x _BLOCK distances, 32 MB
EVALUATION_SPLITS = ("validation", "test")


def _rank(split: str) -> int:
    """Splits in the order leakage is judged: train, validation, test (record_schema.SPLITS)."""
    return record_schema.SPLITS.index(split)


# --- stage 2: the band records ---------------------------------------------------------------------------------

def band_positions(hashes: Sequence[int], distance: int) -> np.ndarray:
    """``(len(hashes), distance + 1)`` uint64: where each hash's value on each band sorts.

    Band ``b`` holds the key range ``[b * S, (b + 1) * S)`` (``S = 2**64 // bands``), its values spread evenly
    over it, so the work file's key buckets (equal key ranges) are ranges of band values, and one band value
    never straddles two buckets.
    """
    cut = perceptual_hash.bands(distance)
    values = perceptual_hash.band_values(hashes, cut)
    span = (1 << 64) // len(cut)
    positions = np.empty_like(values)
    for band, bits in enumerate(cut):
        step = np.uint64(span >> len(bits))
        positions[:, band] = np.uint64(band * span) + values[:, band] * step
    return positions


def near_records(content: Sequence[bytes], distance: int) -> list[bytes]:
    """The NEAR records of a part's CONTENT records (those with a hash), sorted: one per band of each hash."""
    hashed = [(record, item.perceptual_hash) for record in content
              if (item := work_records.decode_content(record)).perceptual_hash is not None]
    if not hashed:
        return []
    positions = band_positions([phash for _, phash in hashed], distance)
    return sorted(work_records.encode_near(int(position), record)
                  for (record, _), row in zip(hashed, positions) for position in row)


# --- stage 6: pairs per band range -----------------------------------------------------------------------------

def _member(item: work_records.Content) -> list:
    """An image as a pair line holds it: ``[split, label, path, hash, sha (hex), stored bytes, objects]``."""
    return [item.split, item.label, item.relpath, item.perceptual_hash, item.sha.hex(), item.stored_bytes,
            item.objects]


def _bucket_pairs(band: int, records: Sequence[bytes], distance: int) -> Iterator[tuple[bytes, bytes]]:
    """The pairs (NEAR records) of one band value's images within ``distance`` whose first common band is ``band``.

    ``records`` are sorted as bytes: by SHA-256, then the rest of the image's CONTENT record, the same order in
    every band, so the first copy of a content is the same image in each.
    """
    firsts: list[tuple[bytes, int, bytes]] = []
    for record in records:
        _, sha, phash = work_records.near_head(record)
        if firsts and firsts[-1][0] == sha:
            if band == 0:  # copies share every band: linked once, in the first
                yield firsts[-1][2], record
            continue
        firsts.append((sha, phash, record))
    if len(firsts) < 2:
        return
    hashes = np.fromiter((phash for _, phash, _ in firsts), dtype=np.uint64, count=len(firsts))
    earlier = perceptual_hash.band_masks(distance)[:band]
    for start in range(0, len(firsts), _BLOCK):
        for other in range(start, len(firsts), _BLOCK):
            block = perceptual_hash.pairwise_distances(hashes[start:start + _BLOCK], hashes[other:other + _BLOCK])
            for i, j in zip(*np.nonzero(block <= distance)):
                a, b = start + int(i), other + int(j)
                differ = firsts[a][1] ^ firsts[b][1]
                if a >= b or any(differ & mask == 0 for mask in earlier):
                    continue  # itself, the other half of the block, or found in an earlier band
                yield firsts[a][2], firsts[b][2]


def near_pairs(records: Sequence[bytes], bands: int, distance: int) -> Iterator[tuple[bytes, bytes]]:
    """Every pair (NEAR records) within ``distance`` among sorted NEAR records, each once: in its first common band."""
    span = (1 << 64) // bands
    start = 0
    while start < len(records):
        stop = start + 1
        while stop < len(records) and records[stop][:8] == records[start][:8]:
            stop += 1
        if stop - start > 1:
            yield from _bucket_pairs(work_records.near_head(records[start])[0] // span, records[start:stop], distance)
        start = stop


def find_pairs(layout: WorkLayout, near_range: int, distance: int) -> int:
    """The links of band range ``near_range`` into ``near/pairs-r.jsonl`` (lines sorted); returns their number.

    A link is a pair within ``distance`` that joins two groups of the range's pairs found so far: a spanning
    forest of the range's pairs, which joins the same groups as all of them (``group_near`` needs no more),
    so ten photos that all look alike write 9 lines, not 45. A range whose file exists (a killed run this one
    resumes) is not searched again.
    """
    out = layout.near_pairs(near_range)
    if FileSystems.exists(out):
        with FileSystems.open(out, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return sum(1 for _ in handle)
    records: list[bytes] = []
    for part in range(layout.num_parts):
        records += work_records.read_bucket(layout.near(part), work_records.NEAR, near_range)
    records.sort()
    parent: dict[bytes, bytes] = {}
    lines = []
    for a, b in near_pairs(records, layout.near_bands, distance):
        first, second = _root(parent, a[8:]), _root(parent, b[8:])  # an image: its CONTENT record
        if first != second:
            parent[max(first, second)] = min(first, second)
            # ASCII JSON: a path that is not UTF-8 (surrogate escapes) travels as \udcNN escapes and comes back whole
            lines.append(json.dumps([_member(work_records.decode_near(a)[1]), _member(work_records.decode_near(b)[1])]))
    lines.sort()
    with filesystems.whole_file(out) as handle:
        handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
    return len(lines)


def _root(parent: dict, item):
    """``item``'s representative in a union-find forest (path halving); a new item is its own."""
    parent.setdefault(item, item)
    while parent[item] != item:
        parent[item] = parent[parent[item]]
        item = parent[item]
    return item


# --- stage 6: groups -------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NearSummary:
    """The near search's counts for the manifest's ``duplicates``, and the first groups that span splits.

    ``threshold`` is None when the run took no perceptual hashes (``--no-near-duplicates``).
    """

    threshold: object = None
    num_groups: int = 0
    num_images: int = 0  # images beyond the first of each group
    num_within_split: int = 0
    num_cross_split: int = 0
    cross_split: tuple = ()  # the first MAX_LISTED cross-split groups, as duplicates.jsonl's lines hold them

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "NearSummary":
        raw = json.loads(text)
        raw["cross_split"] = tuple(raw["cross_split"])
        return cls(**raw)

    def to_manifest(self) -> dict:
        return {"near_threshold": self.threshold, "num_near_groups": self.num_groups,
                "num_near_images": self.num_images, "num_near_within_split": self.num_within_split,
                "num_near_cross_split": self.num_cross_split, "near_cross_split": list(self.cross_split)}


def _pairs(layout: WorkLayout) -> Iterator[list]:
    for near_range in range(layout.near_ranges):
        with FileSystems.open(layout.near_pairs(near_range), compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            for line in handle:
                yield json.loads(line)


def components(pairs: Iterable[Sequence[list]]) -> list[list[list]]:
    """The connected components of the pairs' images (by path), each sorted by (split order, path)."""
    parent: dict[str, str] = {}
    members: dict[str, list] = {}
    for pair in pairs:
        for member in pair:
            members.setdefault(member[2], member)
        a, b = _root(parent, pair[0][2]), _root(parent, pair[1][2])
        if a != b:
            parent[max(a, b)] = min(a, b)
    groups: dict[str, list] = {}
    for path, member in members.items():
        groups.setdefault(_root(parent, path), []).append(member)
    return sorted(sorted(group, key=lambda m: (_rank(m[0]), m[2])) for group in groups.values())


def near_line(group: Sequence[list], classes: Sequence[str]) -> dict:
    """A group as ``duplicates.jsonl`` holds it: the first image at distance 0, each other at its distance to it."""
    first = group[0][3]
    return {"kind": "near", "images": [
        {"split": split, "label": classes[label], "path": display_path(relpath),
         "distance": perceptual_hash.distance(first, phash)}
        for split, label, relpath, phash, *_ in group]}


def leaked(group: Sequence[list]) -> list[list]:
    """The members ``--drop-leaks`` leaves out of a group: those of an evaluation split after its earliest split."""
    earliest = min(_rank(member[0]) for member in group)
    return [m for m in group if _rank(m[0]) > earliest and m[0] in EVALUATION_SPLITS]


def group_near(layout: WorkLayout, distance: int, classes: Sequence[str]) -> NearSummary:
    """Every range's pairs joined into groups: ``near/groups.jsonl``, ``near/dropped.json``, the summary.

    A group whose images are all byte-identical is left to the exact search (it is one of its groups).
    Written whole, the summary last; a summary found (a killed run this one resumes) is returned as it is.
    """
    done = layout.near_summary()
    if FileSystems.exists(done):
        return NearSummary.from_json(filesystems.read_text(done))
    lines, within, cross, dropped, extra = [], 0, [], [], 0
    for group in components(_pairs(layout)):
        if len({member[4] for member in group}) < 2:
            continue
        line = json.dumps(near_line(group, classes), ensure_ascii=False)
        lines.append(line)
        extra += len(group) - 1
        if len({member[0] for member in group}) > 1:
            cross.append(line)
            dropped += leaked(group)
        else:
            within += 1
    lines.sort()
    with filesystems.whole_file(layout.near_groups()) as handle:
        handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
    filesystems.write_text(layout.near_dropped(), json.dumps(sorted(dropped)))
    summary = NearSummary(distance, len(lines), extra, within, len(cross),
                          tuple(json.loads(line) for line in heapq.nsmallest(MAX_LISTED, cross)))
    filesystems.write_text(done, summary.to_json())
    return summary
