"""Mixtures on many hosts: each input pipeline reads only its canonical pipelines' share of every source.

The sources of tests/reader/mixtures/test_mixture.py ("a": 32 train records, "b": 20, "c": 8; weights 0.5 / 0.3 / 0.2 at
a global batch of 12), planned with the default C = gcd(12, 64) = 4 canonical pipelines: each source's streams
are dealt over them, and input pipeline h of H (H dividing 4) reads canonical pipelines h*4/H .. (h+1)*4/H - 1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import reader
from reader.mixtures import quotas
from reader.mixtures.pipeline import _mixed_records, _present, _source_records, _source_seeds
from reader.order import stream_segments
from tests.reader.mixtures.test_mixture import BATCH

STEPS = 60


@pytest.fixture(scope="module")
def sources(mixture_sources) -> list:
    return mixture_sources


@pytest.fixture(scope="module")
def plan(sources):
    made = reader.mixture(sources, "train", BATCH)
    assert made.canonical_pipelines == 4 and made.describe()["canonical_pipelines"] == 4
    return made


def _order(plan, steps: int, pipelines: int = 1, index: int = 0, start: int = 0, seed: int = 3) -> tuple:
    """Pipeline ``index`` of ``pipelines``: each slot's (record, key, source) for ``steps`` global batches."""
    splits = [_present(source) for source in plan.sources]
    per = plan.batch_size // pipelines
    records = _mixed_records(plan, splits, seed, lambda: tf.constant(start, tf.int64), start + steps,
                             (index * per, (index + 1) * per))
    parts = [list(zip(*records.batch(4096).as_numpy_iterator()))]
    record, key, source = (np.concatenate(column) for column in parts[0])
    return record.reshape(steps, -1), key.reshape(steps, -1), source.reshape(steps, -1)


@pytest.fixture(scope="module")
def whole(plan) -> tuple:
    """The one-pipeline order of the first STEPS global batches."""
    return _order(plan, STEPS)


@pytest.fixture(scope="module")
def sliced(plan):
    """``sliced(H)``: the orders of the H input pipelines over the first STEPS global batches, each built once for
    this module (a pipeline built per slice costs seconds; the tests below read the same slices)."""
    made: dict = {}

    def orders(pipelines: int) -> list:
        if pipelines not in made:
            made[pipelines] = [_order(plan, STEPS, pipelines, h) for h in range(pipelines)]
        return made[pipelines]
    return orders


@pytest.mark.parametrize("weights,batch", [((0.5, 0.3, 0.2), 64), ((1, 1, 1), 64), ((0.7, 0.2, 0.07, 0.03), 32),
                                           ((5, 3, 2, 1, 1, 1, 0.5), 96), ((0.999, 0.001), 8), ((1 / 3, 2 / 3), 12)])
