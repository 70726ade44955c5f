"""The training order is a pure function of (dataset, seed, epoch): the same batches at any pipeline count, and from
any step.

``demo_dataset``'s train split: 72 records in 4 shards of 18, each with its
record index. At a global batch of 8 there are 8 streams (one record of each
per batch) of 9 records per epoch; with windows of 4 records the streams cut
shards (records 9, 27, 45, 63 of the epoch's sequence) and windows (stream
positions 4 and 8), so starting at steps 3..5, 8..10 and 17 crosses every
kind of boundary: window, shard and epoch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

import reader
from reader import order
from reader.records import read_segment

BATCH = 8
WINDOWED = {"window": 4}


def _pipeline(data, pipelines=1, index=0, **kwargs):
    context = None if pipelines == 1 else tf.distribute.InputContext(pipelines, index, pipelines)
    kwargs.setdefault("seed", 3)
    return reader.build_dataset(data, batch_size=BATCH, image_size=16, input_context=context, **kwargs)


def _global_batches(data, steps, pipelines=1, **kwargs) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first ``steps`` global batches: each pipeline's batch t, concatenated in pipeline order."""
    parts = [[(i.numpy(), l.numpy()) for i, l in _pipeline(data, pipelines, h, **kwargs).take(steps)]
             for h in range(pipelines)]
    return [(np.concatenate([p[t][0] for p in parts]), np.concatenate([p[t][1] for p in parts]))
            for t in range(steps)]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def uninterrupted(demo_dataset):
    """Three epochs (27 steps) of the one-pipeline run, windows of 4."""
    return _global_batches(demo_dataset, 27, options=WINDOWED)


@pytest.mark.parametrize("pipelines", [2, *(pytest.param(n, marks=pytest.mark.slow) for n in (4, 8))])  # 6-20 s
def test_the_global_batches_are_the_same_at_any_pipeline_count(demo_dataset, uninterrupted, pipelines):
    assert _same(_global_batches(demo_dataset, 27, pipelines, options=WINDOWED), uninterrupted)


@pytest.mark.parametrize(("step", "pipelines"), [(1, 1), (3, 2), (8, 1), *(
    pytest.param(step, pipelines, marks=pytest.mark.slow) for step, pipelines in ((9, 2), (4, 4), (5, 8), (10, 4),
                                                                                  (17, 8)))])
@pytest.mark.slow
def test_a_run_started_at_a_step_yields_the_uninterrupted_batches_from_there(demo_dataset, uninterrupted, step,
                                                                            pipelines):
    resumed = _global_batches(demo_dataset, 3, pipelines, options=WINDOWED, start=step)
    assert _same(resumed, uninterrupted[step:step + 3])


@pytest.mark.slow
def test_a_position_is_a_few_bytes_of_json_that_resumes_with_its_own_seed(demo_dataset, uninterrupted):
    position = reader.position(demo_dataset, "train", BATCH, seed=3, step=13, options=WINDOWED)
    text = position.to_json()
    assert len(text.encode()) < 1024
    assert (position.epoch, position.step, position.streams, position.window) == (1, 4, 8, 4)
    restored = reader.Position.from_json(text)
    assert restored == position
    resumed = _global_batches(demo_dataset, 3, 2, seed=None, options=WINDOWED, start=restored)
    assert _same(resumed, uninterrupted[13:16])


