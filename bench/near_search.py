"""``python -m bench.near_search``: the near-duplicate search's CPU, this checkout's against the release's (#49).

    python -m bench.near_search --src /tmp/cmp_photos/photos-3000 --src /tmp/cmp_photos/photos-12000 --rounds 3
    python -m bench.near_search --candidates --sizes 12000,100000 --src /tmp/cmp_photos/photos-12000
    python -m bench.near_search --smoke          # the test suite's run: 40 generated photos, 1 round

In:  class folders of photos (``bench/data.py``'s), validated here by the converter's own stages, without
     Beam (``validate_part`` on every part, as ``bench.convert_bench steps`` does), so the work folder holds
     a real run's NEAR records (part size as the converter chooses it, the default distance).
Out: per folder and round (the two searches alternating which goes first), the CPU seconds of the search
     stage's functions -- ``find_pairs`` over every band range, then ``group_near`` -- for
     :func:`baseline_find_pairs` (the release's search, kept here as the baseline: a Python loop per
     candidate pair, a union-find keyed by bytes) and for :func:`beam_jobs.stages.near_links.find_pairs`;
     the medians and the new over the old; and a check that both wrote the same bytes (this checkout's search
     without its thumbnail check, #56, which the release did not have: the same pairs; ``near/dropped.json``
     left out, the release having dropped whole groups).
     ``--candidates``: for the band schemes the search could use (exact bands, or multi-index hashing: ``m``
     bands each probed within ``floor(d / m)`` bits), the candidate pairs compared and the probes made, on
     seeded random hashes and on clustered ones (the photos' hashes, or planted clusters), at each size;
     the search's CPU on them, and a numpy prototype's of 4 bands probed within 2 bits.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from beam_jobs.files import filesystems, work_records
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.stages import near_duplicates, near_groups, near_links, perceptual_hash
# The release's pair search is the tests' reference too: tests/ holds the one copy (bench runs from a clone,
# beside tests/, as bench/data.py does for the photos).
from tests.beam_jobs.stages.near_reference import baseline_near_pairs

DISTANCE = 10  # the release's default --near-distance, which the baseline searched at


# --- the baseline: the release's search (commit 6601793; its pair search: tests/.../near_reference.py) ------

def root(parent: dict, item):
    """``item``'s representative in a union-find forest (path halving); a new item is its own: how the
    release joined pairs into groups (the converter now does it in numpy, ``near_duplicates._boruvka``)."""
    parent.setdefault(item, item)
    while parent[item] != item:
        parent[item] = parent[parent[item]]
        item = parent[item]
    return item


def baseline_find_pairs(layout: WorkLayout, near_range: int, distance: int) -> int:
    """The release's ``find_pairs``: the same file, its links chosen by a union-find over CONTENT bytes."""
    records: list[bytes] = []
    for part in range(layout.num_parts):
        records += work_records.read_bucket(layout.near(part), work_records.NEAR, near_range)
    records.sort()
    parent: dict[bytes, bytes] = {}
    lines = []
    for a, b in baseline_near_pairs(records, layout.near_bands, distance):
        first, second = root(parent, a[8:]), root(parent, b[8:])
        if first != second:
            parent[max(first, second)] = min(first, second)
            lines.append(json.dumps([near_duplicates.Member.of(work_records.decode_near(a)[1]),
                                     near_duplicates.Member.of(work_records.decode_near(b)[1])]))
    lines.sort()
    with filesystems.whole_file(layout.near_leaks(near_range)) as handle:  # the release dropped by groups: none
        handle.write(b"")
    with filesystems.whole_file(layout.near_pairs(near_range)) as handle:
        handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
    return len(lines)


def _current_unchecked(layout: WorkLayout, near_range: int, distance: int) -> int:
    """This checkout's search as the release's was: every pair within the distance, no thumbnail check."""
    return near_links.find_pairs(layout, near_range, distance, check_thumbnails=False,
                                 oversized=10**18)  # every value searched in its range (no block tasks)


