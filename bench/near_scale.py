"""``python -m bench.near_scale``: the near-duplicate search at the default distance on synthetic hashes, at two sizes.

    python -m bench.near_scale --sizes 1000000,3000000       # about 10 minutes on 2 cores
    python -m bench.near_scale --smoke                       # the test suite's run: 20,000 hashes

Issue #56 §1: the search must cost O(N) candidates by default, each task's memory flat in N, with its recall and
false pairs stated. No photos: the search sees only the CONTENT records' hashes, so the work files a real run's
stage 2 writes are made here from seeded hashes, through the converter's own functions
(:func:`beam_jobs.stages.near_duplicates.near_records` per part, as ``validate_part`` writes them).

In:  per size N and kind, N hashes: ``uniform`` (seeded random 64-bit values), ``photo-like`` (clusters of alike
     hashes: a thirtieth of N centres, each image 0-12 bits from one, as alike photos of one scene hash), or
     ``crowded`` (uniform, but :data:`CROWD` of them share one band value: a value too large for one task), and
     ``N / 100`` planted copies beside as many originals, 0-3 bits from them (resized and re-encoded copies of
     photos: median 0 bits, ``bench.near_duplicates``), each copy in another split than its original.
Out: per row, the search's CPU (``find_pairs`` over every band range, then ``group_near``) in all and per image,
     against the conversion's CPU per image (``--conversion-ms``: docs/benchmarks.md's quiet ``bench.compare``
     figure on this machine, 0.63 ms, unless given); the candidate pairs compared (every pair of images sharing
     a band value); the largest task's records and its peak of traced memory (``tracemalloc``, numpy included);
     the grouping task's (one for the run: it holds the images with a near pair, not all) and those images;
     the recall of the planted copies (the share in one group with their original); and the false pairs: links
     between two images that are no planted pair, measured, and expected for uniform hashes
     (``N**2 / 2`` times the chance two random hashes are within the distance).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from typing import Optional, Sequence

import numpy as np

from beam_jobs.files import work_layout, work_records
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.options import DEFAULT_NEAR_DISTANCE
from beam_jobs.stage_records import Accepted, ImageRef
from beam_jobs.stages import list_parts, near_blocks, near_duplicates, near_groups, near_links, perceptual_hash

CONVERSION_MS = 0.63  # docs/benchmarks.md: the converter's CPU an image without the near search (quiet, 2026-11-27)
GOAL_SHARE = 0.05  # #56: the search at most 5% of the conversion's CPU per image
SPLITS = ("train", "validation", "test")
KINDS = ("uniform", "photo-like", "crowded")
CROWD = 50_000  # "crowded": this many images share one band value (more than a task's chunk: block tasks)


def hashes_of(kind: str, count: int, seed: int, crowd: int = CROWD) -> np.ndarray:
    """``count`` seeded hashes: uniform, or photo-like (clusters of alike hashes)."""
    rng = np.random.default_rng(seed)
    if kind in ("uniform", "crowded"):
        hashes = rng.integers(0, 2**64 - 1, size=count, dtype=np.uint64, endpoint=True)
        if kind == "crowded":  # the first CROWD agree on band 0 (its bits cleared): one value of CROWD records
            hashes[:min(crowd, count // 4)] &= ~np.uint64(perceptual_hash.band_masks(DEFAULT_NEAR_DISTANCE)[0])
        return hashes
    centres = rng.integers(0, 2**64 - 1, size=max(1, count // 30), dtype=np.uint64, endpoint=True)
    hashes = centres[rng.integers(0, centres.size, size=count)]
    flips = rng.integers(0, 13, size=count)
    for bits in range(1, 13):  # each image 0-12 bits from its centre
        chosen = np.flatnonzero(flips == bits)
        for _ in range(bits):  # a bit drawn again may flip back: at most ``bits`` apart
            hashes[chosen] ^= np.uint64(1) << rng.integers(0, 64, size=chosen.size).astype(np.uint64)
    return hashes


def _flip_some(hashes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Copies 0-3 bits from ``hashes``: 0 bits for 60% (as resized and re-encoded photos hash), then 1, 2, 3."""
    bits = rng.choice(4, size=hashes.size, p=[0.6, 0.2, 0.12, 0.08])
    positions = rng.random((hashes.size, 64)).argsort(axis=1)[:, :3].astype(np.uint64)  # 3 distinct bits a copy
    copies = hashes.copy()
    for flip in range(3):
        chosen = np.flatnonzero(bits > flip)
        copies[chosen] ^= np.uint64(1) << positions[chosen, flip]
    return copies


