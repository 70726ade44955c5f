"""The report's plots, drawn with matplotlib (Agg, no window, no pyplot state) as PNG bytes.

In: the counts of :mod:`reader.tools.report_stats` (and the manifest's, rejected.jsonl's), as plain values.
Out: one PNG per figure (``bytes``), small (450 x 260 pixels, two to a row; 1,000 wide for many classes) for a
page that inlines them.

matplotlib is imported when the first figure is drawn, so ``import reader`` never needs it; without it the
error says which extra to install.
"""

from __future__ import annotations

import io
from typing import Mapping, Optional, Sequence

import numpy as np

from reader.tools import report_stats

HALF = (4.5, 2.6)  # inches, at 100 dpi: two side by side on the page
WIDE = (10.0, 3.2)  # one to a row (class bars past a dozen classes)
DPI = 100
MAX_LABELLED_BARS = 40  # classes beyond this are plotted ranked by count, unlabelled (the table names them)
SPLIT_COLORS = {"train": "#4C72B0", "validation": "#DD8452", "test": "#55A868"}


def _figure(size: tuple[float, float] = HALF, columns: int = 1):
    """A matplotlib Figure and its axes, without pyplot (no global state, no GUI backend)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError('the report draws its figures with matplotlib, which is not installed: '
                          'pip install ".[report]"') from None
    figure = Figure(figsize=size, dpi=DPI, layout="constrained")
    return figure, figure.subplots(1, columns, squeeze=False)[0]


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _color(split: str) -> str:
    return SPLIT_COLORS.get(split, "#8172B3")


def grouped_bars(names: Sequence[str], counts: Mapping[str, Sequence[int]], ylabel: str, title: str) -> bytes:
    """Bars per name, a bar per split side by side; past :data:`MAX_LABELLED_BARS` names, each split's counts
    ranked high to low as a line (names unreadable at that density; the page's table has them)."""
    figure, (axes,) = _figure(HALF if len(names) <= 12 else WIDE)
    splits = list(counts)
    if len(names) <= MAX_LABELLED_BARS:
        positions = np.arange(len(names))
        width = 0.8 / max(len(splits), 1)
        for index, split in enumerate(splits):
            axes.bar(positions + (index - (len(splits) - 1) / 2) * width, counts[split], width, label=split,
                     color=_color(split))
        axes.set_xticks(positions, [name if len(name) <= 18 else name[:17] + "…" for name in names],
                        rotation=45 if len(names) > 8 else 0, ha="right" if len(names) > 8 else "center",
                        fontsize=8)
    else:
        for split in splits:
            ranked = sorted(counts[split], reverse=True)
            axes.plot(np.arange(1, len(ranked) + 1), ranked, label=split, color=_color(split))
        axes.set_xlabel(f"{len(names)} classes, ranked by count")
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    if splits:
        axes.legend(fontsize=8)
    return _png(figure)


def count_bars(counts: Mapping[str, Mapping[int, int]], last_bin: Optional[int], xlabel: str, title: str) -> bytes:
    """A histogram of small integers (objects or labels an image) per split, as bars side by side."""
    figure, (axes,) = _figure()
    top = max((int(key) for split in counts.values() for key in split), default=0)
    positions = np.arange(top + 1)
    width = 0.8 / max(len(counts), 1)
    for index, (split, by_value) in enumerate(counts.items()):
        axes.bar(positions + (index - (len(counts) - 1) / 2) * width,
                 [by_value.get(value, 0) for value in positions], width, label=split, color=_color(split))
    if last_bin is not None and top >= last_bin:
        axes.annotate(f"{last_bin}+", (last_bin, 0), textcoords="offset points", xytext=(0, -22), ha="center",
                      fontsize=8)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("images")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    return _png(figure)


def box_sizes(sizes: Mapping[str, Mapping[str, int]]) -> bytes:
    """COCO's small / medium / large boxes per split."""
    names = list(report_stats.SIZE_NAMES)
    return grouped_bars([f"{name} ({rule})" for name, rule in zip(names, ("< 32²", "32²-96²", "≥ 96²"))],
                        {split: [by_name.get(name, 0) for name in names] for split, by_name in sizes.items()},
                        "objects", "box sizes (COCO's, by area in stored pixels)")


def aspect_ratios(counts: Mapping[str, Sequence[int]]) -> bytes:
    """Box width / height per split, on a log scale (1 is square)."""
    figure, (axes,) = _figure()
    edges = report_stats.ASPECT_BINS
    centres = np.sqrt(edges[:-1] * edges[1:])
    for split, values in counts.items():
        inner = np.asarray(values[1:-1], float)
        axes.step(centres, inner, where="mid", label=split, color=_color(split))
    axes.set_xscale("log", base=2)
    axes.set_xlabel("box width / height (pixels)")
    axes.set_ylabel("objects")
    axes.set_title("aspect ratios", fontsize=10)
    axes.legend(fontsize=8)
    return _png(figure)


def centre_heat_maps(grids: Mapping[str, np.ndarray]) -> bytes:
    """Where box centres fall in the image, a map per split (the image's top at the top)."""
    figure, row = _figure((3.3 * max(len(grids), 1) + 0.4, 3.0), max(len(grids), 1))
    for axes, (split, grid) in zip(row, grids.items()):
        shown = axes.imshow(grid, extent=(0, 1, 1, 0), cmap="viridis", interpolation="nearest")
        axes.set_title(f"{split}: box centres", fontsize=10)
        axes.set_xlabel("x / width", fontsize=8)
        axes.set_ylabel("y / height", fontsize=8)
        figure.colorbar(shown, ax=axes, shrink=0.8)
    return _png(figure)


def side_heat_map(grid: np.ndarray) -> bytes:
    """Image width against height over every split, on the log-spaced bins of :data:`report_stats.SIDE_BINS`."""
    figure, (axes,) = _figure((5.2, 4.2))
    rows, cols = np.nonzero(grid)
    if len(rows):
        top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
        # sides[width bin, height bin]: shown with width along x, height along y (up)
        counts = np.ma.masked_equal(grid[top:bottom, left:right].T, 0)  # no image: blank, not the palest color
        shown = axes.imshow(counts, origin="lower", cmap="magma_r", aspect="auto", interpolation="nearest")
        axes.set_xticks(range(bottom - top), [report_stats.side_label(i) for i in range(top, bottom)],
                        rotation=60, ha="right", fontsize=7)
        axes.set_yticks(range(right - left), [report_stats.side_label(i) for i in range(left, right)], fontsize=7)
        figure.colorbar(shown, ax=axes, label="images")
    axes.set_xlabel("width (px)")
    axes.set_ylabel("height (px)")
    axes.set_title("stored image sizes", fontsize=10)
    return _png(figure)


def horizontal_bars(counts: Mapping[str, int], xlabel: str, title: str) -> bytes:
    """One bar per reason (rejections, re-encodings), the largest on top."""
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]))
    figure, (axes,) = _figure((HALF[0], 0.8 + 0.3 * max(len(ordered), 2)))
    axes.barh([name for name, _ in ordered], [count for _, count in ordered], color="#C44E52")
    for position, (_, count) in enumerate(ordered):
        axes.annotate(f"{count:,}", (count, position), xytext=(3, 0), textcoords="offset points", va="center",
                      fontsize=8)
    axes.set_xlabel(xlabel)
    axes.set_title(title, fontsize=10)
    axes.tick_params(axis="y", labelsize=8)
    return _png(figure)
