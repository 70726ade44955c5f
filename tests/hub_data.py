"""Parquet datasets as the Hugging Face Hub ships them, written by ``datasets`` itself (a real writer)."""

from __future__ import annotations

import io
import os
from typing import Sequence

import numpy as np
from PIL import Image

NAMES = ("zebra", "ant", "mole")  # ClassLabel order: the label ids, deliberately not sorted


def photo(seed: int, image_format: str = "JPEG") -> bytes:
    """A small distinct image (a JPEG unless ``image_format`` says otherwise)."""
    rng = np.random.default_rng(seed)
    array = (rng.random((24 + seed % 5, 32, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, image_format)
    return buffer.getvalue()


def rows(count: int, first: int, image_format: str = "JPEG") -> dict:
    """Columns of ``count`` rows: ``image`` cells with bytes and a unique path, ``labels`` cycling over NAMES."""
    extension = "jpg" if image_format == "JPEG" else image_format.lower()
    return {"image": [{"bytes": photo(first + i, image_format), "path": f"img_{first + i:04d}.{extension}"}
                      for i in range(count)],
            "labels": [(first + i) % len(NAMES) for i in range(count)]}


def features(image_column: str = "image", names: Sequence[str] = NAMES):
    import datasets

    return datasets.Features({image_column: datasets.Image(), "labels": datasets.ClassLabel(names=list(names))})


def write_split(folder: str, split: str, columns: dict, shards: int = 1, image_column: str = "image") -> list[str]:
    """``{folder}/{split}-0000k-of-0000n.parquet`` as ``push_to_hub`` names them."""
    import datasets

    os.makedirs(folder, exist_ok=True)
    if image_column != "image":
        columns = {image_column: columns["image"], "labels": columns["labels"]}
    dataset = datasets.Dataset.from_dict(columns, features=features(image_column))
    paths = []
    for index in range(shards):
        path = os.path.join(folder, f"{split}-{index:05d}-of-{shards:05d}.parquet")
        dataset.shard(shards, index, contiguous=True).to_parquet(path)
        paths.append(path)
    return paths


def hub_snapshot(root: str, train_shards: int = 2) -> dict[str, dict]:
    """A snapshot as ``huggingface-cli download`` leaves it: README.md and data/{split}-*.parquet."""
    splits = {"train": rows(30, 0), "validation": rows(9, 100), "test": rows(6, 200)}
    for split, columns in splits.items():
        write_split(os.path.join(root, "data"), split, columns, shards=train_shards if split == "train" else 1)
    with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as handle:
        handle.write("---\nlicense: mit\n---\n# A test dataset\n")
    return splits
