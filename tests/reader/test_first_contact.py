"""The reader's answers to a new user's mistakes and damaged datasets: never a hang, never stale data.

Each test pins one behaviour a user met on first contact (see the README's
"When something is wrong" notes): a missing or unreadable shard, a cache of an
earlier version of the dataset, a split smaller than one batch, bad arguments,
foreign shards with labels out of range.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
import tensorflow as tf

import reader
from tests.conftest import make_sample_images


def _labels(dataset):
    return [int(v) for _, labels in dataset for v in labels.numpy()]


@pytest.fixture()
def copy_of(demo_dataset, tmp_path):
    """A private copy of the converted demo dataset, to damage."""
    folder = tmp_path / "copy"
    shutil.copytree(demo_dataset, folder)
    return folder


def _shard(folder, split="train", index=1):
    return folder / os.path.basename(reader.dataset_info(str(folder)).split(split).shards[index].path)


@pytest.mark.parametrize("training", [True, False])
def test_a_missing_shard_fails_at_build_naming_it(copy_of, training):
    victim = _shard(copy_of)
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        reader.build_dataset(str(copy_of), batch_size=8, image_size=16, training=training)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.slow
def test_a_shard_that_vanishes_after_build_fails_within_seconds_naming_it(copy_of, training):
    ds = reader.build_dataset(str(copy_of), batch_size=8, image_size=16, training=training, seed=1)
    victim = _shard(copy_of, index=3)
    victim.unlink()
    started = time.monotonic()
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{victim.name}.* does not exist"):
        for _ in ds.take(100):  # training repeats: 100 batches is several epochs
            pass
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_a_shard_missing_before_the_build_is_skipped_with_one_warning_not_one_per_epoch(copy_of, capfd, caplog):
    victim = _shard(copy_of)
    victim.unlink()
    ds = reader.build_dataset(str(copy_of), batch_size=8, image_size=16, seed=1, skip_corrupt=True)
    for _ in ds.take(120):  # several epochs
        pass
    said = capfd.readouterr().err + caplog.text
    assert said.count(victim.name) == 1, said


def test_a_missing_shard_is_skipped_with_a_warning_on_request(copy_of, capfd):
    ds = reader.build_dataset(str(copy_of), batch_size=8, image_size=16, training=False, skip_corrupt=True)
    victim = _shard(copy_of)
    lost = reader.dataset_info(str(copy_of)).split("train").shards[1].num_examples
    victim.unlink()
    assert len(_labels(ds)) == 72 - lost
    err = capfd.readouterr().err
    assert victim.name in err and "skipping" in err


@pytest.mark.parametrize("training", [True, False])
def test_an_unreadable_shard_fails_at_once_naming_it(copy_of, training):
    """A shard that is present but cannot be read (a folder in its place: root ignores file permissions)."""
    victim = _shard(copy_of, index=2)
    victim.unlink()
    victim.mkdir()
    ds = reader.build_dataset(str(copy_of), batch_size=8, image_size=16, training=training, seed=1)
    started = time.monotonic()
    with pytest.raises(tf.errors.OpError, match=victim.name):
        for _ in ds.take(100):
            pass
    assert time.monotonic() - started < 30


def _convert(src, out, labels_file=None, seed=1):
    from beam_jobs.options import ConvertOptions
    from beam_jobs.pipeline import run

    run(ConvertOptions(src=src, out=str(out), shards=2, seed=seed, labels_file=labels_file, overwrite=True),
        ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show_progress=False)


@pytest.mark.slow
def test_a_file_cache_is_never_served_for_a_reconverted_dataset(demo_src, tmp_path, caplog):
    out = tmp_path / "data"
    _convert(demo_src, out)
    cache = str(tmp_path / "cache")
    first = _labels(reader.build_dataset(str(out), batch_size=16, image_size=16, training=False,
                                         options={"cache": cache}))
    # The same images converted again with other label ids, into the same folder.
    reversed_labels = tmp_path / "labels.txt"
    reversed_labels.write_text("triangle\nsquare\ncircle\n")
    _convert(demo_src, out, labels_file=str(reversed_labels))
    fresh = _labels(reader.build_dataset(str(out), batch_size=16, image_size=16, training=False))
    cached = _labels(reader.build_dataset(str(out), batch_size=16, image_size=16, training=False,
                                         options={"cache": cache}))
    assert cached == fresh != first
    assert "other versions of this dataset" in caplog.text  # the old version's files are named for deletion


def test_a_file_cache_named_by_the_manifest_wide_version_is_still_served(demo_dataset, tmp_path, caplog):
    """Caches made before the version was the content keep working for the data they were made from."""
    from reader.cache import cache_prefix

    info = reader.dataset_info(demo_dataset)
    cache = str(tmp_path / "records")
    reader.build_dataset(demo_dataset, batch_size=16, image_size=16, training=False, options={"cache": cache})
    for _ in reader.build_dataset(demo_dataset, batch_size=16, image_size=16, training=False,
                                  options={"cache": cache}):
        pass
    made = sorted(os.listdir(tmp_path))
    assert made and all(info.fingerprint in name for name in made)
    for name in made:
        os.rename(tmp_path / name, tmp_path / name.replace(info.fingerprint, info.legacy_fingerprint))
    assert cache_prefix(cache, info, "train", 1) == f"{cache}-train-{info.legacy_fingerprint}-of1"
    assert "other versions" not in caplog.text


def test_steps_per_epoch_is_never_zero(demo_dataset):
    with pytest.raises(ValueError, match=r"validation.* 18 examples, fewer than one batch of 64"):
        reader.steps_per_epoch(demo_dataset, "validation", 64)
    assert reader.steps_per_epoch(demo_dataset, "validation", 64, drop_remainder=False) == 1


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"seed": "abc"}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"), ({"seed": -1}, "seed"),
     ({"options": {"cache": "Memory"}}, 'did you mean cache="memory"'),
     ({"options": {"cache": "/no/such/folder/cache"}}, "/no/such/folder"),
     ({"options": {"cache": "/proc/cache"}}, "not writable")],
)
def test_bad_arguments_fail_at_build_naming_them(demo_dataset, kwargs, named, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=named):
        reader.build_dataset(demo_dataset, batch_size=8, image_size=16, **kwargs)
    assert os.listdir(tmp_path) == []  # no cache files written anywhere


def _foreign_shard(path, labels):
    jpeg = make_sample_images()["jpeg_rgb"]
    with tf.io.TFRecordWriter(path) as writer:
        for label in labels:
            example = tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())


@pytest.mark.parametrize(("labels", "offset", "bad"), [((0, 1, 2, 4, 1), 0, 4), ((1, 2, 0, 3), -1, -1)])
@pytest.mark.slow
def test_foreign_labels_out_of_range_fail_naming_the_shard_or_are_skipped(tmp_path, labels, offset, bad, capfd):
    good = str(tmp_path / "good.tfrecord")
    foreign = str(tmp_path / "foreign.tfrecord")
    _foreign_shard(good, [1 - offset] * 3)
    _foreign_shard(foreign, labels)
    info = reader.foreign_dataset_info({"train": [good, foreign]}, classes=["a", "b", "c"])
    for training in (False, True):
        ds = reader.build_dataset("", batch_size=2, image_size=16, training=training, info=info, label_offset=offset,
                                  num_epochs=1)
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"foreign.tfrecord\W* record \d+ has label {bad}"):
            _labels(ds)
    skipping = reader.build_dataset("", batch_size=1, image_size=16, training=False, info=info, label_offset=offset,
                                    skip_corrupt=True)
    kept = _labels(skipping)
    assert len(kept) == 3 + len(labels) - 1 and all(0 <= label < 3 for label in kept)
    assert "foreign.tfrecord" in capfd.readouterr().err


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"training": "False"}, "training must be True or False, got str 'False'"),
    ({"augment": {"flips": False}}, "augment has no field 'flips'; reader.Augmentation has"),
    ({"augment": [0.5, 1.0]}, r"augment must be a reader.Augmentation \(or a dict of its fields"),
    ({"keys": {"img": "x"}}, "keys has no field 'img'; reader.FeatureKeys has"),
    ({"dtype": "foo"}, r"dtype must be one of \['float32', 'bfloat16', 'float16', 'uint8'\], got 'foo'"),
    ({"input_context": tf.distribute.get_strategy()},
     "input_context must be the tf.distribute.InputContext .* use reader.distributed_dataset"),
])
def test_arguments_of_the_wrong_kind_fail_naming_the_argument(demo_dataset, kwargs, message):
    with pytest.raises(ValueError, match=message):
        reader.build_dataset(demo_dataset, batch_size=8, image_size=16, **kwargs)


def test_numpy_integers_and_option_dicts_are_taken_as_what_they_mean(demo_dataset):
    import numpy as np

    plain = reader.build_dataset(demo_dataset, "validation", batch_size=6, image_size=16, seed=3, training=False)
    numpy = reader.build_dataset(demo_dataset, "validation", batch_size=np.int64(6), image_size=np.int32(16),
                                 seed=np.uint64(3), training=np.bool_(False), keys={"image": "image/encoded"})
    for (a, la), (b, lb) in zip(plain, numpy):
        assert np.array_equal(a.numpy(), b.numpy()) and np.array_equal(la.numpy(), lb.numpy())
    train = reader.build_dataset(demo_dataset, batch_size=4, image_size=16, seed=np.int64(1),
                                 augment={"flip": False, "area_range": (0.5, 1.0)})
    assert next(iter(train))[0].shape == (4, 16, 16, 3)


def test_a_training_batch_larger_than_the_split_is_a_warning(demo_dataset, caplog):
    reader.build_dataset(demo_dataset, "validation", batch_size=64, image_size=16)
    assert caplog.text.count("split validation has 18 examples, fewer than one batch of 64") == 1  # once
    assert "the buffer order" in caplog.text  # an epoch of the default order holds whole batches: none here
    with pytest.raises(ValueError, match="split 'validation' has 18 examples, fewer than one batch of 64"):
        reader.build_dataset(demo_dataset, "validation", batch_size=64, image_size=16, seed=1, start=0)


def test_a_shard_file_given_as_the_dataset_folder_names_the_folder_to_pass(demo_dataset):
    shard = reader.dataset_info(demo_dataset).split("train").files[0]
    with pytest.raises(reader.DatasetNotFoundError, match=f"{shard} is a file, not a dataset folder: pass the folder "
                                                          f"that holds manifest.json \\({demo_dataset}\\)"):
        reader.build_dataset(shard)


def _write_foreign(path, feature, compression=None):
    jpeg = make_sample_images()["jpeg_rgb"]
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for label in (0, 1, 2):
            example = tf.train.Example(features=tf.train.Features(feature={
                "img": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])), **feature(label)}))
            writer.write(example.SerializeToString())


def _int_label(label):
    return {"cls": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}


def test_foreign_shards_with_other_keys_string_labels_or_gzip_fail_naming_the_shard_and_the_fix(tmp_path):
    plain, strings, gzipped = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord", tmp_path / "c.tfrecord"
    _write_foreign(plain, _int_label)
    _write_foreign(strings, lambda label: {"cls": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"cat"]))})
    _write_foreign(gzipped, _int_label, compression="GZIP")

    info = reader.foreign_dataset_info({"train": [str(plain)]})
    with pytest.raises(ValueError, match=rf"shard {plain}: its records have no image bytes under 'image/encoded'; "
                                         r"they hold cls \(int64_list\), img \(bytes_list\); pass keys=reader.FeatureKeys"):
        reader.build_dataset("", info=info, batch_size=2, image_size=16)
    ds = reader.build_dataset("", info=info, batch_size=3, image_size=16, training=False,
                              keys=reader.FeatureKeys(image="img", label="cls"))
    assert _labels(ds) == [0, 1, 2]
    with pytest.raises(ValueError, match=rf"shard {strings}: the label 'cls' is bytes_list, not an integer"):
        reader.build_dataset("", info=reader.foreign_dataset_info({"train": [str(strings)]}), batch_size=2,
                             image_size=16, keys=reader.FeatureKeys(image="img", label="cls"))
    with pytest.raises(ValueError, match=rf"shard file {gzipped} is GZIP-compressed; this reader reads uncompressed"):
        reader.foreign_dataset_info({"train": [str(gzipped)]})


def test_foreign_shards_by_glob_pattern_and_their_steps_per_epoch(tmp_path):
    for index in range(3):
        _write_foreign(tmp_path / f"train-{index}.tfrecord", _int_label)
    info = reader.foreign_dataset_info({"train": str(tmp_path / "train-*.tfrecord")})
    assert [os.path.basename(path) for path in info.split("train").files] == \
        ["train-0.tfrecord", "train-1.tfrecord", "train-2.tfrecord"]
    assert reader.steps_per_epoch(info, "train", 4) == 2
    with pytest.raises(ValueError, match=r"split 'train': the pattern '.*nothing-\*' matches no files"):
        reader.foreign_dataset_info({"train": str(tmp_path / "nothing-*")})
    with pytest.raises(reader.DatasetNotFoundError, match="is a pattern, not a dataset folder.*foreign_dataset_info"):
        reader.build_dataset(str(tmp_path / "train-*.tfrecord"))


@pytest.mark.e2e
def test_import_reader_then_keras_and_a_pipeline_print_nothing_unless_the_environment_asks(demo_dataset):
    """TensorFlow 2.21 logs while it loads, before absl's logging starts, whatever TF_CPP_MIN_LOG_LEVEL says
    (six lines, and "failed call to cuInit" at the first operation on a machine without CUDA). The same new
    interpreter shows that importing the reader imports no Beam module (test_pipeline.py's own process for that
    was a second TensorFlow start-up)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import reader\n"
            "import sys; print(any(m.startswith('apache_beam') for m in sys.modules))\n"  # the reader never imports Beam
            "import keras\n"
            f"ds = reader.build_dataset({demo_dataset!r}, batch_size=4, image_size=16, seed=0)\n"
            "next(iter(ds))\n"
            "import sys; print('python still writes to stderr', file=sys.stderr)\n")
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = REPO
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "False\n"  # importing the reader imported no apache_beam module (a user's trainer has none)
    assert proc.stderr == "python still writes to stderr\n"
    asked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert "tf_record_dataset_op" in asked.stderr  # the user's own setting wins, start-up lines included:
    # absl's preamble and the start-up line it introduces, whichever that is (oneDNN's notice, the CPU feature
    # guard's or CUDA's lines: each is printed only by some builds, CPUs or machines)
    from reader.quiet_start import _ABSL_LINE, PREAMBLE

    lines = asked.stderr.splitlines()
    assert PREAMBLE in lines and _ABSL_LINE.match(lines[lines.index(PREAMBLE) + 1]), asked.stderr


