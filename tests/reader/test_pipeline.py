"""The reader's pipelines over a real converted dataset: completeness, shapes, determinism, caches, sharding."""

from __future__ import annotations

import collections
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import reader
import record_schema
from reader import cache as reader_cache
from reader import preprocess


def _manifest(data_dir):
    with open(os.path.join(data_dir, record_schema.MANIFEST_FILE)) as handle:
        return json.load(handle)


def _labels(dataset):
    return [int(v) for _, labels in dataset for v in labels.numpy()]


def _context(pipelines, index):
    return tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=index,
                                      num_replicas_in_sync=pipelines)


def test_dataset_info_reads_the_manifest(demo_dataset):
    info = reader.dataset_info(demo_dataset)
    assert info.classes == ("circle", "square", "triangle")
    assert info.split("train").num_examples == 72 and len(info.split("train").shards) == 4
    assert info.split("val").name == "validation"  # the alias users type
    assert reader.steps_per_epoch(demo_dataset, "train", 10) == 7
    assert reader.steps_per_epoch(demo_dataset, "validation", 10, drop_remainder=False) == 2


def test_eval_pass_yields_every_record_once_with_the_manifest_label_counts(demo_dataset):
    ds = reader.build_dataset(demo_dataset, "train", batch_size=10, image_size=32, training=False)
    labels = _labels(ds)
    counts = collections.Counter(labels)
    assert [counts[i] for i in range(3)] == _manifest(demo_dataset)["splits"]["train"]["label_counts"]
    assert labels == _labels(ds)  # a fixed order, pass after pass
    batch_sizes = [int(images.shape[0]) for images, _ in ds]
    assert batch_sizes == [10] * 7 + [2]  # the final partial batch is kept


@pytest.mark.slow
def test_training_epochs_are_complete_reshuffled_and_repeat(demo_dataset):
    ds = reader.build_dataset(demo_dataset, batch_size=1, image_size=16, seed=3, num_epochs=2)
    labels = _labels(ds)
    manifest_counts = _manifest(demo_dataset)["splits"]["train"]["label_counts"]
    assert [collections.Counter(labels)[i] for i in range(3)] == [2 * n for n in manifest_counts]
    assert labels[:72] != labels[72:]  # a new order each epoch
    endless = reader.build_dataset(demo_dataset, batch_size=32, image_size=16, seed=3)
    assert len(list(endless.take(10))) == 10  # 320 images from 72: it repeats


@pytest.mark.parametrize("training", [True, False])
def test_shapes_and_dtypes(demo_dataset, training):
    ds = reader.build_dataset(demo_dataset, batch_size=8, image_size=(40, 56), training=training, seed=1)
    images, labels = next(iter(ds))
    assert images.shape == (8, 40, 56, 3) and images.dtype == tf.float32
    assert labels.shape == (8,) and labels.dtype == tf.int64
    assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 255.0
    if training:
        assert ds.element_spec[0].shape == (8, 40, 56, 3)  # static batch shape


@pytest.mark.parametrize(
    "dtype,normalization,low,high",
    [(tf.uint8, None, 0, 255), (tf.bfloat16, None, 0, 255), (tf.float32, "mobilenet", -1, 1),
     (tf.float16, "imagenet", -2.2, 2.7)],
)
def test_output_dtypes_and_normalizations(demo_dataset, dtype, normalization, low, high):
    ds = reader.build_dataset(demo_dataset, batch_size=8, image_size=24, training=False, dtype=dtype,
                              normalization=normalization)
    images, _ = next(iter(ds))
    assert images.dtype == dtype
    values = tf.cast(images, tf.float32).numpy()
    assert low - 1e-2 <= values.min() and values.max() <= high + 1e-2


