"""Stage 6, near (its leaks): per band range, each evaluation image with a direct pair in the training split and
its closest partner there (``--drop-leaks`` leaves those out); under ``--update``, a new training image with a
direct pair among the kept evaluation images is the leaked side (a kept record never moves or goes).

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
        self._found: list[np.ndarray] = []  # (leaked evaluation image, training partner, bits)
        self._turned: list[np.ndarray] = []  # (new training image, kept evaluation partner, bits): --update's

    def see(self, pairs: np.ndarray) -> np.ndarray:
        """Note the pairs that cross splits; return them as they came (so the links see them too)."""
        ranks = self._ranks[pairs]
        across = (ranks[0] != ranks[1]) & (ranks.min(axis=0) == 0)  # an evaluation image and a training one
        if across.any():
            crossing = pairs[:, across]
            later_first = ranks[0, across] > ranks[1, across]
            later = np.where(later_first, crossing[0], crossing[1])
            earlier = np.where(later_first, crossing[1], crossing[0])
            # An update never drops a kept record (it is in a reused shard): a new training image near a kept
            # evaluation one is the leaked side instead, its partner the kept image.
            new, turned = ~self.kept[later], self.kept[later] & ~self.kept[earlier]
            if new.any():
                self._found.append(self._found_pairs(later[new], earlier[new]))
            if turned.any():
                self._turned.append(self._found_pairs(earlier[turned], later[turned]))
        return pairs

    def _found_pairs(self, leaked: np.ndarray, partners: np.ndarray) -> np.ndarray:
        bits = np.bitwise_count(self._hashes[leaked] ^ self._hashes[partners]).astype(np.int64)
        return np.stack([leaked, partners, bits])

    def closest(self) -> dict[int, tuple[int, int]]:
        """Each leaked record (and its copies of an evaluation split) -> ``(distance, partner record)``, the
        closest partner (by distance, then its place in the range's sorted records: the same choice on every run).

        A copy (the same band value, hash and thumbnail) pairs with whatever its first pairs with, in the same
        band, so the closest partner of any of them is theirs: found once a class of copies, in numpy (a bucket
        of a million blank frames across splits is a million leaks of one class)."""
        classes = self._classes() if self._found or self._turned else None
        # A turned leak's copies are the new training images of its class (a normal one's: the evaluation
        # images; its partners are training); the two sets of members are apart.
        return {**self._closest(self._found, classes, self._ranks > 0),
                **self._closest(self._turned, classes, self._ranks == 0)}

    def _closest(self, found: list[np.ndarray], classes: np.ndarray, side: np.ndarray) -> dict[int, tuple[int, int]]:
        """:meth:`closest` of one kind of leak, its members those of ``side`` (bool by record), never kept."""
        if not found:
            return {}
        later, earlier, bits = np.concatenate(found, axis=1)
        order = np.lexsort((earlier, bits, classes[later]))
        leaked = classes[later][order]
        closest = np.ones(len(order), dtype=bool)
        closest[1:] = leaked[1:] != leaked[:-1]
        partners = dict(zip(leaked[closest].tolist(), zip(bits[order][closest].tolist(),
                                                           earlier[order][closest].tolist())))
        members = np.flatnonzero(np.isin(classes, leaked[closest]) & side & ~self.kept)
        return {member: partners[group] for member, group in zip(members.tolist(), classes[members].tolist())}

    def _classes(self) -> np.ndarray:
        """Each record's class of copies: an id shared by the records of one band value, hash and thumbnail."""
        rows = np.hstack([self._positions[:, None].view(np.uint8), self._hashes[:, None].view(np.uint8),
                          self._thumbnails])
        keys = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1]))).ravel()
        return np.unique(keys, return_inverse=True)[1].ravel()