def test_the_split_deals_every_batchs_exact_counts_over_the_canonical_pipelines(weights, batch):
    plan = quotas.plan_quotas(quotas.as_fractions(weights, [str(w) for w in weights]), batch)
    for canonical in [c for c in (1, 2, 3, 4, 8, 32, 64) if batch % c == 0]:
        split = quotas.split_quotas(plan, canonical)
        done = np.zeros((canonical, len(weights)), np.int64)
        for step in range(2000):
            assert (split.consumed(step) == done).all()  # O(1), equal to the running sum
            counts, total = split.step_counts(step), plan.counts(step)
            assert (counts.sum(axis=0) == total).all()  # the batch's exact quotas, unchanged
            assert (counts.sum(axis=1) == batch // canonical).all()  # every canonical slice full
            assert (counts >= total // canonical).all() and (counts <= -(-total // canonical)).all()
            done += counts
            # each canonical pipeline keeps near its share of every source's records (so they go through their
            # parts of its epochs together)
            assert (np.abs(done - plan.consumed(step + 1) / canonical) < 8).all(), (canonical, step)
        if canonical == 1:
            assert (split.counts[:, 0] == plan.step_table()[np.arange(split.period) % plan.period]).all()


def _canonical_records(plan, k: int, canonical: int, seed: int, epoch: int) -> set:
    """The record ids (within the split) of source k that canonical pipeline ``canonical``'s streams hold in
    ``epoch``: from the order's own segments, nothing read."""
    source, split = plan.sources[k], plan.sources[k].split
    layout = source.layout
    each = layout.streams // plan.canonical_pipelines
    sizes = tf.constant([shard.num_examples for shard in split.shards], tf.int64)
    bases = np.cumsum([0] + [shard.num_examples for shard in split.shards])
    held = set()
    for stream in range(canonical * each, (canonical + 1) * each):
        shard, first, count = stream_segments(sizes, tf.constant(layout.stream_length, tf.int64),
                                              tf.constant(seed, tf.int64), tf.constant(epoch, tf.int64),
                                              tf.constant(stream, tf.int64), tf.constant(0, tf.int64))
        for s, f, n in zip(shard.numpy(), first.numpy(), count.numpy()):
            held.update(range(bases[s] + f, bases[s] + f + n))
    return held


@pytest.mark.parametrize("pipelines", [2, 4])
@pytest.mark.slow
def test_each_pipeline_reads_only_its_canonical_pipelines_records(plan, whole, sliced, pipelines):
    seeds = _source_seeds(3, len(plan.sources))
    mine = plan.canonical_pipelines // pipelines
    read = []
    for index, (records, keys, which) in enumerate(sliced(pipelines)):
        assert keys.shape == (STEPS, BATCH // pipelines)  # it yields its slots and nothing else
        read.append(sum(len(r) for r in records.ravel()))
        for k, source in enumerate(plan.sources):
            count = source.split.num_examples
            got = keys[which == k]
            for epoch in sorted(set(got // count)):
                allowed = set().union(*(_canonical_records(plan, k, c, seeds[k], epoch)
                                        for c in range(index * mine, (index + 1) * mine)))
                assert set(got[got // count == epoch] % count) <= allowed, (index, source.name, epoch)
    total = sum(len(r) for r in whole[0].ravel())
    assert sum(read) == total  # the pipelines' bytes together are one pipeline's, each its 1/H share
    assert all(abs(one - total / pipelines) < 0.1 * total / pipelines for one in read), (read, total)


@pytest.mark.slow  # a pipeline built per slice (2 and 4 shared with the test above): 3 s of CPU at 3
@pytest.mark.parametrize("pipelines", [2, 3, 4])
def test_the_pipelines_batches_together_are_one_pipelines_and_each_slice_holds_its_split(plan, whole, sliced,
                                                                                        pipelines):
    # 2 and 4 divide C = 4: each reads its canonical pipelines; 3 does not: each reads those its slots fall in and
    # keeps its slots. Either way the union of the pipelines' batches is the one-pipeline global batch.
    # (test_mixture.py's slices test, 40 steps of keys and sources at 2 and 4, was this one by the same route.)
    parts = sliced(pipelines)
    for column in range(3):
        assert (np.concatenate([p[column] for p in parts], axis=1) == whole[column]).all()
    size = BATCH // plan.canonical_pipelines
    for step in range(STEPS):
        counts = plan.canonical_split.step_counts(step)
        for c in range(plan.canonical_pipelines):
            assert (np.bincount(whole[2][step, c * size:(c + 1) * size], minlength=3) == counts[c]).all()


@pytest.mark.slow
def test_resuming_on_another_pipeline_count_gives_the_same_global_batches(plan, whole):
    wrap = plan.steps_for(1, "c")
    for step, pipelines in ((wrap, 2), (wrap + 1, 4), (37, 1)):
        position = reader.MixturePosition.from_json(plan.position(3, step).to_json())
        assert position.canonical == 4
        parts = [_order(plan, STEPS - step, pipelines, h, start=position.step) for h in range(pipelines)]
        assert (np.concatenate([p[1] for p in parts], axis=1) == whole[1][step:]).all(), (step, pipelines)


@pytest.mark.slow
def test_one_canonical_pipeline_is_the_order_mixtures_had_before(sources):
    # C = 1: batch t is counts(t)[0] records of source 0's one sequence (all its streams round-robin), then
    # source 1's, ...: positions saved before canonical pipelines resume on it.
    plan = reader.mixture(sources, "train", BATCH, canonical_pipelines=1)
    steps = 30
    _, keys, _ = _order(plan, steps)
    splits = [_present(source) for source in plan.sources]
    used = plan.consumed(steps)
    sequences = _source_records(plan, splits, _source_seeds(3, 3), tf.zeros([3], tf.int64))
    keyed = [np.array([key for _, key in sequence.take(int(n)).as_numpy_iterator()]) for sequence, n in
             zip(sequences, used)]
    expected = [np.concatenate([keyed[k][plan.consumed(t)[k]:plan.consumed(t + 1)[k]] for k in range(3)])
                for t in range(steps)]
    assert (keys == np.stack(expected)).all()


def test_a_position_keeps_the_canonical_pipelines_and_one_saved_before_them_resumes_on_one(sources, plan):
    position = plan.position(5, 3)
    assert reader.MixturePosition.from_json(position.to_json()) == position and position.canonical == 4
    older = json.loads(position.to_json())
    del older["canonical"]
    one = reader.mixture(sources, "train", BATCH, canonical_pipelines=1)
    older["sources"] = [list(s) for s in one.position(5, 3).sources]  # as the release before wrote it
    saved = reader.MixturePosition.from_json(json.dumps(older))
    assert saved.canonical == 1 and one.mismatch(saved, 5) == ""
    with pytest.raises(ValueError, match=r"canonical_pipelines=1 and this mixture has 4: plan it with "
                                         r"reader.mixture\(..., canonical_pipelines=1\)"):
        reader.build_mixture(plan, "train", BATCH, 16, start=saved)


def test_canonical_pipelines_that_cannot_split_the_batch_or_a_source_are_refused(sources):
    with pytest.raises(ValueError, match=r"canonical_pipelines=5 must be a positive integer dividing the global "
                                         r"batch size 12"):
        reader.mixture(sources, "train", BATCH, canonical_pipelines=5)
    with pytest.raises(ValueError, match=r"source 'c' has 8 records in this split, fewer than the 12 canonical"):
        reader.mixture(sources, "train", BATCH, canonical_pipelines=12)
    assert reader.mixture(sources, "train", 24).canonical_pipelines == 8  # gcd(24, 64), and c holds 8
    # 64, halved down to 8 while c would give each fewer than 512 records (as a single dataset's streams)
    assert reader.mixture(sources, "train", 64).canonical_pipelines == 8
    # repeat factors follow the same rule: each epoch's copies are dealt over the canonical pipelines
    assert reader.mixture(sources, "train", BATCH, repeat_factor=reader.RepeatFactor(0.5)).canonical_pipelines == 4


@pytest.fixture(scope="module")
def repeated(sources):
    """The sources with repeat factors (t = 0.9: every image r = sqrt(0.9 / 0.5) = 1.34, one or two copies an
    epoch), C = 4: each epoch's E copies (a multiple of 4) cut into 4 runs of E / 4, one a canonical pipeline."""
    made = reader.mixture(sources, "train", BATCH, repeat_factor=reader.RepeatFactor(0.9))
    assert made.canonical_pipelines == 4 and all(s.factors.epoch_records % 4 == 0 for s in made.sources)
    return made


@pytest.mark.slow
def test_repeat_factor_sources_are_dealt_so_each_pipeline_reads_its_share(repeated):
    pipelines = 4
    whole = _order(repeated, STEPS)
    parts = [_order(repeated, STEPS, pipelines, h) for h in range(pipelines)]
    for column in range(3):  # the pipelines' batches together are the one pipeline's global batches
        assert (np.concatenate([p[column] for p in parts], axis=1) == whole[column]).all()
    for k, source in enumerate(repeated.sources):
        records, epoch = source.split.num_examples, source.factors.epoch_records
        first = (whole[1] < epoch) & (whole[2] == k)  # every part's first epoch is within the STEPS read
        assert sorted(whole[1][first]) == list(range(epoch))  # E copies, each key once
        assert len(set(whole[0][first])) == records  # every image at least once (r >= 1)
        held = [set(p[0][(p[1] < epoch) & (p[2] == k)]) for p in parts]
        # each pipeline reads its parts' records: 1/H of the source and at most a record a cut more
        assert all(len(mine) <= -(-records // pipelines) + repeated.canonical_pipelines // pipelines
                   for mine in held), (source.name, [len(mine) for mine in held])
        assert sum(len(mine) for mine in held) <= records + repeated.canonical_pipelines - 1
    # resumed mid-epoch on another pipeline count: the same global batches (positions are O(1))
    resumed = [_order(repeated, STEPS - 17, 2, h, start=17) for h in range(2)]
    assert (np.concatenate([p[1] for p in resumed], axis=1) == whole[1][17:]).all()
