"""Stage 6, near, once after every band range: the links joined into groups, and the leaks' closest partners.

In:  every band range's ``near/pairs-r.jsonl`` (the links :func:`beam_jobs.stages.near_duplicates.find_pairs`
     writes: a spanning forest of the range's verified pairs, each line two :class:`Member` lists) and
     ``near/leaks-r.jsonl`` (each evaluation image with a direct pair in the training split, its closest partner
     in the range).
Out: ``near/groups.jsonl`` (the near lines of ``duplicates.jsonl``, sorted: each group's images with their
     distance to its first), a :class:`NearSummary` for the manifest, and, for ``--drop-leaks``,
     ``near/dropped.json`` (each leaked image's closest partner over every range). Memory: the images that
     have a near pair (not all), in columns (:class:`_Linked`: about 190 bytes each, paths included; 350 as
     lists and dicts), and the leaked images.

Groups are connected components, found by the same Boruvka rounds in numpy as the links
(:func:`beam_jobs.stages.near_duplicates.boruvka`) over integer image ids. An image is left out only when it is
itself near a training image, not when its group spans splits: a chain of near pairs carries no leak on.
"""

from __future__ import annotations

import array
import dataclasses
import heapq
import json
from typing import Iterable, Iterator, Sequence

import numpy as np
from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs.files import filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning.discover import display_path
from beam_jobs.stages import perceptual_hash
from beam_jobs.stages.near_duplicates import EVALUATION_SPLITS, Leak, Member, boruvka

MAX_LISTED = 20  # near groups listed in the manifest; every one is in duplicates.jsonl


def _rank(split: str) -> int:
    """Splits in the order leakage is judged: train, validation, test (record_schema.SPLITS)."""
    return record_schema.SPLITS.index(split)


@dataclasses.dataclass(frozen=True)
class NearSummary:
    """The near search's counts for the manifest's ``duplicates``, and the first groups that span splits.

    ``threshold`` is None when the run took no perceptual hashes (``--near-distance off``).
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
    """Every range's links, a range's file parsed in one ``json.loads`` (its lines joined into one list)."""
    for near_range in range(layout.near_ranges):
        with FileSystems.open(layout.near_pairs(near_range), compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            yield from json.loads(b"[" + b",".join(handle.read().splitlines()) + b"]")


class _Linked:
    """The images the links name, each once, in columns (the grouping task's memory: about 190 bytes an image
    with a near pair, its path included, where member lists, a union-find and a group dict held 350: traced on
    ``bench.near_scale``'s photo-like hashes), and the links between them as integer ids.

    Of each :class:`Member` what the groups need is kept: the split's rank, the label, the hash, the SHA-256 (its first 16 bytes, as CONTENT records keep it: whether a group's
    images are all the same bytes)
    and the path, by id.
    """

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.rank, self.label, self.phash = array.array("B"), array.array("q"), array.array("Q")
        self.sha = bytearray()  # 16 bytes an image
        self.first, self.second = array.array("q"), array.array("q")

    def _id(self, member: Member) -> int:
        index = self.ids.get(member.path)
        if index is None:
            index = self.ids[member.path] = len(self.ids)
            self.rank.append(_rank(member.split))
            self.label.append(member.label)
            self.phash.append(member.phash)
            self.sha += bytes.fromhex(member.sha)[:16].ljust(16, b"\0")
        return index

    def link(self, pair: Sequence[Sequence]) -> None:
        """A link line as ``json.loads`` gives it back (two member lists)."""
        self.first.append(self._id(Member(*pair[0])))
        self.second.append(self._id(Member(*pair[1])))

    def groups(self) -> Iterator[np.ndarray]:
        """The connected components of the links (:func:`_boruvka`'s rounds in numpy, not a Python step per
        link), each as its images' ids sorted by (split order, path), the components in no set order."""
        count = len(self.ids)
        if not count:
            return
        component = np.arange(count)
        boruvka(np.frombuffer(self.first, np.int64), np.frombuffer(self.second, np.int64), component)
        by_path = np.empty(count, np.int64)
        by_path[sorted(range(count), key=list(self.ids).__getitem__)] = np.arange(count)
        order = np.lexsort((by_path, np.frombuffer(self.rank, np.uint8), component))
        edges = np.flatnonzero(np.diff(component[order])) + 1
        yield from np.split(order, edges)


