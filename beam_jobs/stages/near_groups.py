"""Stage 6, near, once after every band range: the links joined into groups, and the leaks' closest partners.

In:  every band range's ``near/pairs-r.jsonl`` (the links :func:`beam_jobs.stages.near_duplicates.find_pairs`
     writes: a spanning forest of the range's verified pairs, each line two :class:`Member` lists) and
     ``near/leaks-r.jsonl`` (each evaluation image with a direct pair in the training split, its closest partner
     in the range).
Out: ``near/groups.jsonl`` (the near lines of ``duplicates.jsonl``, sorted: each group's images with their
     distance to its first), a :class:`NearSummary` for the manifest, and, for ``--drop-leaks``,
     ``near/dropped.json`` (each leaked image's closest partner over every range). Memory (#56 §5): the links
     as integer ids (16 bytes a link: about 20 bytes an image with a near pair), and the runs of the external
     sorts (:mod:`beam_jobs.files.external_sort`, in a local temporary folder) that number the images, gather
     the groups, order their lines and pick each leak's closest partner; not the paths, lines or leaks (a
     task that held them took ~600 bytes an image with a pair: 123 MB for 200,000 at 10M images).

Groups are connected components, found by the same Boruvka rounds in numpy as the links
(:func:`beam_jobs.stages.near_duplicates.boruvka`) over integer image ids. An image is left out only when it is
itself near a training image, not when its group spans splits: a chain of near pairs carries no leak on.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import struct
import tempfile
from typing import Collection, Iterable, Iterator, Sequence

import numpy as np
from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs.files import external_sort, filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning.discover import display_path
from beam_jobs.stages import near_blocks, perceptual_hash
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


def _pairs(layout: WorkLayout, values: Sequence[near_blocks.BigValue] = ()) -> Iterator[bytes]:
    """Every range's link lines and every spilled value's (each ``[member, member]``, no newline), a line at a time."""
    for near_range in range(layout.near_ranges):
        yield from _lines(layout.near_pairs(near_range))
    for path in near_blocks.value_files(layout, values, "pairs"):
        yield from _lines(path)


def _lines(path: str) -> Iterator[bytes]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        for raw in handle:
            yield raw.rstrip(b"\n")


def _path_key(path: str) -> bytes:
    """A path as bytes that sort as the ``str`` does (UTF-8 keeps code point order; lone surrogates, a name
    that is not UTF-8, pass as themselves) and hold no NUL (no file name does): a sort key's field."""
    return path.encode("utf-8", "surrogatepass")


_END = struct.Struct(">Q")  # a link's end (2 * link + side) after an image's key in the id sort


def _linked_images(pairs: Iterable[bytes], scratch: str, run_bytes: int) -> tuple[np.ndarray, str]:
    """The images the links name, each given an id in path order, and the links as ids: ``(ends, members)``,
    ``ends`` the ``(links, 2)`` int64 ids, ``members`` a scratch file of each image's split order, path and
    member text, by id (:func:`external_sort.write_frames`).

    No table of paths (a dict of them was most of the task's ~600 bytes an image with a pair): each link's
    two halves go to an external sort by path, whose merge numbers the images and tells each link end its id."""
    by_path = external_sort.ExternalSort(scratch, "linked", run_bytes)
    links = 0
    for line in pairs:
        for side, (member, text) in enumerate(_halves(line)):
            by_path.add(bytes([_rank(member[0])]) + _path_key(member[2]) + b"\0" + text + _END.pack(2 * links + side))
        links += 1
    ends = np.empty(2 * links, np.int64)
    members = os.path.join(scratch, "members")
    count, last = -1, None
    with open(members, "wb") as out:
        for record in by_path.sorted():
            image = record[:-_END.size]
            if image != last:  # a new image (its halves are the same text wherever it is linked)
                count, last = count + 1, image
                external_sort.write_frames(out, (image,))
            ends[_END.unpack(record[-_END.size:])[0]] = count
    return ends.reshape(-1, 2), members


_DECODER = json.JSONDecoder()


