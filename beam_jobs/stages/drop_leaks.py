"""``--drop-leaks``: the evaluation images that copy an earlier split's, gathered before the records are counted.

In:  ``duplicates/range-r.dropped.json`` of every hash range (exact groups) and ``near/dropped.json`` (near
     groups, when the near search ran): the members of groups spanning splits that sit in an evaluation
     split (validation, test) after the group's earliest split (:func:`beam_jobs.stages.near_duplicates.leaked`).
Out: ``dropped/<split>``: DROPPED records (key and path), sorted and bucketed as the split's runs, which the
     ordering stage leaves out; ``dropped/dropped.json``, the list the manifest gives; and a
     :class:`beam_jobs.stages.count.PartCounts` of what they held, which stage 3's totals lose
     (:func:`beam_jobs.stages.count.without`), so the shard counts and cuts are those of the images written.
     Memory: the dropped images.

Which images go depends only on the groups, which depend only on the input and the options: the same images
on every run and runner.
"""

from __future__ import annotations

import json

from apache_beam.io.filesystem import CompressionTypes

from beam_jobs.files import filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.planning.carve import keyed_hash
from beam_jobs.planning.discover import display_path
from beam_jobs.stages.count import PartCounts


def _members(layout: WorkLayout) -> dict[str, list]:
    """Every dropped member, by path (an image in an exact and a near group is dropped once)."""
    files = [layout.duplicates_dropped(hash_range) for hash_range in range(layout.hash_ranges)]
    if layout.near_bands:
        files.append(layout.near_dropped())
    members: dict[str, list] = {}
    for path in files:
        for member in json.loads(filesystems.read_text(path)):
            members[member[2]] = member
    return members


def collect_drops(layout: WorkLayout, seed: int, classes: list) -> PartCounts:
    """Write the DROPPED files and the manifest's list; return the counts the dropped images held."""
    members = _members(layout)
    records: dict[str, list[bytes]] = {split: [] for split in layout.buckets}
    accepted = {split: [0] * buckets for split, buckets in layout.buckets.items()}
    stored: dict[str, int] = {}
    objects: dict[str, int] = {}
    for split, _, relpath, _, _, stored_bytes, placed in members.values():
        key = keyed_hash(seed, relpath)
        records[split].append(work_records.encode_dropped(key, relpath))
        accepted[split][work_records.bucket_of(key, layout.buckets[split])] += 1
        stored[split] = stored.get(split, 0) + stored_bytes
        objects[split] = objects.get(split, 0) + placed
    for split, found in records.items():
        work_records.write_file(layout.dropped(split), work_records.DROPPED, sorted(found), layout.buckets[split])
    listed = sorted(({"split": m[0], "label": classes[m[1]], "path": display_path(m[2])} for m in members.values()),
                    key=lambda entry: (entry["split"], entry["path"]))
    filesystems.write_text(layout.dropped_list(), json.dumps(listed, ensure_ascii=False))
    counts = {split: tuple(counts) for split, counts in accepted.items()}
    return PartCounts(counts, {}, stored, {s: n for s, n in objects.items() if n})


def dropped_keys(layout: WorkLayout, split: str, bucket: int) -> frozenset:
    """The key and path of each image of one bucket of ``split`` that ``--drop-leaks`` leaves out (empty without it)."""
    path = layout.dropped(split)
    if not FileSystems.exists(path):
        return frozenset()
    return frozenset(work_records.read_bucket(path, work_records.DROPPED, bucket))


def manifest_entry(layout: WorkLayout) -> dict:
    """The manifest's ``num_dropped`` and ``dropped`` (every image left out, by split and path)."""
    path = layout.dropped_list()
    if not FileSystems.exists(path):
        return {"num_dropped": 0, "dropped": []}
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        listed = json.loads(handle.read().decode("utf-8"))
    return {"num_dropped": len(listed), "dropped": listed}