def components(pairs: Iterable[Sequence[list]]) -> list[list[Member]]:
    """The connected components of the link lines' images (by path), each sorted by (split order, path), as
    :class:`Member` with the fields the groups keep (the SHA-256 prefix, the stored bytes and objects left empty)."""
    linked = _Linked()
    for pair in pairs:
        linked.link(pair)
    paths = list(linked.ids)
    return sorted([Member(record_schema.SPLITS[linked.rank[i]], linked.label[i], paths[i], linked.phash[i], "", 0, 0)
                   for i in group.tolist()] for group in linked.groups())


def near_line(group: Sequence[Member], classes: Sequence[str]) -> dict:
    """A group as ``duplicates.jsonl`` holds it: the first image at distance 0, each other at its distance to it."""
    first = group[0].phash
    return {"kind": "near", "images": [
        {"split": m.split, "label": classes[m.label], "path": display_path(m.path),
         "distance": perceptual_hash.distance(first, m.phash)} for m in group]}


def leaked(group: Sequence[Member]) -> list[Leak]:
    """The members ``--drop-leaks`` leaves out of a group of byte-identical images (each a direct copy of every
    other): those of an evaluation split after its earliest split, each with its partner, the group's first
    image of its earliest split, at distance 0."""
    earliest = min(_rank(m.split) for m in group)
    partner = min((m for m in group if _rank(m.split) == earliest), key=lambda m: m.path)
    return [Leak(m, partner, 0) for m in group if _rank(m.split) > earliest and m.split in EVALUATION_SPLITS]


def _leaks(layout: WorkLayout) -> list[Leak]:
    """Every evaluation image with a direct near pair in the training split, with its closest partner over all
    band ranges, sorted by path. Memory: those images."""
    best: dict[str, Leak] = {}
    for near_range in range(layout.near_ranges):
        with FileSystems.open(layout.near_leaks(near_range), compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            for line in json.loads(b"[" + b",".join(handle.read().splitlines()) + b"]"):
                leak = Leak.parse(line)
                if leak.closer_than(best.get(leak.member.path)):
                    best[leak.member.path] = leak
    return [best[path] for path in sorted(best)]


def _group_lines(layout: WorkLayout, classes: Sequence[str]) -> tuple[list[str], list[str], int]:
    """``near/groups.jsonl``'s lines, sorted (groups of images not all byte-identical), those of the groups that
    span splits, and the images beyond the first of each group. Memory: :class:`_Linked`'s columns, freed on
    return (before the leaks are read)."""
    linked = _Linked()
    for pair in _pairs(layout):
        linked.link(pair)
    paths, ranks = list(linked.ids), np.frombuffer(linked.rank, np.uint8)
    sha = np.frombuffer(linked.sha, np.uint8).reshape(-1, 16)
    lines, cross, extra = [], [], 0
    for ids in linked.groups():
        if (sha[ids] == sha[ids[0]]).all():
            continue
        group = [Member(record_schema.SPLITS[linked.rank[i]], linked.label[i], paths[i], linked.phash[i], "", 0, 0)
                 for i in ids.tolist()]
        lines.append(json.dumps(near_line(group, classes), ensure_ascii=False))
        extra += len(group) - 1
        if ranks[ids].min() != ranks[ids].max():
            cross.append(lines[-1])
    lines.sort()
    return lines, cross, extra


def group_near(layout: WorkLayout, distance: int, classes: Sequence[str]) -> NearSummary:
    """Every range's pairs joined into groups: ``near/groups.jsonl``, ``near/dropped.json``, the summary.

    A group whose images are all byte-identical is left to the exact search (it is one of its groups).
    ``near/dropped.json`` is not drawn from the groups: an image is left out only when it is itself near a
    training image (``near/leaks-r.jsonl``), so a chain train - validation - validation - test, each link near
    but the ends far apart, leaves out the first validation image alone.
    Written whole, the summary last; a summary found (a killed run this one resumes) is returned as it is.
    """
    done = layout.near_summary()
    if FileSystems.exists(done):
        return NearSummary.from_json(filesystems.read_text(done))
    lines, cross, extra = _group_lines(layout, classes)
    with filesystems.whole_file(layout.near_groups()) as handle:
        for start in range(0, len(lines), 10_000):  # not one copy of every line at once
            handle.write("".join(line + "\n" for line in lines[start:start + 10_000]).encode("utf-8"))
    filesystems.write_text(layout.near_dropped(), json.dumps(_leaks(layout)))
    summary = NearSummary(distance, len(lines), extra, len(lines) - len(cross), len(cross),
                          tuple(json.loads(line) for line in heapq.nsmallest(MAX_LISTED, cross)))
    filesystems.write_text(done, summary.to_json())
    return summary