@pytest.mark.slow
def test_a_seed_gives_identical_batches_and_another_seed_different_ones(demo_dataset):
    def batches(seed):
        ds = reader.build_dataset(demo_dataset, batch_size=16, image_size=32, seed=seed)
        return [(i.numpy(), l.numpy()) for i, l in ds.take(6)]

    first, again, other = batches(5), batches(5), batches(6)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(first, again))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(first, other))


@pytest.mark.slow
def test_the_training_flip_mirrors_about_half_the_images_and_changes_nothing_else(demo_dataset):
    # Same seed with and without the flip: the crops are the same, so each image is identical or its mirror.
    def images(flip):
        ds = reader.build_dataset(demo_dataset, batch_size=16, image_size=32, seed=3,
                                  augment=reader.Augmentation(flip=flip))
        return np.concatenate([i.numpy() for i, _ in ds.take(4)])

    flipped, plain = images(True), images(False)
    same = [np.abs(a - b).max() < 0.01 for a, b in zip(flipped, plain)]
    mirrored = [np.abs(a - b[:, ::-1]).max() < 0.01 for a, b in zip(flipped, plain)]
    assert all(s or m for s, m in zip(same, mirrored))
    assert 16 <= sum(m and not s for s, m in zip(same, mirrored)) <= 48


def test_eval_centre_crop_matches_a_full_decode_then_crop(demo_dataset):
    # Crop-before-decode must give the pixels a plain decode + crop gives.
    shard = reader.dataset_info(demo_dataset).split("train").files[0]
    record = next(iter(tf.data.TFRecordDataset(shard)))
    data, _ = reader.parse_record(record)
    full = tf.io.decode_jpeg(data, channels=3)
    height, width = int(full.shape[0]), int(full.shape[1])
    side = int(0.875 * min(height, width))
    top, left = (height - side) // 2, (width - side) // 2
    expected = tf.image.resize(full[top:top + side, left:left + side], (side, side))
    got = reader.eval_image(data, (side, side), 0.875)
    assert np.abs(got.numpy() - expected.numpy()).max() < 1.0


def test_file_cache_holds_encoded_records_about_the_size_of_the_shards(demo_dataset, tmp_path):
    prefix = str(tmp_path / "cache")
    ds = reader.build_dataset(demo_dataset, batch_size=8, image_size=16, seed=1, options={"cache": prefix})
    uncached = reader.build_dataset(demo_dataset, batch_size=8, image_size=16, seed=1)
    assert len(list(ds.take(30))) == 30  # three epochs: fills, then replays the cache
    cache_bytes = sum(os.path.getsize(p) for p in glob.glob(prefix + "*"))
    shard_bytes = _manifest(demo_dataset)["splits"]["train"]["num_bytes"]
    assert 0.9 * shard_bytes <= cache_bytes <= 1.1 * shard_bytes
    # The cache replays encoded records: the order and augmentation still change every epoch.
    labels = _labels(reader.build_dataset(demo_dataset, batch_size=1, image_size=16, seed=1,
                                          options={"cache": prefix + "2"}, num_epochs=2))
    assert len(labels) == 144 and labels[:72] != labels[72:]
    del uncached


def test_memory_cache_works_and_refuses_what_cannot_fit(demo_dataset, monkeypatch):
    ds = reader.build_dataset(demo_dataset, "validation", batch_size=6, image_size=16, training=False,
                              options={"cache": "memory"})
    assert _labels(ds) == _labels(ds)
    monkeypatch.setattr(reader_cache, "MEMORY_CACHE_FRACTION", 1e-12)
    with pytest.raises(reader.CacheTooLargeError) as error:
        reader.build_dataset(demo_dataset, batch_size=6, image_size=16, options={"cache": "memory"})
    needed = _manifest(demo_dataset)["splits"]["train"]["num_bytes"]
    assert f"{needed:,} bytes" in str(error.value) and "available" in str(error.value)


