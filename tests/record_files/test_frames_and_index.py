"""Reading TFRecord frames and record indexes: the one reader every tool uses, against TensorFlow's own files."""

from __future__ import annotations

import io

import pytest
import tensorflow as tf

from record_files import idx
from record_files.tfrecord import FrameError, first_record, frame_record, read_frames

RECORDS = [bytes([i]) * (i * 37) for i in range(12)]


@pytest.fixture()
def tf_file(tmp_path) -> bytes:
    """Twelve records written by TensorFlow's own writer (record 0 is empty)."""
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in RECORDS:
            writer.write(record)
    return open(path, "rb").read()


class _Trickle(io.RawIOBase):
    """A stream whose reads return at most 5 bytes, as a network body may."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def read(self, size: int = -1) -> bytes:
        size = 5 if size < 0 else min(size, 5)
        out = self._data[self._pos:self._pos + size]
        self._pos += len(out)
        return out


def test_frames_of_a_tensorflow_file_with_their_offsets(tf_file):
    frames = list(read_frames(io.BytesIO(tf_file)))
    assert [f.data for f in frames] == RECORDS
    assert frames[0].offset == 0 and all(a.offset + a.size == b.offset for a, b in zip(frames, frames[1:]))
    assert frames[-1].offset + frames[-1].size == len(tf_file)
    assert [f.data for f in read_frames(_Trickle(tf_file))] == RECORDS  # short reads are not the end
    assert b"".join(frame_record(r) for r in RECORDS) == tf_file


@pytest.mark.parametrize(("damage", "reason", "record"), [
    (lambda b: b[:-1], "truncated record data", 11),
    (lambda b: b[:len(frame_record(RECORDS[0])) + 5], "truncated record header", 1),
    (lambda b: b[:3] + b"\x01" + b[4:], "length CRC mismatch", 0),
    (lambda b: b[:-6] + bytes([b[-6] ^ 1]) + b[-5:], "data CRC mismatch", 11),
])
def test_a_damaged_frame_is_named_with_its_file_and_record(tf_file, damage, reason, record):
    with pytest.raises(FrameError, match=f"shard.tfrecord record {record}: {reason}") as caught:
        list(read_frames(io.BytesIO(damage(tf_file)), "shard.tfrecord"))
    assert caught.value.record == record


def test_first_record(tf_file):
    assert first_record(io.BytesIO(frame_record(b"abc") + tf_file)) == b"abc"
    assert first_record(io.BytesIO(b"")) is None


def test_an_index_is_the_frames_offsets_and_sizes(tf_file):
    text = idx.index_text((f.offset, f.size) for f in read_frames(io.BytesIO(tf_file))).encode()
    assert text.startswith(b"0 16\n16 53\n")
    assert idx.is_complete(text, len(RECORDS), len(tf_file))
    assert not idx.is_complete(text, len(RECORDS) + 1, len(tf_file))
    assert not idx.is_complete(text[:-1], len(RECORDS), len(tf_file))
    frames = list(read_frames(io.BytesIO(tf_file)))
    assert [idx.offset_of(text, i) for i in range(len(RECORDS))] == [f.offset for f in frames]
    assert idx.plausible_size(len(text), len(RECORDS)) and not idx.plausible_size(len(text), 1000)
    assert idx.index_filename("a/train-00000-of-00001.tfrecord") == "a/train-00000-of-00001.tfrecord.idx"


@pytest.mark.parametrize(("text", "record"), [
    (b"0 16\n16 53\n", 2),  # too short
    (b"0 16\n17 53\n70 90\n", 2),  # does not chain
    (b"1 16\n17 53\n", 1),  # does not start at 0
    (b"0 16\nx 53\n", 1),  # garbage
    (b"0 1234567890123456789\n", 0 + 1),  # past int64's 18 digits: the graph could not read it
])
def test_an_index_that_does_not_reach_a_record_soundly_gives_no_offset(text, record):
    assert idx.offset_of(text, record) is None
    # The offsets read in one pass (a masked file's runs) stop where offset_of stops answering.
    assert len(idx.sound_offsets(text)) <= record
    assert idx.sound_offsets(text) == [idx.offset_of(text, r) for r in range(len(idx.sound_offsets(text)))]


def test_sound_offsets_are_offset_of_for_every_record(tf_file):
    text = idx.index_text((f.offset, f.size) for f in read_frames(io.BytesIO(tf_file))).encode()
    assert idx.sound_offsets(text) == [idx.offset_of(text, i) for i in range(len(RECORDS))]
    assert idx.sound_offsets(text, 3) == idx.sound_offsets(text)[:3]


def test_the_graph_pattern_is_the_python_one():
    import re

    for line in (b"0 16", b"123456789012345678 1", b"1234567890123456789 1", b"-1 2", b"1  2"):
        graph = bool(tf.strings.regex_full_match(line, idx.LINE_PATTERN))
        assert graph == bool(re.fullmatch(idx.LINE_PATTERN.encode(), line))