@pytest.mark.slow
def test_every_epoch_is_a_permutation_in_a_new_order(demo_dataset):
    info = reader.dataset_info(demo_dataset).split("train")
    layout = order.stream_layout(info.num_examples, BATCH, window=4)
    epochs = []
    for epoch in range(3):
        records = order.host_records(info.files, [s.num_examples for s in info.shards],
                                     [s.index_path for s in info.shards], layout, 3,
                                     tf.constant(epoch * layout.steps_per_epoch, tf.int64), epoch + 1, 1, 0,
                                     _plain_segment)
        epochs.append([int(key) - epoch * info.num_examples for _, key in records.as_numpy_iterator()])
    assert all(sorted(ids) == list(range(72)) for ids in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def _plain_segment(path, index_path, first, count):
    return tf.data.TFRecordDataset(path).skip(first).take(count)


@pytest.mark.slow
def test_a_dataset_without_record_indexes_resumes_by_reading_through(demo_dataset, uninterrupted, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(demo_dataset, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            os.remove(old / shard.pop("dali_index"))
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert _same(_global_batches(str(old), 3, 2, options=WINDOWED, start=10), uninterrupted[10:13])


def _copy_with_manifest(demo_dataset, folder, change) -> str:
    shutil.copytree(demo_dataset, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(folder)


def test_the_version_is_the_content_not_when_where_or_how_it_was_converted(demo_dataset, tmp_path):
    def elsewhere(manifest):
        manifest["created"] = "2031-01-01T00:00:00+00:00"
        manifest["written_by"] = {"runner": "DaskRunner", "apache_beam": "9.9"}
        manifest["options"]["src"] = "/somewhere/else"
        manifest["source_archives"] = {"imgs.tar": {"size": 1, "mtime": 2}}
    other = _copy_with_manifest(demo_dataset, tmp_path / "other", elsewhere)
    assert reader.dataset_info(other).fingerprint == reader.dataset_info(demo_dataset).fingerprint
    position = reader.position(demo_dataset, "train", BATCH, seed=3, step=5)
    _pipeline(other, start=position)  # resumes: the same data under another folder and conversion time


def test_a_position_saved_on_another_version_of_the_dataset_is_refused_naming_both(demo_dataset, tmp_path):
    position = reader.position(demo_dataset, "train", BATCH, seed=3, step=5)

    def one_byte_changed(manifest):
        manifest["splits"]["train"]["shards"][0]["sha256"] = "0" * 64
    other = _copy_with_manifest(demo_dataset, tmp_path / "other", one_byte_changed)
    new = reader.dataset_info(other).fingerprint
    assert new != position.fingerprint
    with pytest.raises(ValueError, match=re.escape(f"saved on {demo_dataset} (version {position.fingerprint}) and "
                                                   f"{other} is version {new}")):
        _pipeline(other, start=position)
    with pytest.raises(ValueError, match="saved with seed=3 and this pipeline has seed=4"):
        _pipeline(demo_dataset, seed=4, start=position)


def test_a_position_saved_under_the_manifest_wide_version_still_resumes(demo_dataset):
    """Positions saved before the version was the content (it hashed the whole manifest) keep working."""
    info = reader.dataset_info(demo_dataset)
    position = reader.position(demo_dataset, "train", BATCH, seed=3, step=5)
    old = dataclasses.replace(position, fingerprint=info.legacy_fingerprint)
    assert old.fingerprint != position.fingerprint
    _pipeline(demo_dataset, start=old)


def test_misuse_is_named(demo_dataset):
    with pytest.raises(ValueError, match="start= needs the run's seed"):
        _pipeline(demo_dataset, seed=None, start=3)
    with pytest.raises(TypeError, match=r"options=reader.ReadOptions\(cache='memory'\)"):
        _pipeline(demo_dataset, cache="memory")
    with pytest.raises(ValueError, match="start= resumes the training order"):
        _pipeline(demo_dataset, start=3, options={"order": "buffer"})
    with pytest.raises(ValueError, match=r"3 input pipelines cannot share 4 streams.*ReadOptions\(streams=12\)"):
        context = tf.distribute.InputContext(3, 0, 3)
        reader.build_dataset(demo_dataset, batch_size=12, image_size=16, seed=1, input_context=context)


@pytest.mark.slow
def test_streams_seek_with_the_record_index(demo_dataset):
    """A segment is read from the byte its index names: given another shard's index, it lands mid-record."""
    shards = reader.dataset_info(demo_dataset).split("train").shards
    other = next(s for s in shards[1:] if open(s.index_path).read() != open(shards[0].index_path).read())

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"train-00000-of-00004.tfrecord.{0,3} is corrupt or "
                                                             r"truncated: read \d+ of the \d+ records from record"):
        list(tf.data.Dataset.from_tensors(0).flat_map(lambda _: read_segment(
            tf.constant(shards[0].path), tf.constant(other.index_path), tf.constant(9, tf.int64),
            tf.constant(9, tf.int64))))


def test_a_plain_tf_variable_holding_the_step_starts_there_read_when_iteration_begins(demo_dataset, uninterrupted):
    # tf.Variable.value is a method (a Keras variable's .value is the tf.Variable it holds): both are variables.
    step = tf.Variable(0, dtype=tf.int64)
    dataset = _pipeline(demo_dataset, options=WINDOWED, start=step)
    step.assign(4)  # read when iteration begins, not when the pipeline is built
    assert _same([(i.numpy(), l.numpy()) for i, l in dataset.take(3)], uninterrupted[4:7])