SEARCHES: dict[str, Callable[[WorkLayout, int, int], int]] = {
    "baseline": baseline_find_pairs, "current": _current_unchecked}


# --- a real run's work files -------------------------------------------------------------------------------------

def make_work(src: str, work: str) -> tuple[WorkLayout, list[str]]:
    """The work folder of converting ``src``'s class folders (all ``train``), validated up to the NEAR records."""
    from beam_jobs.files import work_layout
    from beam_jobs.options import EncodeOptions
    from beam_jobs.stage_records import ImageRef
    from beam_jobs.stages import list_parts, validate_part

    classes = sorted(name for name in os.listdir(src) if os.path.isdir(os.path.join(src, name)))
    refs = [ImageRef("train", f"{name}/{file}", label) for label, name in enumerate(classes)
            for file in sorted(os.listdir(os.path.join(src, name)))]
    part_size = list_parts.choose_part_size(len(refs))
    layout = work_layout.plan_layout(work, {"train": len(refs)}, part_size, DISTANCE + 1)
    for folder in layout.folders():
        os.makedirs(folder)
    list_parts.write_parts(layout, refs, part_size)
    for part in range(layout.num_parts):
        validate_part.validate_part(src, layout, part, 0, EncodeOptions())
    return layout, classes


def _outputs(layout: WorkLayout) -> list[str]:
    """The files both searches write the same (``near/dropped.json`` is not one: the release dropped whole
    groups, this checkout the direct pairs with a training image)."""
    return [layout.near_pairs(r) for r in range(layout.near_ranges)] + [layout.near_groups(), layout.near_summary()]


