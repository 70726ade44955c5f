"""One entry point: ``reader.build_dataset`` reads a folder, a DatasetInfo or a Mixture; positions are one type.

The deprecated spellings (``build_mixture``, ``keys=``, ``label_offset=``, ``info=``) still work, warn naming
the new call, and give the very batches the new call gives. Data: the mixture sources of
tests/reader/conftest.py ("a", "b", "c": 32, 20 and 8 train records) and the demo dataset.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import reader

BATCH = 12


@pytest.fixture(scope="module")
def plan(mixture_sources):
    return reader.mixture(mixture_sources, "train", BATCH)


def _arrays(dataset, steps: int) -> list:
    return [tuple(np.asarray(part) if not isinstance(part, dict) else part for part in batch)
            for batch in dataset.take(steps).as_numpy_iterator()]


def _same(left: list, right: list) -> bool:
    return len(left) == len(right) and all(
        len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b)) for a, b in zip(left, right))


@pytest.fixture(scope="module")
def mixed(plan) -> list:
    """Steps 0-2 of the plan read by the new call, with each example's source."""
    return _arrays(reader.build_dataset(plan, image_size=16, seed=5, num_steps=3, dtype=tf.uint8, with_source=True), 3)


@pytest.mark.slow
def test_a_mixture_goes_where_the_dataset_goes_with_build_mixtures_batches(plan, mixed):
    with pytest.warns(DeprecationWarning, match=r"reader.build_mixture is deprecated.*reader.build_dataset\(plan"):
        old = reader.build_mixture(plan, "train", BATCH, 16, seed=5, num_steps=3, dtype=tf.uint8, with_source=True)
    assert len(mixed) == 3 and _same(mixed, _arrays(old, 3))
    # evaluation: any split and batch of the plan's sources, each source once, source after source
    evaluation = _arrays(reader.build_dataset(plan, "validation", 5, 16, training=False, with_source=True), 10)
    sources = np.concatenate([batch[2] for batch in evaluation])
    assert len(sources) == 14 and (np.diff(sources) >= 0).all() and set(sources.tolist()) == {0, 1, 2}


def test_a_plans_split_and_batch_are_its_own_and_another_is_refused_naming_both(plan):
    with pytest.raises(ValueError, match=r"planned for batch_size=12 and build_dataset got batch_size=8: leave "
                                         "batch_size unset"):
        reader.build_dataset(plan, batch_size=8, image_size=16, seed=1)
    with pytest.raises(ValueError, match=r"planned for split 'train' and build_dataset got split='validation'"):
        reader.build_dataset(plan, "validation", image_size=16, seed=1)
    with pytest.raises(ValueError, match=r"num_epochs= counts one dataset's epochs.*num_steps="):
        reader.build_dataset(plan, image_size=16, num_epochs=1)
    with pytest.raises(ValueError, match=r"foreign= reads shards written by other tools"):
        reader.build_dataset(plan, image_size=16, foreign=reader.ForeignShards(label_offset=-1))
    with pytest.raises(ValueError, match=r"skip_corrupt=True would shift a mixture's exact quotas"):
        reader.build_dataset(plan, image_size=16, skip_corrupt=True)


@pytest.mark.slow
def test_start_takes_the_same_kinds_for_a_mixture_and_a_dataset(plan, mixed, demo_dataset):
    position = reader.position(plan, seed=5, step=2)
    assert position == plan.position(5, 2) and isinstance(position, reader.Position)
    resumed = _arrays(reader.build_dataset(plan, image_size=16, start=position.to_json(), num_steps=3,
                                           dtype=tf.uint8, with_source=True), 3)
    assert _same(resumed, mixed[2:])
    single = reader.position(demo_dataset, "train", 8, seed=3, step=5)
    assert isinstance(single, reader.Position) and isinstance(single, reader.DatasetPosition)
    by_step = _arrays(reader.build_dataset(demo_dataset, "train", 8, 16, seed=3, start=5, dtype=tf.uint8), 2)
    by_json = _arrays(reader.build_dataset(demo_dataset, "train", 8, 16, start=single.to_json(), dtype=tf.uint8), 2)
    assert _same(by_step, by_json)
    with pytest.raises(ValueError, match="is a position of one dataset; a mixture resumes from its own position"):
        reader.build_dataset(plan, image_size=16, start=single)
    with pytest.raises(ValueError, match="is a position of a mixture; one dataset resumes from its own position"):
        reader.build_dataset(demo_dataset, "train", 8, 16, start=position)


