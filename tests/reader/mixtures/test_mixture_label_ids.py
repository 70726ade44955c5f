"""A mixture refuses a record whose label id is outside its source's classes, naming the source, instead of
reading it as some class (the id was clamped to the source's last class, a wrong label without a word)."""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf

import reader


@pytest.fixture(scope="module")
def short_of_a_class(mixture_sources):
    """Source "c" (circle, star: 8 train records) described by a manifest that lists its circles only, so its
    stars' id 1 is outside its classes, beside source "a"."""
    (a, _), _, (c, _) = mixture_sources
    info = reader.dataset_info(c)
    return a, dataclasses.replace(info, classes=info.classes[:1]), c


@pytest.mark.parametrize("training", [True, False], ids=["training", "evaluation"])
@pytest.mark.slow
def test_a_label_id_outside_the_sources_classes_is_refused_naming_the_source(short_of_a_class, training):
    a, wrong, folder = short_of_a_class
    plan = reader.mixture([(a, 1), (wrong, 1, "c")], "train", 4)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        for _ in reader.build_mixture(plan, "train", 4, 32, training=training, seed=1).take(12):
            pass
    message = raised.value.message
    assert f"source 1 (c: {folder}, split train): a record has label id 1, outside the 1 classes" in message
    assert f"python -m converter verify {folder} names the record" in message
