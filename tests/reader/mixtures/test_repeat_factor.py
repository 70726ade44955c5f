"""Repeat-factor sampling: rare-class images come back as LVIS's formula says, every epoch the same length,
the order a pure function of (seed, step).

A skewed dataset: 40 images of "common", 4 of "rare" (f = 40/44 and 4/44). At t = 0.5, r(rare) =
sqrt(0.5 / (4/44)) = 2.345 and r(common) = 1: an epoch of ceil(40 + 4 * 2.345) = 50 records.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import tensorflow as tf

import reader
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from converter.demo import draw_shape
from reader.mixtures.pipeline import _mixed_records, _present

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
THRESHOLD = 0.5


@pytest.fixture(scope="module")
def skewed(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("skewed")
    rng = np.random.default_rng(4)
    for name, shape, count in (("common", "circle", 40), ("rare", "square", 4)):
        os.makedirs(root / "src" / name)
        for index in range(count):
            draw_shape(rng, shape, 32, 32).save(root / "src" / name / f"{index:03d}.jpg", quality=90)
    out = str(root / "out")
    run(ConvertOptions(src=str(root / "src"), out=out, shards=3, seed=1), FAST, show_progress=False)
    return out


def _order(plan, start: int, steps: int) -> list:
    splits = [_present(source) for source in plan.sources]
    records = _mixed_records(plan, splits, 9, lambda: tf.constant(start, tf.int64), start + steps,
                             (0, plan.batch_size))
    order = []
    for batch, keys, _ in records.batch(1000).as_numpy_iterator():  # batched: one record at a time costs seconds
        order += zip(batch.tolist(), keys.tolist())
    return order


@pytest.mark.slow
def test_factors_epochs_and_frequencies_follow_the_formula(skewed):
    plan = reader.mixture([(skewed, 1)], "train", 10, repeat_factor=reader.RepeatFactor(THRESHOLD))
    factors = plan.sources[0].factors
    rare = math.sqrt(THRESHOLD / (4 / 44))
    assert factors.report["rare"]["factor"] == pytest.approx(rare) and factors.report["common"]["factor"] == 1
    assert factors.epoch_records == math.ceil(40 + 4 * rare) == 50
    assert factors.report["rare"]["before"] == pytest.approx(4 / 44)
    assert factors.report["rare"]["after"] == pytest.approx(4 * rare / (40 + 4 * rare))
    labels = {}
    for raw in tf.data.TFRecordDataset(reader.dataset_info(skewed).split("train").files):
        example = tf.train.Example.FromString(raw.numpy())
        labels[raw.numpy()] = example.features.feature["image/class/label"].int64_list.value[0]
    epochs = 20
    sequence = _order(plan, 0, epochs * 5)  # 5 steps of 10: one epoch of 50
    scaled = {0: 1 * 50 / (40 + 4 * rare), 1: rare * 50 / (40 + 4 * rare)}
    rare_share = []
    for epoch in range(epochs):
        chunk = sequence[epoch * 50:(epoch + 1) * 50]
        assert all(key // 50 == epoch for _, key in chunk) and len({key for _, key in chunk}) == 50
        copies = {}
        for record, _ in chunk:
            copies[record] = copies.get(record, 0) + 1
        assert len(copies) == 44  # every image at least once an epoch (r >= 1)
        for record, count in copies.items():  # stochastic rounding: the floor or the ceiling of its factor
            assert math.floor(scaled[labels[record]]) <= count <= math.ceil(scaled[labels[record]])
        rare_share.append(sum(count for record, count in copies.items() if labels[record] == 1) / 50)
    assert np.mean(rare_share) == pytest.approx(factors.report["rare"]["after"], abs=0.02)


@pytest.mark.parametrize("canonical", [1, 2])
@pytest.mark.slow
def test_the_order_with_repeats_resumes_at_any_step_and_across_an_epoch(skewed, canonical):
    # C = 2 (the default at a batch of 10): each epoch's 50 copies cut into two runs of 25, one a canonical
    # pipeline, each with its own epochs
    plan = reader.mixture([(skewed, 1)], "train", 10, repeat_factor=reader.RepeatFactor(THRESHOLD),
                          canonical_pipelines=canonical)
    assert plan.describe()["canonical_pipelines"] == canonical
    full = _order(plan, 0, 12)
    for step in (4, 5, 6):  # an epoch is 5 steps: before, at and after its end
        assert _order(plan, step, 12 - step) == full[step * 10:], step


@pytest.mark.slow
def test_decoded_batches_with_repeats_resume_element_for_element(skewed):
    plan = reader.mixture([(skewed, 1)], "train", 10, repeat_factor=reader.RepeatFactor(THRESHOLD))
    batches = reader.build_mixture(plan, "train", 10, 16, seed=2, num_steps=12, dtype=tf.uint8)
    resumed = reader.build_mixture(plan, "train", 10, 16, start=plan.position(2, 7), num_steps=12, dtype=tf.uint8)
    expected = [images.numpy() for images, _ in batches][7:]
    assert all(np.array_equal(a, images.numpy()) for a, (images, _) in zip(expected, resumed))
    assert len(expected) == 5


def test_factors_come_from_the_records_table_and_equal_those_read_from_the_shards(skewed, tmp_path):
    """The table's class ids (N small integers) give the factors the shards' labels give; a dataset converted
    before records tables still gets them, from its shards."""
    import json
    import shutil

    from reader.mixtures.repeat_factor import image_classes, repeat_factors

    info = reader.dataset_info(skewed)
    assert info.split("train").records_table is not None
    old = shutil.copytree(skewed, tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    for split in manifest["splits"].values():
        (old / split.pop("records_table")["file"]).unlink()
    (old / "manifest.json").write_text(json.dumps(manifest))
    old_info = reader.dataset_info(str(old))
    assert old_info.split("train").records_table is None
    from_table = image_classes(info, info.split("train"))
    from_shards = image_classes(old_info, old_info.split("train"))
    assert np.array_equal(from_table.values, from_shards.values)
    assert np.array_equal(from_table.starts, from_shards.starts)
    table_factors = repeat_factors(from_table, info.classes, THRESHOLD)
    assert np.array_equal(table_factors.factors, repeat_factors(from_shards, info.classes, THRESHOLD).factors)
    # one array a record, as before: the same factors and report
    per_record = [from_table.values[a:b] for a, b in zip(from_table.starts[:-1], from_table.starts[1:])]
    again = repeat_factors(per_record, info.classes, THRESHOLD)
    assert np.array_equal(again.factors, table_factors.factors) and again.report == table_factors.report


def test_an_objects_rarest_class_sets_its_factor_and_repeated_ids_count_once():
    from reader.mixtures.repeat_factor import ClassIds, repeat_factors

    # 4 images: [1, 1, 2], [1], [], [1, 3]; f(1) = 3/4, f(2) = 1/4, f(3) = 1/4
    classes = ClassIds(np.array([1, 1, 2, 1, 1, 3]), np.array([0, 3, 4, 4, 6]))
    factors = repeat_factors(classes, ["", "a", "b", "c"], 0.5)
    assert factors.report["a"]["images"] == 3 and factors.report["b"]["images"] == 1
    rare = math.sqrt(0.5 / 0.25)
    assert factors.factors.tolist() == pytest.approx([rare, 1.0, 1.0, rare])
    assert factors.epoch_records == math.ceil(2 + 2 * rare)


def test_the_factors_reach_the_graph_from_a_file_never_as_constants(skewed):
    plan = reader.mixture([(skewed, 1)], "train", 10, repeat_factor=reader.RepeatFactor(THRESHOLD))
    factors = plan.sources[0].factors
    path = factors.path
    assert np.array_equal(np.fromfile(path, "<f8"), factors.factors)
    splits = [_present(source) for source in plan.sources]
    records = _mixed_records(plan, splits, 9, lambda: tf.constant(0, tf.int64), 10, (0, plan.batch_size))
    graph = tf.compat.v1.GraphDef.FromString(records._as_serialized_graph().numpy())
    nodes = list(graph.node) + [node for function in graph.library.function for node in function.node_def]
    doubles = [node.name for node in nodes if node.op == "Const"
               and node.attr["value"].tensor.dtype == tf.float64.as_datatype_enum
               and sum(d.size for d in node.attr["value"].tensor.tensor_shape.dim) >= len(factors.factors)]
    assert not doubles
    assert path.encode() in graph.SerializeToString()


def test_an_epochs_copies_are_cut_into_equal_parts_that_together_hold_every_records_count():
    """part_copies: E / C copies a part, consecutive runs of the reading order (a record straddling a cut shared by
    two parts), every record's copies over the parts its count; shards of 0 records and records of 0 copies (read
    by no part when between two) too."""
    from reader.mixtures.repeat_factor import part_copies

    rng = np.random.default_rng(1)
    for _ in range(25):
        sizes = rng.integers(0, 6, int(rng.integers(1, 7)))
        sizes[0] += 1
        counts, parts = rng.integers(0, 4, int(sizes.sum())), int(rng.integers(1, 5))
        counts[-1] += parts + (-(counts.sum() + parts)) % parts  # E a multiple of C, at least C
        order = rng.permutation(len(sizes))
        bases = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        ids = np.concatenate([np.arange(bases[s], bases[s] + sizes[s]) for s in order])  # record ids as read
        held, previous_end = np.zeros(len(counts), np.int64), 0
        for part in range(parts):
            first, end, mine = (t.numpy() for t in part_copies(*(tf.constant(v, tf.int64) for v in (
                counts, sizes, order, parts, part))))
            assert mine.sum() == counts.sum() // parts and len(mine) == end - first
            # consecutive: at most a straddling record shared, nothing skipped but records of no copies
            assert first >= previous_end - 1 and not counts[ids[previous_end:first]].any()
            held[ids[first:end]] += mine
            previous_end = end
        assert previous_end == len(counts) and (held == counts).all()
