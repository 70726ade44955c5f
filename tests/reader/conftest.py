"""Data the reader's test modules share: converted once per test process, read-only."""

from __future__ import annotations

import os

import numpy as np
import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from converter.demo import draw_shape

MIXTURE_WEIGHTS = (0.5, 0.3, 0.2)


def convert_shapes(root, name: str, classes: dict, per_class: int, seed: int) -> str:
    """A small classification dataset of drawn shapes (40x48 JPEGs), converted in this process: folder -> shape."""
    rng = np.random.default_rng(seed)
    src = root / f"src-{name}"
    for folder, shape in classes.items():
        os.makedirs(src / folder)
        for index in range(per_class):
            draw_shape(rng, shape, 40, 48).save(src / folder / f"{index:03d}.jpg", quality=90)
    out = str(root / name)
    run(ConvertOptions(src=str(src), out=out, shards=2, val_fraction=0.2, seed=1),
        ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show_progress=False)
    return out


@pytest.fixture(scope="session")
def mixture_sources(tmp_path_factory) -> list:
    """The three sources of tests/reader/mixtures/test_mixture.py and test_mixture_hosts.py, with their weights: "a"
    (circle, square; 32 train records), "b" (square, triangle; 20) and "c" (circle, star; 8)."""
    root = tmp_path_factory.mktemp("mixture")
    made = [convert_shapes(root, "a", {"circle": "circle", "square": "square"}, 20, 1),
            convert_shapes(root, "b", {"square": "square", "triangle": "triangle"}, 12, 2),
            convert_shapes(root, "c", {"circle": "circle", "star": "triangle"}, 5, 3)]
    return list(zip(made, MIXTURE_WEIGHTS))
