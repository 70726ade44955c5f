"""A mixture's canonical pipelines in the graph: which ones an input pipeline reads, and each one's counts per step.

Data in: a :class:`reader.Mixture` (its ``canonical_split``, ``quotas.split_quotas``'s tables) and an
input pipeline's slots of the global batch. Data out: :class:`Share` (the canonical pipelines it reads
and the part of their slices it keeps) and :class:`SplitTables`, the split's tables as graph constants:
per step, records of each source in each canonical slice, records each canonical pipeline took before it
(O(1): one block row, one rotation row), and each slot's source.

Global batch t is the C canonical slices in order, slice c holding ``split(t)[c, k]`` records of source
k, source 0's first. Input pipeline h of H takes slots ``h*G/H .. (h+1)*G/H - 1``: when H divides C,
exactly the slices of canonical pipelines ``h*C/H .. (h+1)*C/H - 1``, so it reads only their streams;
otherwise the slices its slots fall in, of which it keeps its slots.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from reader.mixtures.plan import Mixture


@dataclasses.dataclass(frozen=True)
class Share:
    """The canonical pipelines ``first .. last - 1`` an input pipeline reads, and the records of their slices
    (``(last - first) * G / C`` a step) it keeps: ``keep[0] .. keep[1] - 1``."""

    first: int
    last: int
    keep: tuple[int, int]
    slice_size: int

    @classmethod
    def of(cls, plan: Mixture, slots: tuple[int, int]) -> "Share":
        size = plan.batch_size // plan.canonical_pipelines
        first, last = slots[0] // size, -(-slots[1] // size)
        return cls(first, last, (slots[0] - first * size, slots[1] - first * size), size)

    @property
    def count(self) -> int:
        return self.last - self.first

    @property
    def whole(self) -> bool:
        """Whether it keeps every record it reads (its pipeline count divides C)."""
        return self.keep == (0, self.count * self.slice_size)


@dataclasses.dataclass(frozen=True)
class SplitTables:
    """``plan.canonical_split`` as graph constants, looked up by a step tensor."""

    counts: tf.Tensor  # [P, C, K]
    cumulative: tf.Tensor  # [P + 1, C, K]
    rotated: tf.Tensor  # [C + 1, C, K]
    period: int
    canonical: int
    sources: int
    batch_size: int

    @classmethod
    def of(cls, plan: Mixture) -> "SplitTables":
        split = plan.canonical_split
        return cls(tf.constant(split.counts, tf.int64), tf.constant(split.cumulative, tf.int64),
                   tf.constant(split.rotated, tf.int64), split.period, split.canonical, len(plan.sources),
                   plan.batch_size)

    def _block(self, step: tf.Tensor) -> tuple:
        block, within = step // self.period, step % self.period
        positions = (tf.range(self.canonical, dtype=tf.int64) - block) % self.canonical
        return block, within, positions

    def step_counts(self, step: tf.Tensor) -> tf.Tensor:
        """``[C, K]``: records of each source in each canonical slice of global batch ``step``."""
        _, within, positions = self._block(step)
        return tf.gather(self.counts[within], positions)

    def consumed(self, step: tf.Tensor) -> tf.Tensor:
        """``[C, K]``: records each canonical pipeline took from each source before global ``step``."""
        block, within, positions = self._block(step)
        cycles, turn = block // self.canonical, block % self.canonical
        return cycles * self.rotated[-1] + self.rotated[turn] + tf.gather(self.cumulative[within], positions)

    def choices(self, step: tf.Tensor, share: Share) -> tf.Tensor:
        """The slots of ``share``'s slices at ``step``, each as ``(canonical pipeline - first) * K + source``:
        its slices in order, each source 0's records first (int64 ``[count * G / C]``)."""
        counts = self.step_counts(step)[share.first:share.last]
        picks = tf.repeat(tf.range(share.count * self.sources, dtype=tf.int64), tf.reshape(counts, [-1]))
        return tf.ensure_shape(picks, [share.count * share.slice_size])

    def slot_sources(self, step: tf.Tensor) -> tf.Tensor:
        """The source of each slot of global batch ``step`` (int32 ``[G]``)."""
        counts = tf.reshape(self.step_counts(step), [-1])
        indexes = tf.tile(tf.range(self.sources, dtype=tf.int32), [self.canonical])
        return tf.ensure_shape(tf.repeat(indexes, counts), [self.batch_size])