def write_work(work: str, hashes: np.ndarray, seed: int) -> tuple[WorkLayout, int]:
    """The work folder stage 2 would leave for these images, plus ``len(hashes) // 100`` planted copies (paths
    ``copy-I`` of ``img-I``); returns the layout and the copies' count."""
    rng = np.random.default_rng(seed + 1)
    planted = len(hashes) // 100
    originals = rng.choice(len(hashes), size=planted, replace=False)
    copies = _flip_some(hashes[originals], rng)
    splits = rng.choice(3, size=len(hashes), p=[0.8, 0.1, 0.1])
    items = [(f"img-{i:09d}", int(h), int(s)) for i, (h, s) in enumerate(zip(hashes.tolist(), splits.tolist()))]
    items += [(f"copy-{i:09d}", int(h), (int(splits[i]) + 1) % 3) for i, h in zip(originals.tolist(), copies.tolist())]
    sizes = {split: 0 for split in SPLITS}
    for _, _, split in items:
        sizes[SPLITS[split]] += 1
    part_size = list_parts.choose_part_size(len(items))
    layout = work_layout.plan_layout(work, sizes, part_size, DEFAULT_NEAR_DISTANCE + 1)
    for folder in layout.folders():
        os.makedirs(folder, exist_ok=True)
    order = rng.permutation(len(items))  # parts hold images in listing order: shuffled, as a folder's names
    for part in range(layout.num_parts):
        content = [work_records.encode_content(Accepted(ImageRef(SPLITS[split], path, 0), path.encode().ljust(32),
                                                        "", 1, 1, stored_bytes=1, perceptual_hash=phash))
                   for path, phash, split in (items[i] for i in order[part * part_size:(part + 1) * part_size])]
        work_records.write_file(layout.near(part), work_records.NEAR,
                                near_duplicates.near_records(content, DEFAULT_NEAR_DISTANCE), layout.near_ranges)
    return layout, planted


