"""A mixture's layout: its canonical pipelines C, and each source's streams and windows dealt over them.

Data in: the global batch G, each source's records in the split (with repeat factors, its epoch's copies E),
and the ``canonical_pipelines`` and ``window`` asked for. Data out: C, and one
:class:`reader.order.StreamLayout` per source (``reader/mixtures/plan.py`` keeps them in the plan). Nothing is
read.

C is fixed when the mixture is planned: input pipeline h of H (H dividing C) reads canonical pipelines
h*C/H .. (h+1)*C/H - 1 only, so each of H hosts reads 1/H of every source's bytes, and the H pipelines'
batches concatenated are the one-pipeline global batch for every such H. A pipeline count that divides G but
not C still works: each pipeline reads the canonical pipelines its slots fall in and keeps its slots (reading
more than it decodes). With C = 1 the order is the one mixtures had before canonical pipelines (positions
saved then resume). See docs/reader.md, "Mixtures".
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from reader.options import as_int
from reader.order import DEFAULT_SHUFFLE_RECORDS, MIN_STREAM_RECORDS, WINDOWS_IN_FLIGHT, StreamLayout, stream_layout

SOURCE_STREAMS = 64  # a source's streams: 64, halved (down to C) while a stream would hold < 512 records
# Default canonical pipelines, as a single dataset's streams: gcd(G, 64), halved (not below 8) while the smallest
# source would give each fewer than 512 records an epoch (each of its streams costs a few ms of CPU an epoch to plan
# and open, and reads a buffer a segment), then while it holds fewer records than canonical pipelines.
MAX_CANONICAL = 64
MIN_DEFAULT_CANONICAL = 8


def canonical_pipelines(given: Optional[int], batch_size: int, records: Sequence[int], names: Sequence[str]) -> int:
    """The mixture's canonical pipelines: ``given`` checked, or the default (see :func:`reader.mixture`).

    Raises:
      ValueError: ``given`` does not divide G, or a source (named) has fewer records than it.
    """
    if given is None:
        canonical = math.gcd(batch_size, MAX_CANONICAL)  # a power of two: its halves divide G too
        while canonical > MIN_DEFAULT_CANONICAL and min(records) // canonical < MIN_STREAM_RECORDS:
            canonical //= 2
        while canonical > 1 and min(records) < canonical:
            canonical //= 2
        return canonical
    canonical = as_int(given)
    if canonical is None or canonical < 1 or batch_size % canonical:
        raise ValueError(f"canonical_pipelines={given!r} must be a positive integer dividing the global batch "
                         f"size {batch_size}")
    small = [(name, count) for name, count in zip(names, records) if count < canonical]
    if small:
        raise ValueError(f"source {small[0][0]!r} has {small[0][1]} records in this split, fewer than the "
                         f"{canonical} canonical pipelines, each of which reads its own part of every source: pass "
                         "fewer canonical_pipelines")
    return canonical


def source_layout(records: int, window: Optional[int], name: str, canonical: int = 1) -> StreamLayout:
    """A source's own streams: C * m, m = 64 / C halved (down to 1) while a stream gets < 512 records, dealt m
    to each canonical pipeline; one record a stream a "batch", so the sequence advances record by record;
    windows as one dataset's. With C = 1, the layout mixtures had before canonical pipelines."""
    if records < 1:
        raise ValueError(f"source {name!r} has no records in this split")
    each = max(1, SOURCE_STREAMS // canonical)
    while each > 1 and records // (canonical * each) < MIN_STREAM_RECORDS:
        each //= 2
    streams = canonical * each
    window = window or max(1, DEFAULT_SHUFFLE_RECORDS // (WINDOWS_IN_FLIGHT * streams))
    return stream_layout(records, streams, streams, window, name)


def repeated_layout(epoch_records: int, window: Optional[int], canonical: int) -> StreamLayout:
    """A source read with repeat factors: E records with repeats an epoch, E / C to each canonical pipeline, one
    a "batch" (it advances record by record); windows as one dataset's of C streams (with C = 1, the layout
    mixtures had before)."""
    return StreamLayout(epoch_records, canonical, canonical,
                        window or max(1, DEFAULT_SHUFFLE_RECORDS // (WINDOWS_IN_FLIGHT * canonical)))
