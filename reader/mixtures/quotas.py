"""Exact quotas of a weighted mixture: how many examples each source gives to each global batch.

Data in: the sources' weights and the global batch size G. Data out: a
:class:`Quotas` table, from which ``counts(step)`` (examples of each source in
one batch) and ``consumed(step)`` (examples of each source in all batches
before it) are O(1) lookups: a pure function of the step, no state to carry.

Each source's share of a batch is ``G * w_k / sum(w)``, an exact fraction
(weights are read as the decimals they print as: 0.3 is 3/10). Every batch
gives source k the floor or the ceiling of its share, and after any number of
steps T its total is the floor or the ceiling of ``T * G * w_k / sum(w)``:
the counts never drift from the weights by a whole example.

Why a schedule and not rounding: rounding the cumulative targets (largest
remainder on ``T * share``) keeps totals within one, but a batch's count can
then be one below the floor (the Alabama paradox of apportionment). The
fractional parts ``f_k`` of the shares sum to an integer R, the extra slots of
each batch; handing R slots per step to tasks of rates ``f_k`` so that each
task's total stays within one of ``T * f_k`` is proportionate-fair (Pfair)
scheduling on R processors, which the PD^2 rule (earliest pseudo-deadline,
then the successor bit, then the later group deadline) always achieves
(Srinivasan and Anderson, 2002). The schedule repeats with the period P of
the shares' denominators; one period is computed once, with integers only.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from fractions import Fraction
from typing import Sequence

import numpy as np

MAX_PERIOD = 4096  # steps of one period of the schedule; longer periods are rounded (the shares move < 1/(G P))
MAX_SPLIT_ENTRIES = 1 << 20  # a split's table [steps, C, K] lengthened to balance its blocks up to this size


@dataclasses.dataclass(frozen=True)
class Quotas:
    """One period of the schedule.

    Attributes:
      batch_size: G.
      base: each source's floor of its share, per batch.
      extras: ``[P, K]`` 0/1, the extra slot of source k at step t of the period.
      cumulative: ``[P + 1, K]`` the extras before step t of the period (row P: a whole period's).
      shares: the shares realised, as fractions of a batch (``G * weight``, weights normalised).
    """

    batch_size: int
    base: tuple[int, ...]
    extras: np.ndarray
    cumulative: np.ndarray
    shares: tuple[Fraction, ...]

    @property
    def period(self) -> int:
        return int(self.extras.shape[0])

    @property
    def num_sources(self) -> int:
        return len(self.base)

    @property
    def weights(self) -> tuple[float, ...]:
        """The weights realised (shares over G), normalised to sum to 1."""
        return tuple(float(share / self.batch_size) for share in self.shares)

    def counts(self, step: int) -> np.ndarray:
        """Examples of each source in global batch ``step``."""
        return np.asarray(self.base, np.int64) + self.extras[_step(step) % self.period]

    def consumed(self, step: int) -> np.ndarray:
        """Examples of each source in global batches ``0 .. step - 1``: O(1), from one row of the table."""
        periods, within = divmod(_step(step), self.period)
        base = np.asarray(self.base, np.int64)
        return step * base + periods * self.cumulative[-1] + self.cumulative[within]

    def step_table(self) -> np.ndarray:
        """``[P, K]`` int64: the count of each source at each step of the period."""
        return np.asarray(self.base, np.int64)[None, :] + self.extras


def _step(step: int) -> int:
    """A global step (an integer >= 0), or ``ValueError``."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"a global step must be an integer >= 0, got {step!r}")
    return int(step)


def as_fractions(weights: Sequence[float], what: Sequence[str]) -> list[Fraction]:
    """Weights as exact fractions, as they print (0.3 is 3/10); ``ValueError`` naming a bad one by ``what``."""
    fractions = []
    for weight, name in zip(weights, what):
        if isinstance(weight, bool) or not isinstance(weight, (int, float, Fraction, Decimal, np.integer,
                                                               np.floating)):
            raise ValueError(f"the weight of {name} must be a number, got {type(weight).__name__} {weight!r}")
        if not math.isfinite(float(weight)) or weight < 0:
            raise ValueError(f"the weight of {name} must be a finite number >= 0, got {weight!r}")
        # As the weight prints: str() of a NumPy float is its shortest form (np.float32(0.3) prints 0.3).
        exact = isinstance(weight, (Fraction, Decimal, int, np.integer))
        fractions.append(Fraction(weight) if exact else Fraction(str(float(weight)) if isinstance(weight, float)
                                                                 else str(weight)))
    if sum(fractions) <= 0:
        raise ValueError(f"the weights {list(weights)} sum to 0: give at least one source a positive weight")
    return fractions


def plan_quotas(weights: Sequence[Fraction], batch_size: int) -> Quotas:
    """The schedule of ``weights`` (exact fractions, any scale) at global batch ``batch_size``."""
    total = sum(weights)
    shares = [Fraction(batch_size) * w / total for w in weights]
    period = math.lcm(*(share.denominator for share in shares))
    if period > MAX_PERIOD:
        shares = _rounded(shares, batch_size, MAX_PERIOD)
        period = math.lcm(*(share.denominator for share in shares))
    base = [math.floor(share) for share in shares]
    rates = [int((share - floor) * period) for share, floor in zip(shares, base)]  # extras per period
    extras = pfair_schedule(rates, period)
    cumulative = np.concatenate([np.zeros((1, len(rates)), np.int64), np.cumsum(extras, axis=0)])
    return Quotas(batch_size, tuple(base), extras, cumulative, tuple(shares))


def _rounded(shares: list[Fraction], batch_size: int, period: int) -> list[Fraction]:
    """Shares in whole 1/``period``-ths of an example, summing to ``batch_size`` (largest remainders)."""
    scaled = [share * period for share in shares]
    whole = [math.floor(value) for value in scaled]
    left = batch_size * period - sum(whole)
    for index in sorted(range(len(scaled)), key=lambda i: (-(scaled[i] - whole[i]), i))[:left]:
        whole[index] += 1
    return [Fraction(value, period) for value in whole]


def pfair_schedule(rates: Sequence[int], period: int) -> np.ndarray:
    """``[period, K]`` 0/1: task k gets ``rates[k]`` of the ``period`` steps, ``sum(rates) / period`` tasks a step.

    PD^2: at each step the ``R`` eligible tasks of highest priority run. Task
    k's j-th unit (1-based, weight w = rate / period) may run from
    ``floor((j - 1) / w)`` and must by its pseudo-deadline ``ceil(j / w)``;
    after every step each task's total is the floor or ceiling of ``t * w``.
    """
    count = len(rates)
    slots, left = divmod(sum(rates), period)
    if left:
        raise ValueError(f"the extra slots {sum(rates)} / {period} are not a whole number a step")
    done = [0] * count
    table = np.zeros((period, count), np.int64)
    for step in range(period):
        eligible = [k for k in range(count) if done[k] < rates[k] and (done[k] * period) // rates[k] <= step]
        ranked = sorted(eligible, key=lambda k: _priority(rates[k], period, done[k] + 1, k))
        for k in ranked[:slots]:
            table[step, k] = 1
            done[k] += 1
    return table


def _priority(rate: int, period: int, unit: int, index: int) -> tuple:
    """PD^2's order (smaller first): pseudo-deadline, then b-bit 1 before 0, then later group deadline first."""
    deadline = -(-unit * period // rate)
    b_bit = 1 if (unit * period) % rate else 0
    return deadline, -b_bit, -_group_deadline(rate, period, unit), index


def _group_deadline(rate: int, period: int, unit: int) -> int:
    """The group deadline of a heavy task's unit (weight >= 1/2; 0 for a light one).

    The end of the cascade of length-2 windows overlapping by one that
    starts at ``unit``: the first later unit whose window does not overlap
    the next (b-bit 0) ends it at its deadline, one whose successor's window
    has length 3 ends it one step after its deadline.
    """
    if 2 * rate < period:
        return 0
    current = unit
    while True:
        deadline = -(-current * period // rate)
        if (current * period) % rate == 0:
            return deadline
        following_release = (current * period) // rate
        following_deadline = -(-(current + 1) * period // rate)
        if following_deadline - following_release >= 3:
            return deadline + 1
        current += 1


@dataclasses.dataclass(frozen=True)
class Split:
    """How each global batch's counts are dealt over C canonical pipelines (each a slice of G / C slots).

    Step t is step ``j = t % P`` of a block of the quota period P, and block ``q = t // P`` of a cycle of C
    blocks; canonical pipeline c takes, from source k, ``counts[j, (c - q) % C, k]`` records: position
    ``(c - q) % C`` of the block's dealing. Within a block, the step's remainders (``counts(t)[k] % C``
    each) are dealt in source order round the C positions from an offset chosen to keep every position's
    running totals near ``consumed / C``; the blocks rotate the positions, so over a cycle of P * C steps
    every canonical pipeline takes exactly ``consumed(P)[k]`` records of source k and the split repeats.

    Attributes:
      canonical: C.
      counts: ``[P, C, K]`` records of source k at step j of a block, position c'; rows sum to G / C,
        the positions of a step to ``counts(j)[k]``, each the floor or ceiling of ``counts(j)[k] / C``.
      cumulative: ``[P + 1, C, K]`` records before step j of a block, by position.
      rotated: ``[C + 1, C, K]`` records canonical pipeline c takes in blocks ``0 .. q - 1`` of a cycle.
    """

    canonical: int
    counts: np.ndarray
    cumulative: np.ndarray
    rotated: np.ndarray

    @property
    def period(self) -> int:
        return int(self.counts.shape[0])

    def step_counts(self, step: int) -> np.ndarray:
        """``[C, K]``: records each canonical pipeline takes from each source at global ``step``."""
        block, within = divmod(_step(step), self.period)
        return self.counts[within, (np.arange(self.canonical) - block) % self.canonical]

    def consumed(self, step: int) -> np.ndarray:
        """``[C, K]``: records each canonical pipeline took from each source before global ``step``: O(1)."""
        block, within = divmod(_step(step), self.period)
        cycles, turn = divmod(block, self.canonical)
        positions = (np.arange(self.canonical) - turn) % self.canonical
        return cycles * self.rotated[-1] + self.rotated[turn] + self.cumulative[within, positions]


def split_quotas(quotas: Quotas, canonical: int) -> Split:
    """The :class:`Split` of ``quotas`` over ``canonical`` pipelines (C must divide G)."""
    if canonical < 1 or quotas.batch_size % canonical:
        raise ValueError(f"canonical_pipelines={canonical} must divide the global batch size {quotas.batch_size}")
    table = quotas.step_table()
    period, sources = table.shape
    # A block as long as it takes every source's total to be a multiple of C (at most C periods, within
    # MAX_SPLIT_ENTRIES), so that the dealing can give every position the same share of it.
    whole = math.lcm(*(canonical // math.gcd(canonical, int(total)) for total in quotas.consumed(period)))
    if whole * period * canonical * sources <= MAX_SPLIT_ENTRIES:
        table = np.tile(table, (whole, 1))
        period *= whole
    counts = np.zeros((period, canonical, sources), np.int64)
    done = np.zeros((canonical, sources), np.int64)
    rolls = (np.arange(canonical)[None, :] - np.arange(canonical)[:, None]) % canonical
    for step in range(period):
        dealt = _dealt(table[step], canonical)
        target = quotas.consumed(step + 1) / canonical
        # the offset that leaves the positions' totals nearest their share of the source's records so far
        rolled = dealt[rolls]  # [offset, C, K]: the dealing from each offset
        counts[step] = rolled[int(np.argmin(np.square(done + rolled - target).sum(axis=(1, 2))))]
        done += counts[step]
    cumulative = np.concatenate([np.zeros((1, canonical, sources), np.int64), np.cumsum(counts, axis=0)])
    block = cumulative[-1]
    rotated = np.zeros((canonical + 1, canonical, sources), np.int64)
    for turn in range(canonical):  # block q deals position (c - q) % C to canonical pipeline c
        rotated[turn + 1] = rotated[turn] + block[(np.arange(canonical) - turn) % canonical]
    return Split(canonical, counts, cumulative, rotated)


def _dealt(counts: np.ndarray, canonical: int) -> np.ndarray:
    """``[C, K]``: each source's count split over C positions from offset 0, its remainder dealt in source
    order round the positions (so every position gets the same number of records: G / C)."""
    base, left = np.divmod(counts, canonical)
    dealt = np.repeat(base[None, :], canonical, axis=0)
    units = np.repeat(np.arange(len(counts)), left)  # the remainders, source after source
    np.add.at(dealt, (np.arange(len(units)) % canonical, units), 1)
    return dealt
