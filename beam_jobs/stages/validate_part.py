"""Stage 2: validate one part: read and check each of its images, and sort what it found.

In:  ``parts/part-P`` (LISTED records, see :mod:`beam_jobs.files.work_records`).
Out: files, each written whole (temporary name, then renamed):
     - ``runs/<split>-P``: the part's accepted images of each split, ACCEPTED
       records sorted by (keyed hash, path) with an index at every key bucket;
     - ``content/part-P``: CONTENT records sorted by SHA-256, indexed by hash range (each with the image's
       perceptual hash, taken by the validation from the decode it did anyway);
     - ``near/part-P``: when the run searches near-duplicates (``layout.near_bands``), NEAR records, one per
       band of each image's perceptual hash, sorted, indexed by band range
       (:func:`beam_jobs.stages.near_duplicates.near_records`);
     - ``rejected/part-P.jsonl``: its lines of ``rejected.jsonl`` (rejected images, and the rejected
       objects of written ones), sorted;
     - ``spill-P``: the JPEG bytes of images that had to be re-encoded.
     - ``counts/part-P.json``: last, the part's :class:`beam_jobs.stages.count.PartCounts`
       (accepted per split and bucket, rejected per split and reason, objects placed and rejected),
       which it returns.
     Memory: one part's records.

The per-image work is :func:`beam_jobs.stages.validate.validate_chunk`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from beam_jobs import annotations, faults
from beam_jobs.files import filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import EncodeOptions
from beam_jobs.planning.carve import keyed_hash
from beam_jobs.stage_records import ImageRef, RejectedInput
from beam_jobs.stages.count import PartCounts
from beam_jobs.stages.near_duplicates import near_records
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.stages.validate import validate_chunk


def listed_objects(ref: ImageRef) -> int:
    """The objects a listed image's annotation gives it (0 for a classification image): those it would write and
    those already refused (an image rejected for one of them loses them all: they count as going with it)."""
    if not ref.annotation:
        return 0
    annotation = annotations.decode(ref.annotation)
    return len(annotation.boxes) + len(annotation.rejected) if isinstance(annotation, annotations.Objects) else 0


def validate_part(src: str, layout: WorkLayout, part: int, seed: int, options: EncodeOptions,
                  on_image: Optional[Callable[..., None]] = None) -> PartCounts:
    """Validate part ``part``; write its runs, content hashes and rejections; return its counts.

    A part whose counts were written (by this run's retried task, or by a killed
    run this one resumes) is complete: its counts are read back, nothing is redone.
    """
    done = layout.part_counts(part)
    if FileSystems.exists(done):
        counts = PartCounts.from_json(filesystems.read_text(done))
        if on_image is not None:
            on_image(sum(counts.accepted_per_split().values()) + counts.num_rejected(), resumed=True)
        return counts
    refs = [work_records.decode_listed(r) for r in work_records.read_all(layout.part(part), work_records.LISTED)]
    runs: dict[str, list[bytes]] = {split: [] for split in layout.buckets}
    content: list[bytes] = []
    rejected: list[str] = []
    rejected_counts: dict[str, dict[str, int]] = {}
    stored: dict[str, int] = {}
    objects: dict[str, int] = {}
    rejected_objects: dict[str, dict[str, int]] = {}
    assumed: dict[str, list] = {}
    objects_of_rejected: dict[str, int] = {}
    results = validate_chunk(src, refs, options, layout.work, part, on_result=on_image)
    for ref, checked in zip(refs, results):
        if isinstance(checked, RejectedInput):
            rejection = checked
            went = listed_objects(ref)
            if went:  # they are not written either: counted, and the image's line says so
                rejection = dataclasses.replace(checked, detail=f"{checked.detail}; its {went} "
                                                f"object{'' if went == 1 else 's'} went with it")
                objects_of_rejected[ref.split] = objects_of_rejected.get(ref.split, 0) + went
            rejected.append(rejection.to_json())
            reasons = rejected_counts.setdefault(ref.split, {})
            reasons[rejection.reason] = reasons.get(rejection.reason, 0) + 1
            continue
        result, tally = checked  # the annotation's counts come with it: it is not decoded again here
        placed = tally.placed if tally is not None else 0
        if tally is not None:
            objects[ref.split] = objects.get(ref.split, 0) + placed
            for refused in tally.rejected:
                rejected.append(refused.to_json())
                reasons = rejected_objects.setdefault(ref.split, {})
                reasons[refused.reason] = reasons.get(refused.reason, 0) + 1
            frame = tally.assumed
            if frame:
                seen = assumed.setdefault(frame, [0, []])
                seen[0] += 1
                seen[1] = sorted(seen[1] + [ref.relpath])[:3]
        runs[ref.split].append(work_records.encode_accepted(keyed_hash(seed, ref.relpath), result))
        stored[ref.split] = stored.get(ref.split, 0) + result.stored_bytes
        content.append(work_records.encode_content(result, placed))
    accepted = {}
    for split, records in runs.items():
        counts = work_records.write_file(layout.run(split, part), work_records.ACCEPTED, sorted(records),
                                         layout.buckets[split])
        accepted[split] = tuple(counts)
    work_records.write_file(layout.content(part), work_records.CONTENT, sorted(content), layout.hash_ranges)
    if layout.near_bands:
        work_records.write_file(layout.near(part), work_records.NEAR, near_records(content, layout.near_bands - 1),
                                layout.near_ranges)
    _write_lines(layout.rejected(part), sorted(rejected))
    counts = PartCounts(accepted, rejected_counts, stored, objects, rejected_objects, assumed, objects_of_rejected)
    filesystems.write_text(done, counts.to_json())  # last: the part is complete
    faults.point("part-validated")
    return counts


def _write_lines(path: str, lines: list[str]) -> None:
    with filesystems.whole_file(path) as handle:
        handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
