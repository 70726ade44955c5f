"""Leaks across the datasets of a mixture: an image trained on in one source that another source evaluates on.

In: the mixture's sources (their manifests, and each split's records table: ``sha256`` and ``perceptual_hash``
columns, :mod:`record_files.records_table`), the split the mixture trains on, and a Hamming distance.
Out: :class:`Leak` pairs, each an image of one source's training split (the mixture's) and an image of another
source's other splits (validation, test): byte-identical (the same ``image/key/sha256``) or near (perceptual
hashes within the distance). :func:`check` warns naming the first pairs, or refuses the mixture.

Each converted dataset's own leaks are its ``duplicates.jsonl``'s (the converter's near search); this finds the
ones no single conversion could see. No Beam, nothing decoded: the evaluation sides (the smaller, usually) are
indexed in memory, their hashes and ``d + 1`` bands of their perceptual hashes (two hashes within ``d`` bits
agree on at least one band of ``d + 1``: the pigeonhole principle), and every training row is probed a row group
at a time (numpy over the sorted band values; each candidate verified by its distance). Memory: the evaluation
sides' hashes (about 60 bytes an image) and one row group. Sources converted before records tables, or with
``--no-near-duplicates`` (no perceptual hashes), are checked as far as their tables allow, and the warning
says which were not.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence

import numpy as np
import pyarrow.compute as pc

from reader.info import DatasetInfo, open_records_table

logger = logging.getLogger(__name__)

NEAR_DISTANCE = 3  # the converter's default --near-distance: resized and re-encoded copies (median 0 bits)
SHOWN = 5  # pairs named in a warning or an error
LEAKS_CHOICES = ("warn", "refuse", "ignore")


class LeakError(ValueError):
    """A mixture trains on images another of its sources evaluates on (``leaks="refuse"``)."""


@dataclasses.dataclass(frozen=True)
class Leak:
    """An image trained on (``source``'s split, ``path``) and its copy in ``other``'s ``other_split``."""

    source: str
    path: str
    other: str
    other_split: str
    other_path: str
    distance: int  # bits between their perceptual hashes; 0 for a byte-identical copy
    exact: bool

    def __str__(self) -> str:
        how = "identical" if self.exact else f"{self.distance} bits apart"
        return f"{self.source}:{self.path} ~ {self.other}/{self.other_split}:{self.other_path} ({how})"


@dataclasses.dataclass
class _Side:
    """The evaluation images indexed: their SHA-256s, perceptual hashes and bands, and where each came from."""

    sha: list = dataclasses.field(default_factory=list)  # bytes
    hashes: list = dataclasses.field(default_factory=list)  # np.uint64 arrays
    where: list = dataclasses.field(default_factory=list)  # (source index, split, path)


def _bands(distance: int) -> list[tuple[int, int]]:
    """``(shift, width)`` of the ``distance + 1`` bands a 64-bit hash is cut into."""
    count = distance + 1
    edges = [round(64 * k / count) for k in range(count + 1)]
    return [(edges[k], edges[k + 1] - edges[k]) for k in range(count)]


def _band_values(hashes: np.ndarray, band: tuple[int, int]) -> np.ndarray:
    shift, width = band
    return (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)


def _popcount(values: np.ndarray) -> np.ndarray:
    return np.unpackbits(values.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


def find_leaks(infos: Sequence[DatasetInfo], names: Sequence[str], split: str,
               distance: int = NEAR_DISTANCE) -> tuple[list[Leak], list[str]]:
    """Every image of each source's ``split`` that another source holds in another split, and the sources
    that could not be checked (no records tables: converted before them, or an update's version before them).

    Pairs are sorted (source order, then paths); at most one per training image and other image.
    """
    unchecked = [name for info, name in zip(infos, names)
                 if any(s.records_table is None for s in info.splits.values())]
    side = _Side()
    for k, info in enumerate(infos):
        if names[k] in unchecked:
            continue
        for name, split_info in info.splits.items():
            if name == split:
                continue
            table = open_records_table(split_info)
            for group in table.row_groups(["sha256", "perceptual_hash", "path"]):
                side.sha.extend(group.column("sha256").to_pylist())
                hashes = group.column("perceptual_hash")
                side.hashes.append(pc.fill_null(hashes, 0).to_numpy().astype(np.uint64))
                known = ~hashes.is_null().to_numpy(zero_copy_only=False)
                side.where.extend((k, name, path, bool(flag)) for path, flag in
                                  zip(group.column("path").to_pylist(), known))
    if not side.where:
        return [], unchecked
    eval_hashes = np.concatenate(side.hashes)
    hashed = np.array([entry[3] for entry in side.where])
    by_sha: dict[bytes, list[int]] = {}
    for row, sha in enumerate(side.sha):
        by_sha.setdefault(sha, []).append(row)
    bands = _bands(distance)
    indexed = []
    for band in bands:
        values = _band_values(eval_hashes, band)
        order = np.flatnonzero(hashed)[np.argsort(values[hashed], kind="stable")]
        indexed.append((values[order], order))
    leaks: list[Leak] = []
    for k, info in enumerate(infos):
        if names[k] in unchecked or split not in info.splits:
            continue
        for group in open_records_table(info.splits[split]).row_groups(["sha256", "perceptual_hash", "path"]):
            paths = group.column("path").to_pylist()
            found = _near(group.column("perceptual_hash"), eval_hashes, indexed, bands, distance, side, k)
            found.update(_exact(group.column("sha256").to_pylist(), by_sha, side, k))  # identical, whatever the bits
            for (row, other), gap in sorted(found.items()):
                source, other_split, other_path, _ = side.where[other]
                leaks.append(Leak(names[k], paths[row], names[source], other_split, other_path, gap, gap < 0))
    leaks = [dataclasses.replace(leak, distance=max(leak.distance, 0)) for leak in leaks]
    return sorted(leaks, key=lambda leak: (names.index(leak.source), leak.path, names.index(leak.other),
                                           leak.other_split, leak.other_path)), unchecked


def _exact(shas: list, by_sha: dict, side: _Side, source: int) -> dict[tuple[int, int], int]:
    """``{(row, other): -1}`` for the rows byte-identical to another source's evaluation image."""
    found = {}
    for row, sha in enumerate(shas):
        for other in by_sha.get(sha, ()):
            if side.where[other][0] != source:
                found[row, other] = -1
    return found


def _near(column, eval_hashes: np.ndarray, indexed: list, bands: list, distance: int, side: _Side,
          source: int) -> dict[tuple[int, int], int]:
    """``{(row, other): bits}`` for the rows within ``distance`` bits of another source's evaluation image."""
    known = ~column.is_null().to_numpy(zero_copy_only=False)
    hashes = pc.fill_null(column, 0).to_numpy().astype(np.uint64)
    rows_all = np.flatnonzero(known)
    pairs = []
    for band, (values, order) in zip(bands, indexed):
        probe = _band_values(hashes[rows_all], band)
        low, high = np.searchsorted(values, probe, "left"), np.searchsorted(values, probe, "right")
        counts = high - low
        if not counts.sum():
            continue
        rows = np.repeat(rows_all, counts)
        starts = np.repeat(low, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
        pairs.append(np.stack([rows, order[starts]], axis=1))
    if not pairs:
        return {}
    pairs = np.unique(np.concatenate(pairs), axis=0)
    gaps = _popcount(np.ascontiguousarray(hashes[pairs[:, 0]] ^ eval_hashes[pairs[:, 1]]))
    keep = gaps <= distance
    return {(int(row), int(other)): int(gap) for (row, other), gap in zip(pairs[keep], gaps[keep])
            if side.where[other][0] != source}


def check(infos: Sequence[DatasetInfo], names: Sequence[str], split: str, leaks: str = "warn",
          distance: Optional[int] = None) -> list[Leak]:
    """Find the mixture's leaks across its sources; warn naming the first (``"warn"``), raise :class:`LeakError`
    naming them (``"refuse"``), or do nothing (``"ignore"``). Returns the pairs found."""
    if leaks not in LEAKS_CHOICES:
        raise ValueError(f"leaks={leaks!r} must be one of {LEAKS_CHOICES}")
    if leaks == "ignore" or len(infos) < 2:
        return []
    found, unchecked = find_leaks(infos, names, split, NEAR_DISTANCE if distance is None else distance)
    if unchecked:
        logger.info("sources %s have no records tables (converted before them, or a version an update wrote before "
                    "them): their images were not checked for leaks across the mixture's sources; converting them "
                    "again, or the next --update, writes the tables", unchecked)
    if not found:
        return found
    message = (f"{len(found)} images of the mixture's {split!r} split are in another source's evaluation splits: "
               + "; ".join(str(leak) for leak in found[:SHOWN]) + (" ..." if len(found) > SHOWN else "")
               + ". Reading the evaluation of those sources scores training images")
    if leaks == "refuse":
        raise LeakError(message + " (leaks='refuse'; leaks='warn' plans the mixture anyway)")
    logger.warning("%s (leaks='refuse' refuses such a mixture)", message)
    return found
