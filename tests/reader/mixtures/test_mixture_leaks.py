"""Leaks across a mixture's datasets: an image one source trains on that another source evaluates on, found from
the records tables (identical bytes, or perceptual hashes within 3 bits: a resized copy) with no Beam and nothing
decoded; ``reader.mixture`` warns naming the pairs, ``leaks="refuse"`` refuses the mixture, ``"ignore"`` does not
look, and a source converted before records tables is named as not checked."""

from __future__ import annotations

import io
import json
import logging
import shutil

import numpy as np
import pytest
from PIL import Image

import reader
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from reader.mixtures import leaks as mixture_leaks
from tests.object_data import write_file

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _image(seed: int, size: tuple[int, int] = (160, 120)) -> Image.Image:
    """A smooth photo-like image (coarse noise, upscaled), its perceptual hash far from other seeds'."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)


def _jpeg(img: Image.Image, quality: int = 95) -> bytes:
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Dataset "a": train images 0-5 and a validation image 6. Dataset "b": train images 10-13, and in its
    validation a byte copy of a's train/cat/0.jpg, a resized re-encoded copy of a's train/dog/3.jpg, and image 14.
    Dataset "c" holds a copy of b's train image 10 in its own validation, converted before records tables."""
    root = tmp_path_factory.mktemp("leaks")
    files = {"a": {"train/cat/0.jpg": _jpeg(_image(0)), "train/cat/1.jpg": _jpeg(_image(1)),
                   "train/cat/2.jpg": _jpeg(_image(2)), "train/dog/3.jpg": _jpeg(_image(3)),
                   "train/dog/4.jpg": _jpeg(_image(4)), "train/dog/5.jpg": _jpeg(_image(5)),
                   "validation/cat/6.jpg": _jpeg(_image(6))},
             "b": {**{f"train/{label}/{i}.jpg": _jpeg(_image(i)) for i, label in ((10, "cat"), (11, "cat"), (12, "dog"),
                                                                              (13, "dog"))},
                   "validation/cat/copy.jpg": _jpeg(_image(0)),
                   "validation/dog/small.jpg": _jpeg(_image(3, (128, 96)), quality=80),
                   "validation/dog/14.jpg": _jpeg(_image(14))},
             "c": {"train/cat/20.jpg": _jpeg(_image(20)), "train/dog/21.jpg": _jpeg(_image(21)),
                   "validation/cat/b10.jpg": _jpeg(_image(10))}}
    out = {}
    for name, tree in files.items():
        for rel, data in tree.items():
            write_file(str(root / name / rel), data)
        out[name] = str(root / f"{name}-ds")
        run(ConvertOptions(src=str(root / name), out=out[name], shards=1), FAST, show_progress=False)
    manifest = json.loads((root / "c-ds" / "manifest.json").read_text())
    for split in manifest["splits"].values():  # as converted before records tables
        (root / "c-ds" / split.pop("records_table")["file"]).unlink()
    (root / "c-ds" / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_mixture_warns_naming_each_image_another_source_evaluates_on(sources, caplog):
    with caplog.at_level(logging.WARNING, logger="reader.mixtures.leaks"):
        reader.mixture([(sources["a"], 1), (sources["b"], 1)], "train", 4)
    assert "2 images of the mixture's 'train' split are in another source's evaluation splits" in caplog.text
    assert "a-ds:train/cat/0.jpg ~ b-ds/validation:validation/cat/copy.jpg (identical)" in caplog.text
    assert "a-ds:train/dog/3.jpg ~ b-ds/validation:validation/dog/small.jpg (" in caplog.text
    found, unchecked = mixture_leaks.find_leaks([reader.dataset_info(sources[k]) for k in "ab"], ["a", "b"], "train")
    assert unchecked == [] and [(leak.path, leak.other_path, leak.exact) for leak in found] == [
        ("train/cat/0.jpg", "validation/cat/copy.jpg", True), ("train/dog/3.jpg", "validation/dog/small.jpg", False)]
    assert found[1].distance <= mixture_leaks.NEAR_DISTANCE


def test_leaks_refuse_raises_naming_the_pairs_and_ignore_does_not_look(sources, caplog):
    with pytest.raises(mixture_leaks.LeakError, match=r"a:train/cat/0.jpg ~ b/validation:validation/cat/copy.jpg"):
        reader.mixture([(sources["a"], 1, "a"), (sources["b"], 1, "b")], "train", 4, leaks="refuse")
    with caplog.at_level(logging.WARNING, logger="reader.mixtures.leaks"):
        reader.mixture([(sources["a"], 1), (sources["b"], 1)], "train", 4, leaks="ignore")
    assert "evaluation splits" not in caplog.text
    with pytest.raises(ValueError, match="leaks='nope' must be one of"):
        reader.mixture([(sources["a"], 1), (sources["b"], 1)], "train", 4, leaks="nope")


def test_unrelated_sources_pass_and_a_source_without_records_tables_is_named_as_not_checked(sources, caplog):
    with caplog.at_level(logging.INFO, logger="reader.mixtures.leaks"):
        reader.mixture([(sources["a"], 1), (sources["c"], 1)], "train", 4, leaks="refuse")  # no leak between them
    assert "sources ['c-ds'] have no records tables" in caplog.text
    found, unchecked = mixture_leaks.find_leaks([reader.dataset_info(sources[k]) for k in "bc"], ["b", "c"], "train")
    assert found == [] and unchecked == ["c"]  # b's image 10 is in c's validation, which has no table to look in
    copy = shutil.copytree(sources["a"], sources["a"] + "-again")
    # The same dataset twice: both train on the same images (no leak), and both evaluate on image 6, which
    # neither trains on.
    assert mixture_leaks.find_leaks([reader.dataset_info(sources["a"]), reader.dataset_info(str(copy))],
                                    ["a", "again"], "train") == ([], [])
