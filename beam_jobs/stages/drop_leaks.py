"""``--drop-leaks``: the evaluation images that copy an earlier split's, gathered before the records are counted.

In:  ``duplicates/range-r.dropped.json`` of every hash range (exact groups: the byte-identical copies in an
     evaluation split after the group's earliest split, :func:`beam_jobs.stages.near_groups.leaked`) and
     ``near/dropped.json`` (when the near search ran: the evaluation images with a direct near pair in the
     training split), each entry a :class:`beam_jobs.stages.near_duplicates.Leak`.
Out: ``dropped/<split>``: DROPPED records (key and path), sorted and bucketed as the split's runs, which the
     ordering stage leaves out; ``dropped/dropped.jsonl``, each image with its partner and distance, which
     :func:`publish_list` puts beside the shards as ``dropped.jsonl`` (the manifest holds its count, name
     and SHA-256, not the list: every trainer parses the manifest); and a
     :class:`beam_jobs.stages.count.PartCounts` of what they held, which stage 3's totals lose
     (:func:`beam_jobs.stages.count.without`), so the shard counts and cuts are those of the images written.
     Memory: the dropped images.

Which images go depends only on the groups, which depend only on the input and the options: the same images
on every run and runner.
"""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs.files import filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning.carve import keyed_hash
from beam_jobs.planning.discover import display_path
from beam_jobs.stages.count import PartCounts
from beam_jobs.stages.near_duplicates import Leak


def _members(layout: WorkLayout) -> dict[str, Leak]:
    """Every dropped image by path: an image both searches drop keeps its closest partner (an exact copy,
    distance 0, before a near one)."""
    files = [layout.duplicates_dropped(hash_range) for hash_range in range(layout.hash_ranges)]
    if layout.near_bands:
        files.append(layout.near_dropped())
    members: dict[str, Leak] = {}
    for path in files:
        for line in json.loads(filesystems.read_text(path)):
            leak = Leak.parse(line)
            if leak.closer_than(members.get(leak.member.path)):
                members[leak.member.path] = leak
    return members


def _line(leak: Leak, classes: Sequence[str]) -> dict:
    """A ``dropped.jsonl`` line: the image left out, its partner in the training (or an earlier) split, and
    the bits between their perceptual hashes (0 for a byte-identical copy, or without hashes)."""
    member, partner = leak.member, leak.partner
    return {"split": member.split, "label": classes[member.label], "path": display_path(member.path),
            "partner": {"split": partner.split, "label": classes[partner.label], "path": display_path(partner.path)},
            "distance": leak.distance}


def collect_drops(layout: WorkLayout, seed: int, classes: list) -> PartCounts:
    """Write the DROPPED files and the manifest's list; return the counts the dropped images held."""
    members = _members(layout)
    records: dict[str, list[bytes]] = {split: [] for split in layout.buckets}
    accepted = {split: [0] * buckets for split, buckets in layout.buckets.items()}
    stored: dict[str, int] = {}
    objects: dict[str, int] = {}
    for member, _, _ in members.values():
        split, key = member.split, keyed_hash(seed, member.path)
        records[split].append(work_records.encode_dropped(key, member.path))
        accepted[split][work_records.bucket_of(key, layout.buckets[split])] += 1
        stored[split] = stored.get(split, 0) + member.stored_bytes
        objects[split] = objects.get(split, 0) + member.objects
    for split, found in records.items():
        work_records.write_file(layout.dropped(split), work_records.DROPPED, sorted(found), layout.buckets[split])
    listed = sorted((_line(entry, classes) for entry in members.values()), key=lambda line: (line["split"], line["path"]))
    with filesystems.whole_file(layout.dropped_list()) as handle:
        handle.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in listed).encode("utf-8"))
    counts = {split: tuple(counts) for split, counts in accepted.items()}
    return PartCounts(counts, {}, stored, {s: n for s, n in objects.items() if n})


def dropped_keys(layout: WorkLayout, split: str, bucket: int) -> frozenset:
    """The key and path of each image of one bucket of ``split`` that ``--drop-leaks`` leaves out (empty without it)."""
    path = layout.dropped(split)
    if not FileSystems.exists(path):
        return frozenset()
    return frozenset(work_records.read_bucket(path, work_records.DROPPED, bucket))


def publish_list(layout: WorkLayout, staging: str) -> dict:
    """``dropped.jsonl`` into staging (a copy of the work folder's, read in chunks), and the manifest's
    ``num_dropped``, ``dropped_file`` and ``dropped_sha256`` (``0, None, None`` without ``--drop-leaks``)."""
    path = layout.dropped_list()
    if not FileSystems.exists(path):
        return {"num_dropped": 0, "dropped_file": None, "dropped_sha256": None}
    digest, lines = hashlib.sha256(), 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as source, \
            filesystems.whole_file(FileSystems.join(staging, record_schema.DROPPED_FILE)) as out:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            lines += chunk.count(b"\n")
            out.write(chunk)
    return {"num_dropped": lines, "dropped_file": record_schema.DROPPED_FILE, "dropped_sha256": digest.hexdigest()}