def test_a_position_is_one_type_read_back_from_json_whichever_kind(plan, demo_dataset):
    single = reader.position(demo_dataset, "train", 8, seed=3, step=5)
    mixed = plan.position(5, 3)
    assert reader.Position.from_json(single.to_json()) == single
    assert reader.Position.from_json(mixed.to_json()) == mixed
    assert reader.Position(**json.loads(single.to_json())) == single  # as earlier releases built one
    assert (mixed.global_step, single.global_step) == (3, 5)
    with pytest.raises(ValueError, match="not a reader position"):
        reader.Position.from_json("{")
    with pytest.raises(ValueError, match=r"the mixture was planned for split 'train' and batch_size=12"):
        reader.position(plan, batch_size=8, seed=5, step=3)


@pytest.mark.slow
def test_distributed_dataset_reads_a_mixture_as_build_dataset_does(plan, mixed):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    distributed = reader.distributed_dataset(strategy, plan, image_size=16, seed=5, num_steps=3, dtype=tf.uint8,
                                             with_source=True)
    assert _same([tuple(np.asarray(part) for part in batch) for batch in distributed], mixed)


@pytest.mark.slow
def test_keys_label_offset_and_info_still_work_warning_with_the_new_call(demo_dataset):
    files = sorted(glob.glob(os.path.join(demo_dataset, "validation-*.tfrecord")))
    info = reader.foreign_dataset_info({"validation": files}, classes=["circle", "square", "triangle"])
    # 1-based labels read as 0-based: label 0 falls outside and is skipped, 1 and 2 become 0 and 1
    new = _arrays(reader.build_dataset(info, "validation", 4, 16, training=False, dtype=tf.uint8, skip_corrupt=True,
                                       foreign=reader.ForeignShards(keys=reader.FeatureKeys(), label_offset=-1)), 100)
    with pytest.warns(DeprecationWarning) as warned:
        old = reader.build_dataset("", "validation", 4, 16, training=False, dtype=tf.uint8, info=info,
                                   keys=reader.FeatureKeys(), label_offset=-1, skip_corrupt=True)
    said = " ".join(str(w.message) for w in warned)
    assert "foreign=reader.ForeignShards(keys=..., label_offset=...)" in said and "build_dataset(info, ...)" in said
    labels = np.concatenate([batch[1] for batch in new])
    assert len(labels) and set(labels.tolist()) <= {0, 1} and _same(new, _arrays(old, 100))
    from_config = reader.build_dataset(info, "validation", 4, 16, training=False, dtype=tf.uint8, skip_corrupt=True,
                                       foreign={"keys": {"image": "image/encoded"}, "label_offset": -1})
    assert _same(new, _arrays(from_config, 100))
    with pytest.raises(TypeError, match=r"moved into the tuning options: pass options=reader.ReadOptions\(cache="):
        reader.build_dataset(demo_dataset, cache="memory")


def test_one_dataset_says_which_source_each_example_is_and_refuses_num_steps(demo_dataset):
    images, labels, sources = next(iter(reader.build_dataset(demo_dataset, "validation", 4, 16, training=False,
                                                             with_source=True)))
    assert sources.dtype == tf.int32 and sources.numpy().tolist() == [0] * int(images.shape[0])
    with pytest.raises(ValueError, match=r"num_steps= sizes a run over a mixture.*num_epochs="):
        reader.build_dataset(demo_dataset, "train", 8, 16, num_steps=3)
