"""Mixtures: exact quotas in every batch, each source its own epochs, one label space, exact resume, any pipeline count.

Three small classification datasets, converted in-process: "a" (circle, square; 32 train records),
"b" (square, triangle; 20) and "c" (circle, star; 8, so it wraps every few steps). Weights 0.5 / 0.3 / 0.2 at a
global batch of 12: shares 6, 3.6 and 2.4, a schedule of period 5. Objects: a COCO-style set (person, car,
motorcycle: ids 1, 3, 4) and a VOC-style one (Pascal ids: motorbike 14, person 15).
"""

from __future__ import annotations

import os
import random
from decimal import Decimal

import numpy as np
import pytest
import tensorflow as tf

import reader
from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import label_map as converter_label_map
from beam_jobs.pipeline import run
from reader.mixtures import quotas
from reader.mixtures.pipeline import _mixed_records
from tests.object_data import jpeg, picture, voc_xml, write_coco, write_file
from tests.reader.conftest import MIXTURE_WEIGHTS

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
BATCH = 12
WEIGHTS = MIXTURE_WEIGHTS


@pytest.fixture(scope="module")
def sources(mixture_sources) -> list:
    """The three sources (tests/reader/conftest.py: made once for this module and test_mixture_hosts.py)."""
    return mixture_sources


@pytest.fixture(scope="module")
def plan(sources):
    return reader.mixture(sources, "train", BATCH)


@pytest.mark.parametrize("weights,batch", [((0.5, 0.3, 0.2), 64), ((1, 1, 1), 64), ((0.7, 0.2, 0.07, 0.03), 32),
                                           ((5, 3, 2, 1, 1, 1, 0.5), 96), ((0.999, 0.001), 8), ((1 / 3, 2 / 3), 7)])
def test_every_batch_holds_each_sources_share_and_the_totals_never_drift_a_whole_example(weights, batch):
    plan = quotas.plan_quotas(quotas.as_fractions(weights, [str(w) for w in weights]), batch)
    shares = np.array([float(s) for s in plan.shares])
    table = np.stack([plan.counts(step) for step in range(5000)])
    assert (table.sum(axis=1) == batch).all()
    assert (table >= np.floor(shares)).all() and (table <= np.ceil(shares)).all()
    totals = np.cumsum(table, axis=0)
    assert (np.abs(totals - np.arange(1, 5001)[:, None] * shares) < 1).all()
    assert all((plan.consumed(step) == (totals[step - 1] if step else 0)).all() for step in (0, 1, 7, 4096, 5000))