def test_input_pipelines_read_disjoint_complete_file_sets_that_change_per_epoch(demo_dataset):
    files, counts = reader.dataset_info(demo_dataset).split("train").files, [18] * 4
    for epoch in (0, 1):
        shares = [
            [p.decode() for p, _ in reader.file_order(files, counts, seed=9, epoch=epoch, num_shards=2,
                                                      shard_index=i).as_numpy_iterator()]
            for i in (0, 1)
        ]
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == sorted(files)
        if epoch == 0:
            first = shares
    assert first != shares


def test_eval_with_input_context_splits_records_disjointly(demo_dataset):
    per_pipeline = [
        _labels(reader.build_dataset(demo_dataset, batch_size=8, image_size=16, training=False,
                                     input_context=_context(2, i)))
        for i in (0, 1)
    ]
    counts = collections.Counter(per_pipeline[0] + per_pipeline[1])
    assert [counts[i] for i in range(3)] == _manifest(demo_dataset)["splits"]["train"]["label_counts"]
    assert len(per_pipeline[0]) == len(per_pipeline[1]) == 36  # 2 of the 4 shards each


def test_fewer_files_than_pipelines_falls_back_to_record_sharding(demo_dataset, caplog):
    with caplog.at_level("WARNING"):
        parts = [
            _labels(reader.build_dataset(demo_dataset, "validation", batch_size=4, image_size=16, training=False,
                                         input_context=_context(2, i)))
            for i in (0, 1)
        ]
    assert "1 shard files for 2 input pipelines" in caplog.text
    assert len(parts[0]) + len(parts[1]) == 18 and abs(len(parts[0]) - len(parts[1])) <= 1


def test_shards_written_by_other_tools_with_their_keys_and_one_based_labels(tmp_path, sample_images):
    path = str(tmp_path / "foreign.tfrecord-00000-of-00001")
    with tf.io.TFRecordWriter(path) as writer:
        for label in (1, 2, 3, 1):
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[sample_images["jpeg_rgb"]])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())
    info = reader.foreign_dataset_info({"train": [path]}, classes=["a", "b", "c"])
    ds = reader.build_dataset("", "train", batch_size=2, image_size=16, training=False, info=info,
                              keys=reader.FeatureKeys.tfds(), label_offset=-1)
    assert _labels(ds) == [0, 1, 2, 0]


def test_a_corrupt_shard_fails_naming_the_file_or_is_skipped_on_request(demo_dataset, tmp_path, capfd):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(demo_dataset, broken)
    victim = broken / reader.dataset_info(str(broken)).split("train").shards[1].path.split("/")[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    ds = reader.build_dataset(str(broken), batch_size=8, image_size=16, training=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match=victim.name):
        _labels(ds)
    skipping = reader.build_dataset(str(broken), batch_size=8, image_size=16, training=False, skip_corrupt=True)
    assert 54 <= len(_labels(skipping)) < 72
    assert victim.name in capfd.readouterr().err
    # Training too, in the streams order: whole batches of what is left, every record that remains in each epoch.
    training = reader.build_dataset(str(broken), batch_size=8, image_size=16, seed=1, num_epochs=2, skip_corrupt=True)
    batches = [labels.numpy() for _, labels in training]
    assert 2 * 54 // 8 <= len(batches) < 2 * 72 // 8 and all(len(labels) == 8 for labels in batches)
    assert victim.name in capfd.readouterr().err


def test_a_shard_truncated_at_a_record_boundary_is_caught_by_the_manifest_count(demo_dataset, tmp_path):
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(demo_dataset, cut)
    victim = cut / reader.dataset_info(str(cut)).split("train").shards[0].path.split("/")[-1]
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(victim))]
    with tf.io.TFRecordWriter(str(victim)) as writer:
        for record in records[:-1]:  # a clean file, one record short
            writer.write(record)
    with pytest.raises(tf.errors.InvalidArgumentError, match="read 17 of its 18 records"):
        _labels(reader.build_dataset(str(cut), batch_size=8, image_size=16, training=False))