def _halves(line: bytes) -> tuple[tuple[list, bytes], tuple[list, bytes]]:
    """A link line's two members, each parsed and as its text in the line (``[first, second]``, ASCII)."""
    text = line.decode("ascii")
    first, end = _DECODER.raw_decode(text, 1)
    second, stop = _DECODER.raw_decode(text, end + 2)
    return (first, text[1:end].encode("ascii")), (second, text[end + 2:stop].encode("ascii"))


def _grouped(pairs: Iterable[bytes], scratch: str, run_bytes: int = external_sort.RUN_BYTES) -> Iterator[list[Member]]:
    """The connected components of the links' images, each sorted by (split order, path), the components in
    the order of their representatives' ids (Boruvka's roots: the same on every run; the lines are sorted
    after); memory: the links as ids (16 bytes a link) and the sorts' runs.

    Components are found by the same Boruvka rounds in numpy as the links
    (:func:`beam_jobs.stages.near_duplicates.boruvka`); then each image goes to an external sort by
    (component, split order, path), whose merge gives the groups one after another."""
    ends, members = _linked_images(pairs, scratch, run_bytes)
    component = np.arange(int(ends.max()) + 1 if ends.size else 0)
    boruvka(np.ascontiguousarray(ends[:, 0]), np.ascontiguousarray(ends[:, 1]), component)
    del ends
    by_group = external_sort.ExternalSort(scratch, "grouped", run_bytes)
    with open(members, "rb") as handle:
        for image, record in enumerate(external_sort.read_frames(handle)):  # split order, path, NUL, text
            by_group.add(_END.pack(int(component[image])) + record)
    os.remove(members)
    group: list[Member] = []
    last = None
    for record in by_group.sorted():
        if record[:_END.size] != last and group:
            yield group
            group = []
        last = record[:_END.size]
        group.append(Member(*json.loads(record[record.index(b"\0", _END.size + 1) + 1:])))
    if group:
        yield group


def components(pairs: Iterable[bytes]) -> list[list[Member]]:
    """The connected components of the link lines' images (by path), each sorted by (split order, path), as
    :class:`Member` with the fields the groups keep (the SHA-256 prefix, the stored bytes and objects left empty)."""
    with tempfile.TemporaryDirectory(prefix="near-groups-") as scratch:
        return sorted([m._replace(sha="", stored_bytes=0, objects=0) for m in group]
                      for group in _grouped(pairs, scratch))


def near_line(group: Sequence[Member], classes: Sequence[str]) -> dict:
    """A group as ``duplicates.jsonl`` holds it: the first image at distance 0, each other at its distance to it."""
    first = group[0].phash
    return {"kind": "near", "images": [
        {"split": m.split, "label": classes[m.label], "path": display_path(m.path),
         "distance": perceptual_hash.distance(first, m.phash)} for m in group]}


def leaked(group: Sequence[Member], kept: Collection[str] = ()) -> list[Leak]:
    """The members ``--drop-leaks`` leaves out of a group of byte-identical images (each a direct copy of every
    other): those of an evaluation split after its earliest split, each with its partner, the group's first
    image of its earliest split, at distance 0.

    ``kept``: the paths of an update's kept records among them, which are never left out (they are in reused
    shards): the split that stays is then the kept records' earliest, and a new image of an earlier split (a
    new training copy of a kept validation image) is left out too, its partner the kept split's first image."""
    staying = [m for m in group if m.path in kept] or group
    anchor = min(_rank(m.split) for m in staying)
    partner = min((m for m in group if _rank(m.split) == anchor), key=lambda m: m.path)
    return [Leak(m, partner, 0) for m in group if m.path not in kept
            and (_rank(m.split) < anchor or (_rank(m.split) > anchor and m.split in EVALUATION_SPLITS))]


