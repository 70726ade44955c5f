"""Stage 6, near (its leaks): per band range, each evaluation image with a direct pair in the training split and
its closest partner there (``--drop-leaks`` leaves those out).

In:  a band range's sorted NEAR records (their heads: split, hash, position), their thumbnails, and the pairs the
     range's search finds (:func:`beam_jobs.stages.near_duplicates.find_pairs` passes each block through
     :meth:`Leaks.see`).
Out: :meth:`Leaks.closest`: leaked record -> ``(distance, partner record)``, which ``find_pairs`` writes as
     ``near/leaks-r.jsonl``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from beam_jobs.files import work_records


class Leaks:
    """The direct pairs across splits among a band range's pairs: for each evaluation image (a record index)
    paired with a training image, its closest such partner (``--drop-leaks`` leaves it out).

    Against the training split only: what a model has seen is what inflates its scores, and a chain of near
    pairs must not carry a leak on (train T near validation V1, V1 near V2, V2 near test X: V1 alone leaks,
    though X is within the distance of V2). Byte-identical copies are the exact search's (any earlier split).

    Pairs are between an image's first copy (the same bytes sort together, the earliest split's first; in a
    bucket too large to compare whole, the same hash and thumbnail: :func:`near_duplicates._signature_firsts`), so a leaked
    image's copies of a later split than its partner's leak with it: its partner is theirs.
    """

    def __init__(self, records: Sequence[bytes], thumbnails: np.ndarray) -> None:
        heads = np.frombuffer(b"".join(record[:work_records.NEAR_HEAD.itemsize] for record in records), dtype=work_records.NEAR_HEAD) \
            if records else np.zeros(0, dtype=work_records.NEAR_HEAD)
        self._ranks = heads["split"].astype(np.int64)  # split codes are record_schema.SPLITS' order
        self._hashes = heads["phash"].astype(np.uint64)
        self._positions = heads["position"].astype(np.uint64)
        self._thumbnails = thumbnails
        self.kept = (heads["hashed"] & work_records.KEPT).astype(bool)  # an update's kept records: never leaked
        self._found: list[np.ndarray] = []

    def see(self, pairs: np.ndarray) -> np.ndarray:
        """Note the pairs that cross splits; return them as they came (so the links see them too)."""
        ranks = self._ranks[pairs]
        across = (ranks[0] != ranks[1]) & (ranks.min(axis=0) == 0)  # an evaluation image and a training one
        if across.any():
            crossing = pairs[:, across]
            later_first = ranks[0, across] > ranks[1, across]
            later = np.where(later_first, crossing[0], crossing[1])
            earlier = np.where(later_first, crossing[1], crossing[0])
            new = ~self.kept[later]  # an update never drops a kept record (it is in a reused shard)
            later, earlier = later[new], earlier[new]
            bits = np.bitwise_count(self._hashes[later] ^ self._hashes[earlier]).astype(np.int64)
            self._found.append(np.stack([later, earlier, bits]))
        return pairs

    def closest(self) -> dict[int, tuple[int, int]]:
        """Each leaked record (and its copies of an evaluation split) -> ``(distance, partner record)``, the
        closest partner (by distance, then its place in the range's sorted records: the same choice on every run).

        A copy (the same band value, hash and thumbnail) pairs with whatever its first pairs with, in the same
        band, so the closest partner of any of them is theirs: found once a class of copies, in numpy (a bucket
        of a million blank frames across splits is a million leaks of one class)."""
        if not self._found:
            return {}
        later, earlier, bits = np.concatenate(self._found, axis=1)
        classes = self._classes()
        order = np.lexsort((earlier, bits, classes[later]))
        leaked = classes[later][order]
        closest = np.ones(len(order), dtype=bool)
        closest[1:] = leaked[1:] != leaked[:-1]
        partners = dict(zip(leaked[closest].tolist(), zip(bits[order][closest].tolist(),
                                                           earlier[order][closest].tolist())))
        members = np.flatnonzero(np.isin(classes, leaked[closest]) & (self._ranks > 0)  # partners are training
                                 & ~self.kept)
        return {member: partners[group] for member, group in zip(members.tolist(), classes[members].tolist())}

    def _classes(self) -> np.ndarray:
        """Each record's class of copies: an id shared by the records of one band value, hash and thumbnail."""
        rows = np.hstack([self._positions[:, None].view(np.uint8), self._hashes[:, None].view(np.uint8),
                          self._thumbnails])
        keys = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1]))).ravel()
        return np.unique(keys, return_inverse=True)[1].ravel()