def test_errors_name_what_is_wrong(demo_dataset, tmp_path):
    with pytest.raises(ValueError, match=r"'nope'.*\['train', 'validation'\]"):
        reader.build_dataset(demo_dataset, "nope")
    with pytest.raises(reader.DatasetNotFoundError, match="python -m converter --src"):
        reader.dataset_info(str(tmp_path))
    for kwargs, name in [({"batch_size": 0}, "batch_size"), ({"image_size": (0, 3)}, "image_size"),
                         ({"crop_fraction": 1.5}, "crop_fraction"), ({"normalization": "zscore"}, "normalization"),
                         ({"dtype": tf.uint8, "normalization": "mobilenet"}, "normalization"),
                         ({"options": {"cache": 3}}, "cache"), ({"options": {"shuffle_buffer": -1}}, "shuffle_buffer")]:
        with pytest.raises(ValueError, match=name):
            reader.build_dataset(demo_dataset, **kwargs)
    with pytest.raises(ValueError, match="area_range"):
        reader.Augmentation(area_range=(0.5, 0.1))


@pytest.fixture(scope="module")
def large_photos_dataset(tmp_path_factory) -> str:
    """Six 960x1280 photos (two classes), converted: large enough for reduced-scale decoding at 224 px."""
    from PIL import Image

    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run
    from tests.conftest import _photo

    src = tmp_path_factory.mktemp("large") / "photos"
    for index in range(6):
        folder = src / ("a" if index % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_photo(index, 960, 1280)).save(folder / f"{index}.jpg", quality=92)
    out = str(tmp_path_factory.mktemp("large-converted") / "photos-tfrecords")
    run(ConvertOptions(src=str(src), out=out, shards=2, seed=1),
        ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show_progress=False)
    return out


def test_a_large_crop_is_decoded_at_reduced_scale_matching_a_filtered_full_decode(large_photos_dataset):
    record = next(iter(tf.data.TFRecordDataset(reader.dataset_info(large_photos_dataset).split("train").files[0])))
    data, _ = reader.parse_record(record)
    full = tf.io.decode_jpeg(data, channels=3)
    window = tf.constant([50, 200, 900, 1000])  # 900 / 224 >= 4: decoded at 1/4 scale
    got = preprocess.decode_jpeg_window(data, window, scale_to=(224, 224))
    assert got.shape == (225, 250, 3)
    expected = tf.image.resize(full[50:950, 200:1200], (225, 250), antialias=True)
    assert float(tf.reduce_mean(tf.abs(tf.cast(got, tf.float32) - expected))) < 2.0
    small = preprocess.decode_jpeg_window(data, tf.constant([0, 0, 300, 300]), scale_to=(224, 224))
    assert small.shape == (300, 300, 3)  # under twice the output: full scale


def test_manifest_records_the_largest_side_and_presets_use_it(large_photos_dataset, demo_dataset):
    assert reader.dataset_info(large_photos_dataset).split("train").max_side == 1280
    assert reader.dataset_info(demo_dataset).split("train").max_side < 2 * 224
    # The eval preset on large photos still gives the centre crop of a full decode (filtered, not aliased).
    batch, _ = next(iter(reader.build_dataset(large_photos_dataset, "train", 6, 224, training=False)))
    expected = []
    for record in tf.data.TFRecordDataset(reader.dataset_info(large_photos_dataset).split("train").files):
        full = tf.io.decode_jpeg(reader.parse_record(record)[0], channels=3)
        side = int(0.875 * 960)
        top, left = (960 - side) // 2, (1280 - side) // 2
        expected.append(tf.image.resize(full[top:top + side, left:left + side], (224, 224), antialias=True))
    assert float(tf.reduce_mean(tf.abs(batch - tf.stack(expected)))) < 2.0
    train, _ = next(iter(reader.build_dataset(large_photos_dataset, "train", 6, 224, training=True, seed=3)))
    assert train.shape == (6, 224, 224, 3)