def _candidates(hashes: np.ndarray) -> int:
    """Pairs of images that share a band value: what the search compares (before its first-band filter)."""
    values = perceptual_hash.band_values(hashes.tolist(), perceptual_hash.bands(DEFAULT_NEAR_DISTANCE))
    total = 0
    for column in values.T:
        _, counts = np.unique(column, return_counts=True)
        total += int((counts * (counts - 1) // 2).sum())
    return total


def _range_records(layout: WorkLayout, near_range: int) -> int:
    return sum(len(work_records.read_bucket(layout.near(part), work_records.NEAR, near_range))
               for part in range(layout.num_parts))


def search(layout: WorkLayout, oversized: Optional[int] = None) -> dict:
    """CPU of the search stage's functions, and the largest task's records and traced peak memory (of the
    range tasks, and of the block tasks of a band value too large for one, when there is one)."""
    started = time.process_time()
    values = []
    for near_range in range(layout.near_ranges):
        near_links.find_pairs(layout, near_range, DEFAULT_NEAR_DISTANCE, oversized=oversized)
        values += near_blocks.values(near_range, layout)
    for value in values:
        for block in range(value.blocks):
            near_blocks.search_block((value, block), layout, DEFAULT_NEAR_DISTANCE)
    pairs_cpu = time.process_time() - started
    started = time.process_time()
    near_groups.group_near(layout, DEFAULT_NEAR_DISTANCE, ["c"], values=values)
    group_cpu = time.process_time() - started
    sizes = [_range_records(layout, r) for r in range(layout.near_ranges)]
    largest = int(np.argmax(sizes))
    os.remove(layout.near_pairs(largest))  # searched again, traced
    peak = _traced(near_links.find_pairs, layout, largest, DEFAULT_NEAR_DISTANCE, oversized=oversized)
    block_peak = 0.0
    if values:  # the first block of the value of most blocks: it compares its block with every other
        value = max(values, key=lambda value: value.blocks)
        os.remove(layout.near_value(value.near_range, value.ordinal, f"pairs-{0:06d}.jsonl"))
        block_peak = _traced(near_blocks.search_block, (value, 0), layout, DEFAULT_NEAR_DISTANCE)
    for done in (layout.near_summary(), layout.near_groups(), layout.near_dropped()):  # grouped again, traced
        os.remove(done)
    group_peak = _traced(near_groups.group_near, layout, DEFAULT_NEAR_DISTANCE, ["c"], values=values)
    return {"find_pairs_cpu_s": pairs_cpu, "group_near_cpu_s": group_cpu, "ranges": layout.near_ranges,
            "largest_task_records": max(sizes), "largest_task_peak_mb": peak / 2**20,
            "spilled_values": len(values), "block_tasks": sum(value.blocks for value in values),
            "largest_block_task_peak_mb": block_peak / 2**20,
            "linked_images": _linked_images(layout, values), "group_task_peak_mb": group_peak / 2**20,
            "values": values}


def _traced(function, *args, **kwargs) -> float:
    """The peak of memory ``tracemalloc`` traces while ``function`` runs (numpy's arrays included)."""
    tracemalloc.start()
    try:
        function(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _link_files(layout: WorkLayout, values: Sequence[near_blocks.BigValue]) -> list[str]:
    """Every file of links: the ranges' and the block tasks'."""
    return [*(layout.near_pairs(r) for r in range(layout.near_ranges)),
            *near_blocks.value_files(layout, values, "pairs")]


def _linked_images(layout: WorkLayout, values: Sequence[near_blocks.BigValue]) -> int:
    """The images with a near pair: what the grouping task holds."""
    paths = set()
    for path in _link_files(layout, values):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                (_, _, a, *_), (_, _, b, *_) = json.loads(line)
                paths.update((a, b))
    return len(paths)


def score(layout: WorkLayout, planted: int, values: Sequence[near_blocks.BigValue] = ()) -> dict:
    """Recall of the planted copies, and links that join no planted pair (false pairs)."""
    group_of: dict[str, int] = {}
    with open(layout.near_groups(), encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            for image in json.loads(line)["images"]:
                group_of[image["path"]] = number
    found = sum(1 for path, group in group_of.items()
                if path.startswith("copy-") and group_of.get("img-" + path[5:]) == group)
    false = 0
    for path in _link_files(layout, values):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                (_, _, a, *_), (_, _, b, *_) = json.loads(line)
                (kind_a, of_a), (kind_b, of_b) = a.split("-", 1), b.split("-", 1)
                false += of_a != of_b or kind_a == kind_b  # not an image and its planted copy
    return {"planted": planted, "recall": found / planted if planted else 1.0, "false_links": false}


def expected_false_pairs(images: int) -> float:
    """Pairs of uniform random hashes within the default distance, among ``images``."""
    within = sum(math.comb(64, bits) for bits in range(DEFAULT_NEAR_DISTANCE + 1)) / 2.0**64
    return images * (images - 1) / 2 * within


def run(size: int, kind: str, seed: int, conversion_ms: float, crowd: int = CROWD,
        oversized: Optional[int] = None) -> dict:
    scratch = tempfile.mkdtemp(prefix="near-scale-")
    try:
        hashes = hashes_of(kind, size, seed, crowd)
        layout, planted = write_work(os.path.join(scratch, "work"), hashes, seed)
        row = {"images": size + planted, "kind": kind, "distance": DEFAULT_NEAR_DISTANCE,
               "candidate_pairs": _candidates(hashes), **search(layout, oversized)}
        row.update(score(layout, planted, row.pop("values")), expected_false_pairs_uniform=expected_false_pairs(size + planted))
        cpu = row["find_pairs_cpu_s"] + row["group_near_cpu_s"]
        row["search_us_per_image"] = cpu / row["images"] * 1e6
        row["share_of_conversion"] = row["search_us_per_image"] / (conversion_ms * 1000)
        return row
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.near_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000000,3000000", help="hash counts (comma-separated)")
    parser.add_argument("--kinds", default="uniform,photo-like", help=", ".join(KINDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--conversion-ms", type=float, default=CONVERSION_MS,
                        help="the conversion's CPU per image to compare with (default: %(default)s ms)")
    parser.add_argument("--crowd", type=int, default=CROWD, help="crowded: images sharing one band value "
                        "(default: %(default)s; at most a quarter of the size)")
    parser.add_argument("--oversized", type=int, help="a band value of more records is spilled to block tasks "
                        "(default: the range task's chunk; a huge number searches every value in its range's task)")
    parser.add_argument("--smoke", action="store_true", help="20,000 hashes of each kind")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args(argv)
    sizes = [20000] if args.smoke else [int(size) for size in args.sizes.split(",")]
    kinds = args.kinds.split(",")
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds takes {', '.join(KINDS)}; got {args.kinds}")
    rows = []
    for size in sizes:
        for kind in kinds:
            row = run(size, kind, args.seed, args.conversion_ms, args.crowd, args.oversized)
            rows.append(row)
            print(f"{row['images']:>9,} {kind:10} d={row['distance']}: {row['candidate_pairs']:,} candidate pairs, "
                  f"search {row['find_pairs_cpu_s'] + row['group_near_cpu_s']:.1f} s CPU "
                  f"({row['search_us_per_image']:.1f} us an image, {row['share_of_conversion']:.1%} of the "
                  f"conversion's; goal <= {GOAL_SHARE:.0%}); largest task {row['largest_task_records']:,} records, "
                  f"{row['largest_task_peak_mb']:.0f} MB traced; {row['spilled_values']} values spilled to "
                  f"{row['block_tasks']} block tasks, the largest {row['largest_block_task_peak_mb']:.0f} MB; grouping {row['linked_images']:,} linked images, "
                  f"{row['group_task_peak_mb']:.0f} MB traced; recall of planted copies {row['recall']:.1%}; "
                  f"false links {row['false_links']} (uniform hashes expect {row['expected_false_pairs_uniform']:.2g})",
                  flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
