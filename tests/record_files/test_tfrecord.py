"""Our hand-written Example serialization and TFRecord framing match TensorFlow's byte for byte."""

from __future__ import annotations

import pytest
import tensorflow as tf

from record_files.tfrecord import frame_record, serialize_example

FEATURES = {
    "image/encoded": b"\xff\xd8\xff\x00binary\x00",
    "image/class/label": 2,
    "image/class/text": "café 猫".encode("utf-8"),
    "image/height": 480,
    "image/width": 2**40,
    "neg": -3,
    "a/first": b"",
}


def _tf_example(features: dict) -> tf.train.Example:
    feature = {}
    for key, value in features.items():
        if isinstance(value, bytes):
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        else:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def test_serialized_example_equals_tensorflow_deterministic_serialization():
    ours = serialize_example(FEATURES)
    assert ours == _tf_example(FEATURES).SerializeToString(deterministic=True)
    assert tf.train.Example.FromString(ours) == _tf_example(FEATURES)


def test_framed_records_read_back_with_tensorflow_crc_checks(tmp_path):
    path = tmp_path / "x.tfrecord"
    records = [serialize_example({"i": i, "b": bytes([i]) * i}) for i in range(50)]
    path.write_bytes(b"".join(frame_record(r) for r in records))
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == records

    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    assert (tmp_path / "tf.tfrecord").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("value", [True, 1.5, [1], "text"])
def test_values_other_than_bytes_or_int_are_refused_by_name(value):
    serialize_example({"k": 1})  # an int entry of the same key is cached; a bool must not hit it
    with pytest.raises(TypeError, match="feature values must be bytes or int, got"):
        serialize_example({"k": value})
