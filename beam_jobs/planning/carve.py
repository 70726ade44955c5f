"""The validation carve (``--val-fraction``) and the keyed hash that orders records.

In:  the members of a single-split input (``(split, class, relpath, source)``) and the count to carve per class;
     or, for an update, its new images per class and the class's images kept in each split.
Out: per class, the threshold key: images whose carve key is at or below it go to validation; for an update, the
     new images that go to validation (:func:`carve_new`).

Stratified per class, deterministic (a keyed BLAKE2b of the seed and the
path), and exact in bounded memory (see :func:`carve_thresholds`).
"""

from __future__ import annotations

import collections
import hashlib
import heapq
from array import array
from typing import Iterable, Mapping, Sequence

import record_schema


def keyed_hash(seed: int, key: str) -> bytes:
    """128-bit keyed BLAKE2b of ``key`` salted with ``seed``: stable everywhere."""
    return hashlib.blake2b(
        key.encode("utf-8", "surrogatepass"), digest_size=16, key=seed.to_bytes(8, "little")
    ).digest()


def carve_count(count: int, fraction: float) -> int:
    """Images of a class of ``count`` that ``--val-fraction`` moves to validation.

    ``round(count * fraction)``, but at least one image on each side; a class
    with a single image stays in train (validating on a class never trained on
    measures nothing).
    """
    return min(max(round(count * fraction), 1), count - 1)


def carve_key(seed: int, relpath: str) -> bytes:
    """The keyed hash that ranks a class's images for the validation carve (smallest go to validation)."""
    return keyed_hash(seed, "validation-carve/" + relpath)


KEY_BYTES = 16
# Carve candidates held at once while finding each class's threshold (~100 bytes each).
CARVE_BUDGET = 1 << 18


def carve_thresholds(items: Iterable[tuple[str, str, str, str]], train_counts: Mapping[str, int],
                     wanted: Mapping[str, int], seed: int) -> dict[str, bytes]:
    """Per class, the ``wanted[class]``-th smallest carve key: images at or below it go to validation.

    Stratified per class and deterministic. Exact in bounded memory: a radix
    selection over streaming passes of the members. Each pass counts, per
    class, the next byte of the keys that share the class's prefix so far (256
    counters per class) and narrows the prefix to the byte holding the wanted
    rank; once few keys share the prefixes, one pass collects and sorts them.
    Held in memory (``items`` a tuple), the members are simply sorted per class.

    ``items``: the members, re-iterable; ``train_counts``: images of each class in train.
    """
    prefix = {name: b"" for name in wanted}
    rank = dict(wanted)  # rank of the threshold among the keys sharing the prefix
    sharing = {name: train_counts[name] for name in wanted}
    while not isinstance(items, tuple) and sum(sharing.values()) > CARVE_BUDGET:
        refine = {name for name, count in sharing.items() if count > 1 and len(prefix[name]) < KEY_BYTES}
        if not refine:
            break
        counts = {name: array("q", bytes(8 * 256)) for name in refine}
        for _, name, relpath, _ in items:
            if name in counts:
                key, known = carve_key(seed, relpath), prefix[name]
                if key.startswith(known):
                    counts[name][key[len(known)]] += 1
        for name, histogram in counts.items():
            below = 0
            for byte, count in enumerate(histogram):
                if below + count >= rank[name]:
                    prefix[name] += bytes([byte])
                    rank[name] -= below
                    sharing[name] = count
                    break
                below += count
    candidates: dict[str, list[bytes]] = collections.defaultdict(list)
    for _, name, relpath, _ in items:
        if name in prefix:
            key = carve_key(seed, relpath)
            if key.startswith(prefix[name]):
                candidates[name].append(key)
    return {name: heapq.nsmallest(rank[name], keys)[-1] for name, keys in candidates.items()}


def carve_new(new: Mapping[int, Sequence[str]], kept: Mapping[tuple[int, str], int], fraction: float,
              seed: int) -> set[str]:
    """The new images of an update that go to validation: per stratum (a class id; one stratum for images that
    hold several classes, objects or tags, as a conversion carves them), the smallest carve keys among
    ``new[stratum]`` (relpaths), as many as bring the stratum's validation images to what a fresh carve of all
    its images would hold (:func:`carve_count` of kept plus new), never fewer than 0 nor more than the new ones.

    ``kept``: (stratum, split) -> the images the version keeps there (unchanged, and changed ones, which keep
    their split): they never move, so a stratum that lost validation images to deletions is made up from its
    new images only. Deterministic: the same images and counts give the same carve, whatever their order.
    """
    carved: set[str] = set()
    for stratum, paths in new.items():
        have = kept.get((stratum, "validation"), 0)
        total = len(paths) + have + kept.get((stratum, "train"), 0)
        need = min(max((carve_count(total, fraction) if total > 1 else 0) - have, 0), len(paths))
        carved.update(heapq.nsmallest(need, paths, key=lambda path: carve_key(seed, path)))
    return carved


def unstratified(classes: Sequence[str], train: Sequence[int], validation: Sequence[int],
                 carved: Mapping[str, int]) -> list[str]:
    """What keeps a published carve from being stratified, per class, from the records written (the plan carves
    what was listed, ``carved``: class -> images moved to validation; a class can lose them to rejections
    after): the classes carved that have no validation image written, and those with more validation images
    than train. Empty when every class is carved as asked."""
    without = [name for name, v in zip(classes, validation) if carved.get(name) and not v]
    more = [name for name, t, v in zip(classes, train, validation) if name and v > t]
    warnings = []
    if without:
        warnings.append(f"--val-fraction: {len(without)} classes have no validation image: each image carved out "
                        f"for validation was rejected ({record_schema.REJECTED_FILE}): {_names(without)}")
    if more:
        warnings.append(f"--val-fraction: {len(more)} classes have more validation images than training images "
                        f"(a fraction over 0.5, or training images rejected): {_names(more)}")
    return warnings


def _names(names: Sequence[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