def test_the_start_up_filter_keeps_what_the_level_lets_through_and_every_line_not_tensorflows():
    from reader.quiet_start import PREAMBLE, filtered

    text = ("libfoo: a C library's own line\n"
            f"{PREAMBLE}\n"
            "I0000 00:00:1795726445.034948    1787 port.cc:153] oneDNN custom operations are on.\n"
            "I0000 00:00:1795726445.1    1787 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
            "To enable the following instructions: AVX2 AVX512F, in other operations, rebuild TensorFlow.\n"
            f"{PREAMBLE}\n"
            "W0000 00:00:1795726449.8    1787 gpu_device.cc:2] Cannot dlopen some GPU libraries.\n"
            "I0000 00:00:1795726449.9    1787 cudart_stub.cc:31] Could not find cuda drivers on your machine\n"
            "E0000 00:00:1795726452.9    1787 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n")
    assert filtered(text, 1) == ("libfoo: a C library's own line\n"
                                 f"{PREAMBLE}\n"
                                 "W0000 00:00:1795726449.8    1787 gpu_device.cc:2] Cannot dlopen some GPU libraries.\n")
    assert filtered(text, 0) == text  # INFO asked for: all of it
    assert filtered(text.replace("Could not find cuda drivers", "Found a driver"), 2).endswith("(303)\n")
