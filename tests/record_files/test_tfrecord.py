"""Our hand-written Example serialization and TFRecord framing match TensorFlow's byte for byte."""

from __future__ import annotations

import pytest
import tensorflow as tf

import record_schema
from record_files.tfrecord import ByteStrings, Floats, Ints, frame_record, serialize_example

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
    with pytest.raises(TypeError, match="feature values must be bytes, int, Floats, Ints or ByteStrings, got"):
        serialize_example({"k": value})


def _tf_feature(value) -> tf.train.Feature:
    if isinstance(value, Floats):
        return tf.train.Feature(float_list=tf.train.FloatList(value=list(value)))
    if isinstance(value, Ints):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(value)))
    if isinstance(value, ByteStrings):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(value)))
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


@pytest.mark.parametrize("objects", [0, 1, 3])
def test_an_object_records_lists_match_tensorflows_bytes_empty_ones_too(objects):
    """Model Garden's keys, each list with an entry per object (none for an image without objects)."""
    values = {"bytes": b"v", "int64": 5, "float_list": Floats([0.1, 0.5, 0.999][:objects]),
              "int64_list": Ints([1, 90, 300][:objects]), "bytes_list": ByteStrings([b"person", b"", b"dog"][:objects])}
    features = {key: values[kind] for key, kind in record_schema.OBJECT_FEATURES.items()}
    expected = tf.train.Example(features=tf.train.Features(feature={k: _tf_feature(v) for k, v in features.items()}))
    assert serialize_example(features) == expected.SerializeToString(deterministic=True)
