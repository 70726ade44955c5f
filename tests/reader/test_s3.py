"""Training, verifying and inspecting a dataset in S3, against a real S3 server on loopback (moto's).

TensorFlow 2.21 has no ``s3://`` file system, so the reader streams S3 shards
itself (``reader.storage``); everything a user does with a local dataset must
give the same records from the same dataset in S3, and the same errors.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tensorflow as tf

import reader
from tests.conftest import REPO, run_converter

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server


@pytest.fixture(scope="module")
def s3_env(s3_server):
    """boto3's standard environment variables, set for this process as a user sets them."""
    saved = {key: os.environ.get(key) for key in s3_server.env}
    os.environ.update(s3_server.env)
    yield s3_server.env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture()
def s3_dataset(demo_dataset, s3_server, s3_env):
    bucket = s3_server.new_bucket()
    return s3_server.upload(demo_dataset, bucket, "shapes-tfrecords"), bucket


def _batches(dataset, count=None):
    out = []
    for images, labels in dataset.take(count) if count else dataset:
        out.append((images.numpy().tobytes(), labels.numpy().tolist()))
    return out


def test_s3_shards_give_the_same_batches_as_local_ones(demo_dataset, s3_dataset):
    url, _ = s3_dataset
    assert reader.dataset_info(url).split("train").num_examples == reader.dataset_info(demo_dataset).split(
        "train").num_examples
    for split, training in (("validation", False), ("train", True)):
        kwargs = dict(split=split, batch_size=8, image_size=64, training=training, seed=3, num_epochs=1)
        assert _batches(reader.build_dataset(url, **kwargs)) == _batches(reader.build_dataset(demo_dataset, **kwargs))
    # Resuming mid-epoch seeks into S3 shards with their record indexes (ranged GETs).
    resumed = dict(split="train", batch_size=8, image_size=64, seed=3, start=5, num_epochs=1)
    assert _batches(reader.build_dataset(url, **resumed)) == _batches(reader.build_dataset(demo_dataset, **resumed))


def test_a_missing_s3_shard_fails_at_build_and_in_flight_naming_it(s3_dataset, s3_server, capfd):
    url, bucket = s3_dataset
    info = reader.dataset_info(url)
    victim = info.split("train").shards[1].path
    dataset = reader.build_dataset(url, "train", batch_size=8, image_size=64, training=False)
    s3_server.client().delete_object(Bucket=bucket, Key=victim[len(f"s3://{bucket}/"):])
    with pytest.raises(tf.errors.OpError, match=os.path.basename(victim)):
        _batches(dataset)  # built before the shard vanished: the read names it
    with pytest.raises(FileNotFoundError, match=os.path.basename(victim)):
        reader.build_dataset(url, "train", batch_size=8, image_size=64)
    kept = _batches(reader.build_dataset(url, "train", batch_size=1, image_size=64, training=False,
                                         skip_corrupt=True))
    assert len(kept) == info.split("train").num_examples - info.split("train").shards[1].num_examples


def _cli(*args, env):
    return run_converter(*args, env=env)


def test_verify_and_inspect_work_on_a_dataset_in_s3(s3_dataset, s3_server, s3_env):
    url, bucket = s3_dataset
    proc = _cli("verify", url, env=s3_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _cli("inspect", url, env=s3_env)
    assert proc.returncode == 0 and "circle" in proc.stdout, proc.stdout + proc.stderr
    shard = reader.dataset_info(url).split("train").shards[0].path
    key = shard[len(f"s3://{bucket}/"):]
    client = s3_server.client()
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=data[: len(data) // 2])
    proc = _cli("verify", url, env=s3_env)
    assert proc.returncode == 1 and os.path.basename(shard) in proc.stdout, proc.stdout + proc.stderr


def test_verify_and_inspect_take_the_converters_s3_flags(s3_dataset, s3_server):
    url, _ = s3_dataset
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}  # flags only
    for command in ("verify", "inspect"):
        proc = subprocess.run([sys.executable, "-m", "converter", command, url, *s3_server.flags],
                              capture_output=True, text=True, timeout=300, cwd=REPO, env={**env, "PYTHONPATH": REPO})
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_s3_copy_without_or_with_damaged_indexes_resumes_the_same_and_reindex_puts_them_back(
        demo_dataset, s3_dataset, s3_server, s3_env, caplog):
    url, bucket = s3_dataset
    client, shards = s3_server.client(), reader.dataset_info(url).split("train").shards
    keys = [shard.index_path[len(f"s3://{bucket}/"):] for shard in shards]
    originals = {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}
    client.delete_object(Bucket=bucket, Key=keys[0])  # as `aws s3 sync --exclude '*.idx'` leaves it
    client.put_object(Bucket=bucket, Key=keys[1], Body=b"garbage")
    resumed = dict(split="train", batch_size=8, image_size=64, seed=3, start=5, num_epochs=1)
    assert _batches(reader.build_dataset(url, **resumed)) == _batches(reader.build_dataset(demo_dataset, **resumed))
    assert "2 of its 4 shards have no usable record index (1 missing, 1 damaged" in caplog.text
    proc = _cli("reindex", url, env=s3_env)
    assert proc.returncode == 0 and proc.stdout.startswith("rebuilt 2 record indexes, "), proc.stdout
    assert {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys} == originals


def test_the_report_of_a_dataset_in_s3_reads_its_records_tables_and_ranges_of_its_shards(demo_dataset, s3_dataset,
                                                                                      tmp_path):
    """The records tables fetched, the drawn records read by ranged requests: the local dataset's figures."""
    import json

    from reader.tools import report

    url, _ = s3_dataset
    figures = {}
    for name, where in (("s3", url), ("local", demo_dataset)):
        (tmp_path / name).mkdir()
        paths = report.write_report(where, str(tmp_path / name))
        figures[name] = json.loads(open(paths.json).read())
    assert figures["s3"]["figures_from"] == "records tables"
    for section in ("classes", "images", "contact-sheets", "duplicates"):
        assert figures["s3"][section] == figures["local"][section], section