def search_cpu(layout: WorkLayout, classes: Sequence[str], search: str) -> tuple[float, float, dict[str, bytes]]:
    """CPU seconds of ``find_pairs`` over every range and of ``group_near`` (the search stage's functions), by
    ``search``; and the bytes they wrote. Earlier outputs are removed first (else both would resume)."""
    for path in [*_outputs(layout), *(layout.near_leaks(r) for r in range(layout.near_ranges))]:
        if FileSystems.exists(path):
            os.remove(path)
    started = time.process_time()
    for near_range in range(layout.near_ranges):
        SEARCHES[search](layout, near_range, DISTANCE)
    found = time.process_time()
    near_groups.group_near(layout, DISTANCE, classes)
    grouped = time.process_time()
    return found - started, grouped - found, {os.path.basename(path): _read(path) for path in _outputs(layout)}


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def compare(sources: Sequence[str], rounds: int) -> dict:
    """Per folder: each search's CPU (find_pairs, group_near) per round, medians, the ratio, identical bytes."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="near-search-") as scratch:
        for index, src in enumerate(sources):
            layout, classes = make_work(src, os.path.join(scratch, f"work{index}"))
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in SEARCHES}
            same = True
            for name in SEARCHES:  # a round not counted: each search's first call (imports, caches)
                search_cpu(layout, classes, name)
            for round_ in range(rounds):
                order = list(SEARCHES) if round_ % 2 == 0 else list(SEARCHES)[::-1]
                written = {}
                for name in order:
                    find, group, written[name] = search_cpu(layout, classes, name)
                    times[name].append((find, group))
                same &= written["baseline"] == written["current"]
            pairs = sum(len(text.splitlines()) for name, text in written["current"].items()
                        if name.startswith("pairs-"))
            results[src] = {
                "images": sum(1 for _ in _walk(src)), "near_ranges": layout.near_ranges, "links": pairs,
                "identical_outputs": bool(same),
                **{name: {"find_pairs_cpu_s": [t[0] for t in ts], "group_near_cpu_s": [t[1] for t in ts],
                          "median_total_cpu_s": statistics.median(t[0] + t[1] for t in ts),
                          "median_find_pairs_cpu_s": statistics.median(t[0] for t in ts)}
                   for name, ts in times.items()},
            }
            base, new = results[src]["baseline"], results[src]["current"]
            results[src]["current_over_baseline_total"] = new["median_total_cpu_s"] / base["median_total_cpu_s"]
            results[src]["current_over_baseline_find_pairs"] = (new["median_find_pairs_cpu_s"]
                                                                 / base["median_find_pairs_cpu_s"])
    return results


def _walk(src: str) -> Iterator[str]:
    for folder, _, files in os.walk(src):
        yield from (os.path.join(folder, name) for name in files)


# --- step 2: how many candidates each band scheme compares ------------------------------------------------------

def scheme_bands(bands: int) -> list[np.ndarray]:
    """``bands`` interleaved bands of the 64 bits (bit ``i`` in band ``i % bands``), as bit positions."""
    return [np.arange(band, perceptual_hash.BITS, bands) for band in range(bands)]


def candidate_counts(hashes: np.ndarray, distance: int, bands: int) -> dict:
    """For ``bands`` bands probed within ``radius = distance // bands`` bits (pigeonhole: every pair within
    ``distance`` is within ``radius`` on some band; ``bands = distance + 1`` is radius 0, the search's exact
    bands): the candidate pairs compared (a pair once per band where it is a candidate) and the probes made
    (band values looked up: images x bands x masks)."""
    radius = distance // bands
    started = time.process_time()
    values = perceptual_hash.band_values(hashes.tolist(), [tuple(b) for b in scheme_bands(bands)])
    candidates = probes = 0
    for column, positions in enumerate(scheme_bands(bands)):
        unique, counts = np.unique(values[:, column], return_counts=True)
        masks = [sum(1 << bit for bit in flipped) for r in range(1, radius + 1)
                 for flipped in itertools.combinations(range(len(positions)), r)]
        pairs = int((counts * (counts - 1) // 2).sum())
        for mask in masks:  # each unordered pair of values once: from the lower
            other = unique ^ np.uint64(mask)
            at = np.searchsorted(unique, other)
            found = (at < unique.size) & (unique[np.minimum(at, unique.size - 1)] == other) & (other > unique)
            pairs += int((counts[found] * counts[at[found]]).sum())
        candidates += pairs
        probes += len(hashes) * (len(masks) + 1)
    return {"bands": bands, "radius": radius, "candidate_pairs": candidates, "probes": probes,
            "lookup_cpu_s": time.process_time() - started}


def search_seconds(hashes: np.ndarray, distance: int) -> dict:
    """CPU seconds of the search (:func:`near_duplicates.pair_indices` and ``spanning_links``) over the NEAR
    records of ``hashes`` as one band range, and the pairs it finds (each once)."""
    from beam_jobs.stage_records import Accepted, ImageRef

    contents = [work_records.encode_content(Accepted(ImageRef("train", f"{index:08d}.jpg", 0),
                                                     index.to_bytes(32, "little"), "", 1, 1, perceptual_hash=int(h)))
                for index, h in enumerate(hashes.tolist())]
    records = sorted(near_duplicates.near_records(contents, distance))
    ids = {content: index for index, content in enumerate(dict.fromkeys(record[8:] for record in records))}
    images = np.fromiter((ids[record[8:]] for record in records), dtype=np.int64, count=len(records))
    started = time.process_time()
    found = 0

    def counted(blocks):
        nonlocal found
        for block in blocks:
            found += block.shape[1]
            yield block

    links = near_duplicates.spanning_links(counted(near_duplicates.pair_indices(records, distance + 1, distance)),
                                           images)
    return {"search_cpu_s": time.process_time() - started, "pairs": found, "links": links.shape[1]}


def _group_pairs(order: np.ndarray, starts: np.ndarray, counts: np.ndarray, left: np.ndarray,
                 right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of an image of group ``left[i]`` with one of group ``right[i]`` (groups: runs of ``order``)."""
    sizes = counts[left] * counts[right]
    which = np.repeat(np.arange(left.size), sizes)
    offset = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = counts[right][which]
    return order[starts[left][which] + offset // width], order[starts[right][which] + offset % width]


def multi_index_seconds(hashes: np.ndarray, distance: int, bands: int) -> dict:
    """CPU seconds of a multi-index search in numpy (a prototype, the alternative weighed in #49): per band,
    the images sorted by their value there, every value probed within ``distance // bands`` bits, the groups'
    pairs expanded and their distance tested; then every pair within ``distance`` once. No spanning forest,
    no "first common band" rule: a lower bound of what it would cost in the search."""
    n, radius = len(hashes), distance // bands
    started = time.process_time()
    values = perceptual_hash.band_values(hashes.tolist(), [tuple(b) for b in scheme_bands(bands)]).astype(np.int64)
    found, compared = [], 0
    for column, positions in enumerate(scheme_bands(bands)):
        order = np.argsort(values[:, column], kind="stable")
        unique, starts, counts = np.unique(values[order, column], return_index=True, return_counts=True)
        groups = np.arange(unique.size)
        a, b = _group_pairs(order, starts, counts, groups, groups)
        lows, highs = [a[a < b]], [b[a < b]]
        for r in range(1, radius + 1):
            for flipped in itertools.combinations(range(len(positions)), r):
                other = unique ^ sum(1 << bit for bit in flipped)
                at = np.searchsorted(unique, other)
                hit = (at < unique.size) & (unique[np.minimum(at, unique.size - 1)] == other) & (other > unique)
                a, b = _group_pairs(order, starts, counts, groups[hit], at[hit])
                lows.append(np.minimum(a, b))
                highs.append(np.maximum(a, b))
        low, high = np.concatenate(lows), np.concatenate(highs)
        compared += low.size
        near = np.bitwise_count(hashes[low] ^ hashes[high]) <= distance
        found.append(low[near] * n + high[near])
    pairs = np.unique(np.concatenate(found)).size
    return {"multi_index_cpu_s": time.process_time() - started, "multi_index_pairs": pairs,
            "multi_index_compared": compared}


def clustered_hashes(count: int, seed: int, photo_hashes: Optional[np.ndarray] = None) -> np.ndarray:
    """``count`` hashes alike as the bench photos' are: the photos' own when there are enough, else planted
    clusters (a 30th as many centres, each member 0-12 bits from its centre)."""
    if photo_hashes is not None and len(photo_hashes) >= count:
        return photo_hashes[:count]
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2**63, size=max(1, count // 30), dtype=np.int64).astype(np.uint64) << np.uint64(1)
    centres |= rng.integers(0, 2, size=centres.size).astype(np.uint64)
    hashes = centres[rng.integers(0, centres.size, size=count)]
    for index in range(count):
        for bit in rng.choice(64, size=int(rng.integers(0, 13)), replace=False):
            hashes[index] ^= np.uint64(1) << np.uint64(bit)
    return hashes


def photo_hashes(src: str) -> np.ndarray:
    """The perceptual hashes the converter takes of ``src``'s photos (its validation, in a scratch folder)."""
    with tempfile.TemporaryDirectory(prefix="near-hashes-") as scratch:
        layout, _ = make_work(src, os.path.join(scratch, "work"))
        hashes = [work_records.decode_content(record).perceptual_hash for part in range(layout.num_parts)
                  for record in work_records.iter_file(layout.content(part), work_records.CONTENT)]
    return np.array([h for h in hashes if h is not None], dtype=np.uint64)


def candidates(sizes: Sequence[int], src: Optional[str], seed: int = 0) -> list[dict]:
    """:func:`candidate_counts` of each scheme for the default distance, on random and clustered hashes."""
    photos = photo_hashes(src) if src else None
    rows = []
    for size in sizes:
        rng = np.random.default_rng(seed)
        kinds = {"random": rng.integers(0, 2**64 - 1, size=size, dtype=np.uint64, endpoint=True),
                 "clustered": clustered_hashes(size, seed, photos)}
        for kind, hashes in kinds.items():
            searched = search_seconds(hashes, DISTANCE)
            for bands in (DISTANCE + 1, 6, 5, 4, 3):
                rows.append({"hashes": size, "kind": kind, **candidate_counts(hashes, DISTANCE, bands),
                             **(searched if bands == DISTANCE + 1 else {}),
                             **(multi_index_seconds(hashes, DISTANCE, bands) if bands == 4 else {})})
    return rows


def _plant_copies(folder: str) -> None:
    """A byte copy, and a half-size re-encode, of the folder's first two photos: links for the smoke run."""
    from PIL import Image

    first, second = sorted(os.listdir(folder))[:2]
    shutil.copyfile(os.path.join(folder, first), os.path.join(folder, "copy-" + first))
    with Image.open(os.path.join(folder, second)) as image:
        image.reduce(2).save(os.path.join(folder, "half-" + second), quality=85)


# --- command line ---------------------------------------------------------------------------------------------

def _print_candidates(rows: Sequence[dict]) -> None:
    for row in rows:
        print(f"{row['hashes']:>7} {row['kind']:9} bands {row['bands']:2} radius {row['radius']}: "
              f"{row['candidate_pairs']:>14,} candidate pairs {row['probes']:>12,} probes "
              f"(lookups {row['lookup_cpu_s']:.2f} s CPU)"
              + (f"; the search {row['search_cpu_s']:.2f} s CPU, {row['pairs']:,} pairs within the "
                 f"distance, {row['links']:,} links" if "search_cpu_s" in row else "")
              + (f"; searched so (a prototype) {row['multi_index_cpu_s']:.2f} s CPU, "
                 f"{row['multi_index_pairs']:,} pairs" if "multi_index_cpu_s" in row else ""))


def _print_search(results: dict) -> None:
    for src, row in results.items():
        print(f"{src}: {row['images']} images, {row['near_ranges']} ranges, {row['links']} links; "
              f"find_pairs + group_near CPU {row['baseline']['median_total_cpu_s']:.3f} s -> "
              f"{row['current']['median_total_cpu_s']:.3f} s ({row['current_over_baseline_total']:.2f}x; "
              f"find_pairs {row['current_over_baseline_find_pairs']:.2f}x); "
              f"identical outputs: {row['identical_outputs']}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.near_search", description=__doc__.split("\n")[0])
    parser.add_argument("--src", action="append", default=[], help="class folders of photos (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--candidates", action="store_true", help="count each band scheme's candidate pairs")
    parser.add_argument("--sizes", default="12000,100000", help="hash counts for --candidates")
    parser.add_argument("--smoke", action="store_true", help="42 generated photos, 1 round, sizes 500")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    for src in args.src:
        if not os.path.isdir(src):
            parser.error(f"--src {src} is not a folder")
    if not (args.src or args.candidates or args.smoke):
        parser.error("give --src (or --candidates, or --smoke)")
    scratch = tempfile.mkdtemp(prefix="near-smoke-") if args.smoke else None
    results: dict = {}
    try:
        if scratch:
            from bench.data import make_photo_dataset

            make_photo_dataset(scratch, 40)
            _plant_copies(os.path.join(scratch, "cat"))
            args.src, args.rounds, args.sizes = [scratch], 1, "500"
        if args.candidates or args.smoke:
            sizes = [int(size) for size in args.sizes.split(",")]
            results["candidates"] = candidates(sizes, args.src[0] if args.src else None)
            _print_candidates(results["candidates"])
        if args.src and (not args.candidates or args.smoke):
            results["search"] = compare(args.src, args.rounds)
            _print_search(results["search"])
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(results, handle, indent=1)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(row["identical_outputs"] for row in results.get("search", {}).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
