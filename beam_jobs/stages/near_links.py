"""Stage 6, near (a band range's task): the links and the leaks among the images that share a band's value.

In:  bucket ``r`` of every part's ``near/part-P`` (NEAR records, sorted by band position: stage 2's
     :func:`beam_jobs.stages.near_duplicates.near_records`), merged a chunk at a time
     (:func:`beam_jobs.files.bucket_merge.key_chunks`).
Out: ``near/pairs-r.jsonl``, the links between the pairs within the distance that first agree on a band of the
     range (a spanning forest of them: as many lines as images at most), and ``near/leaks-r.jsonl``, each
     evaluation image with a direct pair in the training split and its closest partner there. Then once: the
     links joined into groups (:mod:`beam_jobs.stages.near_groups`).

Memory (#56 §1: per-task memory flat in N): a chunk of the range's records (:data:`CHUNK_RECORDS`, cut where
a band value ends, so a band value's records are searched together), what the merge reads ahead of each part,
and the lines written (a link or leak line per image with a pair, at most). Holding the range whole cost ~1.2
KB a record: 26 MB at 1M images, 258 MB at 10M, since a range holds 4/3 of a part's images and the part grows
as N / 64 until its cap. A band value of more records than a chunk is not held: it streams into
:func:`beam_jobs.stages.near_blocks.spill` (an external sort on local disk), and its pairs are searched by
block tasks after the ranges' (listed in ``near/values-r.json``). A range never straddles two bands
(:func:`beam_jobs.files.work_layout.near_ranges` makes their number a multiple of the bands,
:func:`beam_jobs.stages.near_duplicates.band_start` aligns the bands with the buckets), so an image has one
record in it and its id is the record's place in its chunk: no table of the range's images. A pair is two
records of one band value, so of one chunk (or of one spilled value): the chunks' forests are the range's,
each found alone.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from apache_beam.io.filesystem import CompressionTypes

from beam_jobs.files import bucket_merge, filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.stages import near_blocks, near_leaks, perceptual_hash
from beam_jobs.stages.near_duplicates import COLLAPSE_OVER, member_text, pair_indices, spanning_links

CHUNK_RECORDS = 1 << 14  # NEAR records searched at once (about 3 MB of them); a band value of more is spilled


def find_pairs(layout: WorkLayout, near_range: int, distance: int, check_thumbnails: bool = True,
               collapse_over: int = COLLAPSE_OVER, chunk_records: int = CHUNK_RECORDS,
               read_bytes: int = bucket_merge.READ_BYTES, oversized: Optional[int] = None) -> int:
    """The links of band range ``near_range`` into ``near/pairs-r.jsonl`` (lines sorted); returns their number.

    A link is a pair within ``distance`` that joins two groups of the range's pairs found so far: a spanning
    forest of the range's pairs, which joins the same groups as all of them (``group_near`` needs no more),
    so ten photos that all look alike write 9 lines, not 45. The forest is found in numpy a chunk at a time
    (:func:`spanning_links`; no pair crosses two chunks): the same links as over the range at once, Python
    touching only the links written. A range whose file exists (a killed run this one resumes) is not searched again.
    ``check_thumbnails`` False: every pair within the distance, unchecked (``bench.near_search`` compares that
    with the release's search). ``collapse_over``: a band value's bucket of more records compares one image of
    each hash and thumbnail (:func:`pair_indices`); the others are linked to it. ``chunk_records`` and
    ``read_bytes``: :func:`bucket_merge.key_chunks`'s (the files are the same whatever they are).
    ``oversized``: a band value of more records is spilled for :mod:`near_blocks`' tasks (listed in
    ``near/values-r.json``), not searched here (default: ``chunk_records``; the groups and leaks are the same).
    """
    oversized = chunk_records if oversized is None else oversized
    out = layout.near_pairs(near_range)
    if FileSystems.exists(out):
        with FileSystems.open(out, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return sum(1 for _ in handle)
    lines: list[str] = []
    leak_lines: list[str] = []
    spilled: list[near_blocks.BigValue] = []
    parts = layout.near_inputs()  # an update's kept records' files too
    for chunk in bucket_merge.key_chunks(parts, work_records.NEAR, near_range, chunk_records, read_bytes,
                                         oversized=oversized):
        if isinstance(chunk, bucket_merge.OversizedKey):  # its block grid is searched over tasks
            spilled.append(near_blocks.spill(layout, near_range, len(spilled), chunk.records, chunk_records))
            continue
        thumbnails = np.frombuffer(work_records.near_thumbnails(chunk), np.uint8).reshape(-1, perceptual_hash.THUMB_BYTES)
        leaks = near_leaks.Leaks(chunk, thumbnails)
        pairs = pair_indices(chunk, layout.near_bands, distance, thumbnails=thumbnails if check_thumbnails else None,
                             collapse_over=collapse_over)
        if check_thumbnails:
            pairs = perceptual_hash.verified_pairs(pairs, thumbnails, kept=leaks.kept if layout.kept_parts else None)
        images = np.arange(len(chunk))  # one record an image: the range holds one band
        halves: dict[int, str] = {}
        lines += [f"[{_half(chunk, a, halves)}, {_half(chunk, b, halves)}]"  # as json.dumps writes the pair
                  for a, b in spanning_links(map(leaks.see, pairs), images).T.tolist()]
        leak_lines += [f"[{_half(chunk, later, halves)}, {_half(chunk, partner, halves)}, {bits}]"
                       for later, (bits, partner) in leaks.closest().items()]
    lines.sort()
    leak_lines.sort()
    near_blocks.list_values(layout, near_range, spilled)
    with filesystems.whole_file(layout.near_leaks(near_range)) as handle:  # before the pairs: they mark the range done
        handle.write("".join(line + "\n" for line in leak_lines).encode("utf-8"))
    with filesystems.whole_file(out) as handle:
        handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
    return len(lines)


def _half(chunk: list[bytes], index: int, halves: dict[int, str]) -> str:
    """An image's half of a link line (:func:`member_text`), made once an image of the chunk."""
    if index not in halves:
        halves[index] = member_text(chunk[index])
    return halves[index]