def _leaks(layout: WorkLayout, values: Sequence[near_blocks.BigValue], scratch: str, run_bytes: int) -> Iterator[bytes]:
    """Every evaluation image with a direct near pair in the training split, with its closest partner over all
    band ranges and spilled values (by distance, then the partner's path: :meth:`Leak.closer_than`), as ``json.dumps`` of its
    :class:`Leak`, sorted by path. Memory: an external sort's run, not the leaked images."""
    by_member = external_sort.ExternalSort(scratch, "leaks", run_bytes)
    files = [layout.near_leaks(near_range) for near_range in range(layout.near_ranges)]
    for line in itertools.chain.from_iterable(map(_lines, [*files, *near_blocks.value_files(layout, values, "leaks")])):
        leak = Leak.parse(json.loads(line))
        by_member.add(_path_key(leak.member.path) + b"\0" + leak.distance.to_bytes(2, "big")
                      + _path_key(leak.partner.path) + b"\0" + json.dumps(leak).encode("ascii"))
    last = None
    for record in by_member.sorted():
        member = record[:record.index(b"\0")]
        if member != last:  # the closest of the image's leaks comes first
            last = member
            yield record[record.index(b"\0", len(member) + 3) + 1:]


def _group_lines(layout: WorkLayout, values: Sequence[near_blocks.BigValue], classes: Sequence[str], scratch: str,
                 run_bytes: int) -> tuple[str, list[str], int, int, int]:
    """``near/groups.jsonl``'s lines (groups of images not all byte-identical) sorted, written to a scratch file
    whose path is returned, with the first :data:`MAX_LISTED` lines of groups that span splits, the number of
    groups, of those that span splits, and the images beyond the first of each group. Memory: the links as ids and the sorts' runs (#56 §5)."""
    by_line = external_sort.ExternalSort(scratch, "lines", run_bytes)
    groups = cross_groups = extra = 0
    for group in _grouped(_pairs(layout, values), scratch, run_bytes):
        if all(m.sha[:32] == group[0].sha[:32] for m in group):  # byte-identical: the exact search's group
            continue
        cross = min(_rank(m.split) for m in group) != max(_rank(m.split) for m in group)
        by_line.add(json.dumps(near_line(group, classes), ensure_ascii=False).encode("utf-8") + bytes([cross]))
        groups, cross_groups, extra = groups + 1, cross_groups + cross, extra + len(group) - 1
    listed: list[str] = []
    path = os.path.join(scratch, "groups.jsonl")
    with open(path, "wb") as out:
        for record in by_line.sorted():  # the lines in order: the first cross-split ones are the smallest
            out.write(record[:-1] + b"\n")
            if record[-1] and len(listed) < MAX_LISTED:
                listed.append(record[:-1].decode("utf-8"))
    return path, listed, groups, cross_groups, extra


def group_near(layout: WorkLayout, distance: int, classes: Sequence[str],
               run_bytes: int = external_sort.RUN_BYTES, values: Sequence[near_blocks.BigValue] = ()) -> NearSummary:
    """Every range's pairs joined into groups: ``near/groups.jsonl``, ``near/dropped.json``, the summary.

    A group whose images are all byte-identical is left to the exact search (it is one of its groups).
    ``near/dropped.json`` is not drawn from the groups: an image is left out only when it is itself near a
    training image (``near/leaks-r.jsonl``), so a chain train - validation - validation - test, each link near
    but the ends far apart, leaves out the first validation image alone.
    Written whole, the summary last; a summary found (a killed run this one resumes) is returned as it is.
    ``run_bytes``: the external sorts' (the files are the same whatever it is). ``values``: the band values
    the ranges' tasks spilled (:func:`near_blocks.values`), whose block tasks' links and leaks join the ranges'.
    """
    done = layout.near_summary()
    if FileSystems.exists(done):
        return NearSummary.from_json(filesystems.read_text(done))
    with tempfile.TemporaryDirectory(prefix="near-groups-") as scratch:
        lines, listed, groups, cross, extra = _group_lines(layout, values, classes, scratch, run_bytes)
        with open(lines, "rb") as source, filesystems.whole_file(layout.near_groups()) as handle:
            while chunk := source.read(1 << 20):
                handle.write(chunk)
        with filesystems.whole_file(layout.near_dropped()) as handle:  # one JSON list, as json.dumps writes it
            handle.write(b"[")
            for index, leak in enumerate(_leaks(layout, values, scratch, run_bytes)):
                handle.write(b", " + leak if index else leak)
            handle.write(b"]")
        summary = NearSummary(distance, groups, extra, groups - cross, cross,
                              tuple(json.loads(line) for line in listed))
    filesystems.write_text(done, summary.to_json())
    return summary