def _keys_and_sources(plan, steps: int, slots=(0, BATCH), start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The order alone, nothing decoded: each slot's (key, source) for ``steps`` global batches."""
    from reader.mixtures.pipeline import _present

    splits = [_present(source) for source in plan.sources]
    records = _mixed_records(plan, splits, 3, lambda: tf.constant(start, tf.int64), start + steps, slots)
    keys, which = [], []
    for _, key, source in records.batch(4096).as_numpy_iterator():
        keys.append(key)
        which.append(source)
    return np.concatenate(keys).reshape(steps, -1), np.concatenate(which).reshape(steps, -1)


@pytest.fixture(scope="module")
def order(plan) -> tuple[np.ndarray, np.ndarray]:
    """The global order of the first 300 steps, built once (each pipeline built costs seconds, not its steps)."""
    return _keys_and_sources(plan, 300)


@pytest.fixture(scope="module")
def plan_one(sources):
    """The mixture of one canonical pipeline: the order mixtures had before canonical pipelines."""
    return reader.mixture(sources, "train", BATCH, canonical_pipelines=1)


@pytest.fixture(scope="module")
def order_one(plan_one) -> tuple[np.ndarray, np.ndarray]:
    return _keys_and_sources(plan_one, 300)


@pytest.mark.parametrize("canonical", [1, 4])
@pytest.mark.slow
def test_the_order_gives_each_batch_its_quota_and_each_source_whole_epochs_in_a_new_order(request, canonical):
    # With C canonical pipelines, canonical pipeline c (slots c*G/C .. (c+1)*G/C - 1 of every batch) runs through
    # its own part of each source's epochs: the checks of one sequence, made on each part, and the parts of a
    # pass together are the whole pass.
    plan = request.getfixturevalue("plan" if canonical > 1 else "plan_one")
    keys, which = request.getfixturevalue("order" if canonical > 1 else "order_one")
    assert plan.canonical_pipelines == canonical
    steps = 300
    for step in range(steps):
        assert (np.bincount(which[step], minlength=3) == plan.counts(step)).all()
    size = BATCH // canonical
    for k, source in enumerate(plan.sources):
        records = source.split.num_examples
        per_pass = source.epoch_records // canonical
        parts = []
        for c in range(canonical):
            sequence = keys[:, c * size:(c + 1) * size][which[:, c * size:(c + 1) * size] == k]
            epochs, ids = sequence // records, sequence % records
            whole = len(sequence) // per_pass
            assert whole >= 3
            orders = []
            for epoch in range(whole):
                chunk = slice(epoch * per_pass, (epoch + 1) * per_pass)
                assert (epochs[chunk] == epoch).all()  # each source runs through its own epochs, one after the other
                assert len(set(ids[chunk])) == per_pass  # every record of the pass once
                orders.append(tuple(ids[chunk]))
            parts.append(orders)
        passes = [tuple(part[epoch] for part in parts) for epoch in range(min(len(part) for part in parts))]
        for one in passes:  # the parts of a pass: the whole pass
            assert len(set().union(*one)) == source.epoch_records
        repeated = sum(one == following for one, following in zip(passes, passes[1:]))
        if per_pass // (source.layout.streams // canonical) > 2:
            assert repeated == 0  # each pass in a new order
        else:  # c at C = 4: streams of 2 records in 2 shards, 32 orders a pass; by chance, one pair in 32 repeats
            assert repeated <= len(passes) // 16, (source.name, repeated, len(passes))


def _pairs(dataset: tf.data.Dataset, count: int) -> list:
    records, keys = next(iter(dataset.take(count).batch(count)))
    return list(zip(records.numpy().tolist(), keys.numpy().tolist()))


@pytest.mark.parametrize("repeat", [None, reader.RepeatFactor(0.5)], ids=["streams", "repeat-factors"])
@pytest.mark.slow
def test_sources_built_at_one_site_each_read_the_order_they_read_built_alone(sources, repeat):
    # The sources' orders are built by one map over their inputs packed as tensors (start-up: issue #50); each
    # must be its own inputs' order, from its own place, as a separate build gives it.
    from reader.mixtures.pipeline import _present, _source_records
    from reader.order import host_records
    from reader.records import SegmentReader
    from reader.mixtures.repeat_factor import repeated_records

    mixed = reader.mixture(sources, "train", BATCH, repeat_factor=repeat)
    splits = [_present(source) for source in mixed.sources]
    seeds, consumed = [11, 12, 13], [5, 0, 7]
    together = _source_records(mixed, splits, seeds, tf.constant(consumed, tf.int64))
    for k, (source, split) in enumerate(zip(mixed.sources, splits)):
        files, counts = split.files, [shard.num_examples for shard in split.shards]
        indexes = [shard.index_path for shard in split.shards]
        if repeat is None:
            layout = source.layout
            alone = host_records(files, counts, indexes, layout, seeds[k], tf.constant(consumed[k] // layout.batch_size),
                                 None, 1, 0, SegmentReader()).skip(consumed[k] % layout.batch_size)
        else:
            alone = repeated_records(files, counts, indexes, source.factors.factors, source.factors.epoch_records,
                                     source.layout.window, seeds[k], tf.constant(consumed[k]), SegmentReader())
        count = 2 * split.num_examples + 3  # past a wrap-around
        assert _pairs(together[k], count) == _pairs(alone, count), source.name


def _batches(plan, steps, pipelines=1, index=0, **kwargs):
    context = None if pipelines == 1 else tf.distribute.InputContext(pipelines, index, pipelines)
    dataset = reader.build_mixture(plan, "train", BATCH, 16, seed=5, dtype=tf.uint8, input_context=context,
                                   with_source=True, **kwargs)
    return [tuple(part.numpy() for part in batch) for batch in dataset.take(steps)]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(all(np.array_equal(x, y) for x, y in zip(one, other)) for one, other in zip(a, b))


@pytest.fixture(scope="module")
def uninterrupted(plan):
    return _batches(plan, 16)


@pytest.mark.slow  # 5 decoded pipelines built: 20 s and more on 2 busy cores
def test_resuming_before_at_and_after_a_small_sources_wrap_gives_the_same_batches(plan, uninterrupted):
    wrap = plan.steps_for(1, "c")  # c's second pass starts inside this step
    assert 0 < wrap < 14
    # At the wrap itself too, from a saved JSON position (the Keras fit below restarts there from an int step).
    for step in sorted({wrap - 1, wrap, wrap + 1, random.Random(0).randrange(1, 15)}):
        position = reader.MixturePosition.from_json(plan.position(5, step).to_json())
        resumed = [tuple(part.numpy() for part in batch) for batch in reader.build_mixture(
            plan, "train", BATCH, 16, dtype=tf.uint8, start=position, with_source=True).take(16 - step)]
        assert _same(resumed, uninterrupted[step:]), step
    for images, labels, _ in uninterrupted:  # and the batches hold their quotas
        assert images.shape == (BATCH, 16, 16, 3) and labels.shape == (BATCH,)
    assert all((np.bincount(b[2], minlength=3) == plan.counts(t)).all() for t, b in enumerate(uninterrupted))


@pytest.mark.slow
@pytest.mark.parametrize("pipelines", [4])  # the slices' order at 2, 3 and 4 pipelines: test_mixture_hosts.py
def test_decoded_batches_of_several_pipelines_concatenate_to_the_global_batch(plan, uninterrupted, pipelines):
    parts = [_batches(plan, 8, pipelines, h) for h in range(pipelines)]
    joined = [tuple(np.concatenate([p[t][i] for p in parts]) for i in range(3)) for t in range(8)]
    assert _same(joined, uninterrupted[:8])


def test_a_position_of_another_mixture_is_refused_naming_the_difference(sources, plan):
    position = plan.position(5, 3)
    other = reader.mixture([(sources[0][0], 0.6), (sources[1][0], 0.2), sources[2]], "train", BATCH)
    with pytest.raises(ValueError, match=r"source 'a' had weight 1/2 and this mixture gives it 3/5"):
        reader.build_mixture(other, "train", BATCH, 16, start=position)
    with pytest.raises(ValueError, match=r"seed=5 and this pipeline has seed=6"):
        reader.build_mixture(plan, "train", BATCH, 16, seed=6, start=position)
    fewer = reader.mixture(sources[:2], "train", BATCH)
    with pytest.raises(ValueError, match=r"sources \['a', 'b', 'c'\] and this mixture has \['a', 'b'\]"):
        reader.build_mixture(fewer, "train", BATCH, 16, start=position)
    single = reader.position(sources[0][0], "train", BATCH, 5, 3)
    with pytest.raises(ValueError, match="position of one dataset"):
        reader.build_mixture(plan, "train", BATCH, 16, start=single)


def test_classes_unite_by_name_and_evaluation_reads_each_source_once_saying_which(sources, plan):
    assert plan.classes == ("circle", "square", "star", "triangle")
    assert plan.labels.holders == {"circle": ("a", "c"), "square": ("a", "b"), "star": ("c",), "triangle": ("b",)}
    mixed = reader.build_mixture(plan, "validation", 5, 16, training=False, with_source=True, dtype=tf.uint8)
    got = [(image, plan.classes[label], source) for images, labels, which in mixed
           for image, label, source in zip(images.numpy(), labels.numpy(), which.numpy())]
    expected = []
    for k, (data, _) in enumerate(sources):
        alone = reader.build_dataset(data, "validation", 5, 16, training=False, dtype=tf.uint8)
        names = reader.dataset_info(data).classes
        expected += [(image, names[label], k) for images, labels in alone
                     for image, label in zip(images.numpy(), labels.numpy())]
    assert len(got) == len(expected) == 14
    assert all(np.array_equal(g[0], e[0]) and g[1:] == e[1:] for g, e in zip(got, expected))


def test_a_label_list_orders_the_ids_and_a_class_it_lacks_is_named(sources):
    plan = reader.mixture(sources, "train", BATCH, reader.LabelSpace(labels=["triangle", "star", "square", "circle"]))
    assert plan.classes == ("triangle", "star", "square", "circle")
    with pytest.raises(ValueError, match=r"source 'c': its class 'star' is not in LabelSpace\(labels=...\)"):
        reader.mixture(sources, "train", BATCH, reader.LabelSpace(labels=["triangle", "square", "circle"]))
    renamed = reader.mixture(sources, "train", BATCH, reader.LabelSpace(rename={"star": "triangle"}))
    assert renamed.classes == ("circle", "square", "triangle")


def test_a_misspelt_class_in_a_label_space_is_refused_naming_the_closest(sources, plan):
    with pytest.raises(ValueError, match=r"renames 'strar', which no source holds \(did you mean 'star'\?\)"):
        reader.mixture(sources, "train", BATCH, reader.LabelSpace(rename={"strar": "triangle"}))
    with pytest.raises(ValueError, match=r"names 'sqare', which no source holds after renaming \(did you mean "
                                         r"'square'\?\)"):
        reader.mixture(sources, "train", BATCH, reader.LabelSpace(labels=["triangle", "star", "sqare", "circle"]))
    with pytest.raises(ValueError, match=r"labels=LabelSpace\(labels=\('circle',.*plan it with reader.mixture"):
        reader.build_mixture(plan, "train", BATCH, 16, labels=reader.LabelSpace(labels=["circle", "square", "star",
                                                                                         "triangle"]))
    with pytest.raises(ValueError, match=r"repeat_factor=RepeatFactor.*planned with repeat_factor=None"):
        reader.build_mixture(plan, "train", BATCH, 16, repeat_factor=reader.RepeatFactor(0.5))


@pytest.fixture(scope="module")
def coco_and_voc(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("objects")
    images, annotations, files = [], [], {}
    classes = [(1, (5, 5, 30, 30)), (3, (40, 10, 70, 40)), (4, (10, 35, 50, 58))]
    for index in range(6):
        boxes = [classes[index % 3][1], classes[(index + 1) % 3][1]]
        name = f"{index:012d}.jpg"
        images.append({"id": index + 1, "file_name": name, "width": 80, "height": 60})
        for number, (category, (x0, y0, x1, y1)) in enumerate([classes[index % 3], classes[(index + 1) % 3]]):
            annotations.append({"id": 10 * index + number, "image_id": index + 1, "category_id": category,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
        files[name] = jpeg(picture(80, 60, boxes, seed=index))
    categories = [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}, {"id": 4, "name": "motorcycle"}]
    write_coco(str(root / "coco"), "train2017", images, annotations, categories, files)
    coco = str(root / "coco-out")
    run(ConvertOptions(src=str(root / "coco"), out=coco, shards=1, seed=0), FAST, show_progress=False)
    voc = root / "VOCdevkit" / "VOC2012"
    names = []
    for index in range(4):
        stem = f"2008_{index:06d}"
        write_file(str(voc / f"JPEGImages/{stem}.jpg"), jpeg(picture(80, 60, [(5, 5, 30, 30)], seed=10 + index)))
        objects = [("motorbike" if index % 2 else "person", (6, 6, 30, 30), 0), ("dog", (40, 30, 60, 50), 0)]
        write_file(str(voc / f"Annotations/{stem}.xml"), voc_xml(80, 60, objects))
        names.append(stem)
    write_file(str(voc / "ImageSets/Main/train.txt"), "".join(f"{n}\n" for n in names))
    voc_out = str(root / "voc-out")
    run(ConvertOptions(src=str(root / "VOCdevkit"), out=voc_out, shards=1, seed=0), FAST, show_progress=False)
    return coco, voc_out


@pytest.mark.slow  # two conversions' label spaces and 3 pipelines: about 20 s on 2 busy cores
def test_objects_of_coco_and_voc_meet_by_name_renamed_or_dropped_in_one_label_map(coco_and_voc, tmp_path):
    coco, voc = coco_and_voc
    space = reader.LabelSpace(rename={"motorbike": "motorcycle", "dog": None})
    union = reader.mixture([(coco, 2, "coco"), (voc, 1, "voc")], "train", 6, space)
    assert {"aeroplane", "car", "motorcycle", "person"} <= set(union.object_classes)  # VOC's 20, less dog and motorbike
    assert "dog" not in union.object_classes and "motorbike" not in union.object_classes
    assert union.labels.holders["car"] == ("coco", "voc")  # VOC labels cars too: an image without one has none
    space = reader.LabelSpace(labels=["car", "motorcycle", "person"], rename={"motorbike": "motorcycle"})
    plan = reader.mixture([(coco, 2, "coco"), (voc, 1, "voc")], "train", 6, space)
    assert plan.object_classes == ("car", "motorcycle", "person") and plan.classes[0] == ""
    assert plan.labels.holders == {"car": ("coco", "voc"), "motorcycle": ("coco", "voc"), "person": ("coco", "voc")}
    path = plan.write_label_map(str(tmp_path))
    with open(path, encoding="utf-8") as handle:
        assert handle.read() == converter_label_map(plan.classes)  # the converter's own label_map.pbtxt format
    keras_ids = reader.mixture([(coco, 2, "coco"), (voc, 1, "voc")], "train", 6, space, contiguous_ids=True)
    assert plan.describe()["class_map"]["voc"]["motorbike"] == 2 and plan.describe()["class_map"]["voc"]["dog"] is None
    assert keras_ids.num_classes == 3 and keras_ids.classes == keras_ids.object_classes
    mixed = reader.build_mixture(plan, "train", 6, 32, training=False, with_source=True)
    seen = {0: set(), 1: set()}
    for _, targets, which in mixed:
        for labels, source in zip(targets["labels"].numpy(), which.numpy()):
            seen[int(source)].update(plan.classes[label] for label in labels if label >= 0)
    assert seen == {0: {"car", "motorcycle", "person"}, 1: {"motorcycle", "person"}}  # the dogs dropped
    training = reader.build_mixture(keras_ids, "train", 6, 32, seed=1, num_steps=3,
                                    targets=reader.ObjectTargets(contiguous_ids=True))
    labels = np.concatenate([targets["labels"].numpy().ravel() for _, targets in training])
    assert set(labels) - {-1} <= {0, 1, 2} and (labels >= 0).any()  # KerasHub's 0..K-1


def test_a_source_of_another_task_is_refused_naming_it_and_its_task(sources, coco_and_voc):
    with pytest.raises(ValueError, match=r"source 'voc' \(.*\) holds task 'objects' and source 'a' holds "
                                         r"'classification'"):
        reader.mixture([sources[0], (coco_and_voc[1], 1, "voc")], "train", BATCH)


@pytest.mark.slow
def test_a_run_sized_in_passes_of_a_source_ends_there(plan):
    steps = plan.steps_for(2, "b")
    assert plan.consumed(steps)[1] >= 2 * plan.sources[1].epoch_records > plan.consumed(steps - 1)[1]
    dataset = reader.build_mixture(plan, "train", BATCH, 16, seed=5, num_steps=steps, dtype=tf.uint8)
    assert sum(1 for _ in dataset) == steps


def test_the_keras_callback_keeps_mixture_positions_and_refuses_another_mixture(sources, plan, tmp_path):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    path = tmp_path / "position.json"
    with pytest.raises(ValueError, match="needs steps_per_epoch="):
        reader.ExactResume(str(path), plan, seed=5, epochs=2)
    callback = reader.ExactResume(str(path), plan, seed=5, epochs=2, steps_per_epoch=7)  # the plan's split, batch
    callback.set_model(model)
    model.optimizer.iterations.assign(9)
    callback.on_train_begin()
    assert reader.MixturePosition.from_json(path.read_text()) == plan.position(5, 9)
    callback.on_train_batch_end(0)
    assert not model.stop_training
    model.optimizer.iterations.assign(14)
    callback.on_train_batch_end(0)
    assert model.stop_training  # 2 epochs of 7 steps
    other = reader.mixture([(sources[0][0], 0.4), *sources[1:]], "train", BATCH)
    restarted = reader.ExactResume(str(path), other, seed=5, epochs=2, steps_per_epoch=7)
    restarted.set_model(model)
    with pytest.raises(ValueError, match=r"cannot resume on this mixture: source 'a' had weight 1/2"):
        restarted.on_train_begin()


def test_the_keras_callback_refuses_a_split_or_batch_other_than_the_plans_and_warns_on_the_same(plan, tmp_path):
    path = str(tmp_path / "position.json")
    with pytest.raises(ValueError, match=r"planned for split 'train' and batch_size=12, and ExactResume got "
                                         r"split='validation', batch_size=12: leave them out"):
        reader.ExactResume(path, plan, "validation", BATCH, 5, 2, steps_per_epoch=7)
    with pytest.raises(ValueError, match=r"planned for split 'train' and batch_size=12, and ExactResume got "
                                         r"split=None, batch_size=6"):
        reader.ExactResume(path, plan, batch_size=6, seed=5, epochs=2, steps_per_epoch=7)
    # The release before's call, split and batch said again and the same: kept one release, with a warning.
    with pytest.warns(DeprecationWarning, match=r"call ExactResume\(path, plan, seed=seed, epochs=epochs, "
                                                r"steps_per_epoch=...\)") as said:
        old = reader.ExactResume(path, plan, "train", BATCH, 5, 2, steps_per_epoch=7)
    assert said[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(DeprecationWarning, match=r"pass ExactResume\(path, data=...\)"):
        renamed = reader.ExactResume(path, data_dir=plan, seed=5, epochs=2, steps_per_epoch=7)
    new = reader.ExactResume(path, plan, seed=5, epochs=2, steps_per_epoch=7)
    assert old._args == renamed._args == new._args == (plan, None, None, 5)


@pytest.mark.slow  # two fits over a mixture: 8 s of CPU (the wrap test above builds one pipeline less for it)
def test_a_keras_fit_over_a_mixture_stopped_mid_epoch_resumes_on_the_uninterrupted_batches(plan, uninterrupted,
                                                                                           tmp_path):
    """fit with BackupAndRestore and ExactResume(path, plan, seed=, epochs=, steps_per_epoch=), no split or
    batch said again: stopped after step 5 of 2 epochs of 4 steps (the last backup at step 4, where source c
    wraps) and fitted again, the steps trained are the uninterrupted pipeline's batches, byte for byte, and
    training ends at step 8."""
    import keras

    class Stop(Exception):
        pass

    trained: dict = {}

    class Logged(keras.Sequential):
        def train_step(self, data):
            images, labels, which = data
            trained[int(self.optimizer.iterations.numpy())] = (images.numpy(), labels.numpy(), which.numpy())
            return super().train_step((tf.cast(images, tf.float32), labels))

    class StopAfter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 5:
                raise Stop()

    def fit(*extra) -> None:
        model = Logged([keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.SGD(1e-6), run_eagerly=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.optimizer.build(model.trainable_variables)
        train = reader.build_dataset(plan, image_size=16, seed=5, dtype=tf.uint8, with_source=True,
                                     start=model.optimizer.iterations)
        model.fit(train, epochs=2, steps_per_epoch=4, verbose=0, shuffle=False, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=2, delete_checkpoint=False),
            reader.ExactResume(str(tmp_path / "backup" / "position.json"), plan, seed=5, epochs=2,
                               steps_per_epoch=4), *extra])

    assert plan.steps_for(1, "c") == 4  # resumed at c's wrap (the wrap test's JSON positions resume around it)
    with pytest.raises(Stop):
        fit(StopAfter())
    assert sorted(trained) == list(range(5))
    assert _same([trained[step] for step in range(5)], uninterrupted[:5])
    trained.clear()
    fit()
    assert sorted(trained) == [4, 5, 6, 7]  # from the backup at step 4 (step 4 trained again) to the end, no further
    assert _same([trained[step] for step in sorted(trained)], uninterrupted[4:8])


@pytest.mark.slow
def test_the_mixture_detector_example_trains_and_scores_each_source(coco_and_voc, tmp_path):
    """examples/train_mixture.py, in this process: KerasHub's RetinaNet on COCO-style plus VOC-style batches,
    motorbike renamed, AP per source, the label map written."""
    import importlib.util
    import json

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("train_mixture", os.path.join(REPO, "examples", "train_mixture.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    coco, voc = coco_and_voc
    metrics = tmp_path / "metrics.json"
    assert example.main(["--source", f"{coco}:0.6", "--source", f"{voc}:0.4", "--rename", "motorbike=motorcycle",
                         "--labels", "car,motorcycle,person", "--epochs", "1", "--batch-size", "4",
                         "--image-size", "64", "--eval-split", "train", "--label-map", str(tmp_path / "labels"),
                         "--metrics-json", str(metrics)]) == 0
    found = json.loads(metrics.read_text())
    assert found["classes"] == ["car", "motorcycle", "person"] and np.isfinite(found["loss"])
    assert found["sources"]["coco-out"]["images"] == 6 and found["sources"]["voc-out"]["images"] == 4
    assert found["sources"]["voc-out"]["objects"] == 4  # the dogs are not in the label list
    assert all(0 <= scores["AP"] <= 1 for scores in found["sources"].values())
    assert (tmp_path / "labels" / "label_map.pbtxt").read_text().count("item {") == 3


def test_weights_read_as_they_print_and_mistakes_in_a_source_or_position_are_named(sources, plan):
    weights = [np.float32(0.5), Decimal("0.3"), 0.2]
    typed = reader.mixture([(data, w) for (data, _), w in zip(sources, weights)], "train", BATCH)
    printed = reader.mixture([(data, w) for (data, _), w in zip(sources, (0.5, 0.3, 0.2))], "train", BATCH)
    assert typed.quotas.shares == printed.quotas.shares and typed.quotas.period == printed.quotas.period
    with pytest.raises(ValueError, match=r"source 0 must be .*a number for the weight and text for the name"):
        reader.mixture([(sources[0][0], "a", 0.5), (sources[1][0], "b", 0.5)], "train", BATCH)
    with pytest.raises(ValueError, match=r"a global step must be an integer >= 0, got -1"):
        plan.counts(-1)
    with pytest.raises(ValueError, match=r"not a mixture position: it has no batch_size, seed, sources, split, "
                                         r"version"):
        reader.MixturePosition.from_json('{"step": 3}')


def test_a_position_taken_under_other_label_ids_is_refused(sources, plan):
    position = plan.position(5, 3)
    assert reader.MixturePosition.from_json(position.to_json()) == position
    renamed = reader.mixture(sources, "train", BATCH, reader.LabelSpace(rename={"star": "triangle"}))
    with pytest.raises(ValueError, match=r"other label ids .*its classes are \['circle', 'square', 'triangle'\]"):
        reader.build_mixture(renamed, "train", BATCH, 16, start=position)
