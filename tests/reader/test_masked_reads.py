"""Reading a masked version's runs (issue #59, docs/update.md "Reading after 10 updates"): each run's first byte
is read from its file's ``.idx`` once, when the pipeline is built, not looked up again by every run's stream; in
evaluation a masked file is one input of the interleave, its live records in file order, as a fresh
conversion's file is.

What is pinned: evaluation's order against an independent computation from the manifest's runs (each file's
live records read by the Python frame reader, files interleaved as whole files are); the order of the buffer
order and a mixture's evaluation (a run an input, as before) and the training order (resume positions are
steps in it) against the reader as it was; that no masked record is read; that a truncated or missing masked
file is named. One real conversion and one real update (in this process, the in-memory runner) of small
generated class folders: a train shard loses three scattered records (four runs), the other one (two runs).
The masked frames are then overwritten with garbage, so a read of any of them fails. "Before" is the reader as
it was: every run's offset looked up in the graph (``records.read_segment`` without ``offset``;
``order.host_records_graph``, which mixtures still call).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import shutil

import pytest
import tensorflow as tf
from PIL import Image

import reader
import record_schema
from beam_jobs import pipeline as conversion
from beam_jobs import update
from beam_jobs.options import ConvertOptions
from reader import order, record_index
from reader.records import AUTOTUNE, SegmentReader, Source, file_order, interleave_records, read_segment
from reader.options import FeatureKeys
from record_files import idx, versions

FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _image(path: str, seed: int) -> None:
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (20, 16), tuple(rng.randrange(256) for _ in range(3))).save(path, quality=90)


def _path_of(raw: bytes) -> str:
    return tf.train.Example.FromString(raw).features.feature[record_schema.FILENAME].bytes_list.value[0].decode()


def _frames(index_path: str) -> list[tuple[int, int]]:
    with open(index_path) as handle:
        return [tuple(map(int, line.split())) for line in handle if line.strip()]


@pytest.fixture(scope="module")
def masked(tmp_path_factory) -> str:
    """OUT whose version 2 masks both train shards of version 1 (4 and 2 runs), their masked frames garbage."""
    root = tmp_path_factory.mktemp("masked-reads")
    src, out = str(root / "src"), str(root / "out")
    for cls in ("cat", "dog"):
        for i in range(16):
            _image(os.path.join(src, cls, f"{i}.jpg"), sum(map(ord, cls)) * 100 + i)
    options = ConvertOptions(src=src, out=out, val_fraction=0.25, shards=2)
    conversion.run(options, FAST, show_progress=False)
    train = reader.dataset_info(out).split("train")
    for shard, places in zip(train.shards, ((2, 5, 9), (4,))):
        with tf.io.gfile.GFile(shard.path, "rb") as handle:
            data = handle.read()
        for place in places:
            offset, size = _frames(shard.index_path)[place]
            os.remove(os.path.join(src, _path_of(data[offset + 12:offset + size - 4])))
    assert update.run(options, FAST).version == 2
    manifest = json.loads(open(os.path.join(out, versions.manifest_path(2))).read())
    runs = {shard["file"]: shard["live"] for shard in manifest["splits"]["train"]["shards"] if "live" in shard}
    assert sorted(len(live) for live in runs.values()) == [2, 4]
    for file, live in runs.items():  # every frame outside the runs: bytes no reader could parse
        kept = {first + k for first, count in live for k in range(count)}
        with open(os.path.join(out, file), "r+b") as handle:
            for record, (offset, size) in enumerate(_frames(os.path.join(out, file) + idx.SUFFIX)):
                if record not in kept:
                    handle.seek(offset)
                    handle.write(b"\xa5" * size)
    return out


def _live_paths(split) -> list[str]:
    """The split's records in its sequence (extent after extent), read by the Python reader (a seek each)."""
    from reader.frames import extent_records

    return [_path_of(raw) for s in split.shards for raw in extent_records(s.path, s.index_path, s.first,
                                                                          s.num_examples)]


def test_each_runs_first_byte_is_read_from_its_index_once(masked):
    split = reader.dataset_info(masked).split("train")
    assert split.masked and len(split.shards) >= 6
    offsets = record_index.extent_offsets(split.shards)
    assert offsets == [_frames(s.index_path)[s.first][0] for s in split.shards]
    # No sound index for a run: -1, and the reader looks it up itself (or reads through), as before.
    cut = split.shards[-1]
    assert record_index.run_offsets(["", "s3://bucket/a.idx", cut.index_path + ".gone"], [3, 3, 3]) == [-1] * 3
    assert record_index.run_offsets([cut.index_path], [0]) == [0]


def _manifest_files(out: str) -> list[list[str]]:
    """Each train file's live records (their image paths), in file order, from the manifest's runs alone: read
    with the Python frame reader at the offsets of the file's ``.idx`` (no code of the TensorFlow reader)."""
    from record_files.tfrecord import read_frames

    manifest = json.loads(open(os.path.join(out, versions.manifest_path(2))).read())  # the fixture's latest
    files = []
    for shard in manifest["splits"]["train"]["shards"]:
        path = os.path.join(out, shard["file"])
        frames = _frames(path + idx.SUFFIX)
        live = shard.get("live", [[0, len(frames)]])
        with open(path, "rb") as handle:
            data = handle.read()
        records = [data[frames[k][0]:frames[k][0] + frames[k][1]] for first, count in live
                   for k in range(first, first + count)]
        files.append([_path_of(frame.data) for frame in read_frames(io.BytesIO(b"".join(records)), path)])
    return files


def _interleaved(files: list[list[str]], cycle, block: int) -> list[str]:
    """``files`` interleaved as a fresh conversion's whole files are: tf.data's deterministic interleave."""
    rows = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(files))
    return [p.decode() for p in rows.interleave(
        tf.data.Dataset.from_tensor_slices, cycle_length=cycle if cycle is not None else AUTOTUNE,
        block_length=block, num_parallel_calls=AUTOTUNE, deterministic=True).as_numpy_iterator()]


@pytest.mark.parametrize(("cycle", "block"), [(None, 1), (3, 2), (1, 1)])
def test_evaluation_reads_each_masked_file_as_one_input_its_live_records_in_file_order(masked, cycle, block):
    info = reader.dataset_info(masked)
    split = info.split("train")
    expected = _interleaved(_manifest_files(masked), cycle, block)
    assert sorted(expected) == sorted(_live_paths(split)) and len(set(expected)) == len(expected)
    counts = [s.num_examples for s in split.shards]
    now = interleave_records(file_order(split.files, counts, extents=split.shards, join_runs=True), cycle, block,
                             deterministic=True)
    assert [_path_of(raw) for raw in now.as_numpy_iterator()] == expected
    if cycle == 3:  # the order it had (a run an input) is another here: this test tells them apart (AUTOTUNE's
        # cycle is the machine's; at cycle 1 both orders are file order)
        runs = interleave_records(file_order(split.files, counts, extents=split.shards), cycle, block,
                                  deterministic=True)
        assert [_path_of(raw) for raw in runs.as_numpy_iterator()] != expected
    evaluation = reader.build_dataset(info, "train", batch_size=4, image_size=16, training=False,
                                      options=reader.ReadOptions(cycle_length=cycle, block_length=block))
    labels = [int(label) for _, batch in evaluation for label in batch.numpy()]
    assert labels == [info.classes.index(path.split("/")[0]) for path in expected]


def test_evaluation_shares_masked_files_between_input_pipelines_as_whole_files(masked):
    """Two input pipelines: each reads its share of the files (every run of a file in one), counted right."""
    info = reader.dataset_info(masked)
    files = _manifest_files(masked)
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline)
        evaluation = reader.build_dataset(info, "train", batch_size=4, image_size=16, training=False,
                                          input_context=context)
        labels = [int(label) for _, batch in evaluation for label in batch.numpy()]
        assert labels == [info.classes.index(path.split("/")[0]) for path in _interleaved(files[pipeline::2], None, 1)]
    source = Source(info, info.split("train"), FeatureKeys(), 0, False)
    assert source.file_counts == [len(records) for records in files]


@pytest.mark.parametrize(("cycle", "block"), [(None, 1), (3, 2)])
def test_the_buffer_order_and_a_mixtures_evaluation_read_runs_in_the_order_they_had(masked, cycle, block):
    """Without ``join_runs`` (the buffer order; a mixture's evaluation) each run is still an input."""
    split = reader.dataset_info(masked).split("train")
    counts = [s.num_examples for s in split.shards]
    now = interleave_records(file_order(split.files, counts, extents=split.shards), cycle, block, deterministic=True)
    before = tf.data.Dataset.from_tensor_slices(
        (split.files, tf.constant(counts, tf.int64), [s.index_path for s in split.shards],
         tf.constant([s.first for s in split.shards], tf.int64))).interleave(
        lambda path, count, index, first: read_segment(path, index, first, count),
        cycle_length=cycle if cycle is not None else AUTOTUNE, block_length=block, num_parallel_calls=AUTOTUNE,
        deterministic=True)
    paths = [_path_of(raw) for raw in now.as_numpy_iterator()]
    assert paths == [_path_of(raw) for raw in before.as_numpy_iterator()]
    assert sorted(paths) == sorted(_live_paths(split)) and len(set(paths)) == len(paths)


def test_evaluation_seeks_with_the_offsets_it_was_built_with(masked, tmp_path):
    """Built, then every ``.idx`` gone: a lookup would read through the garbage before each run and fail."""
    info = reader.dataset_info(masked)
    split = info.split("train")
    expected = _interleaved(_manifest_files(masked), None, 1)
    evaluation = reader.build_dataset(info, "train", batch_size=4, image_size=16, training=False)
    moved = {}
    for shard in split.shards:
        if shard.index_path not in moved:
            moved[shard.index_path] = str(tmp_path / f"{len(moved)}.idx")
            os.rename(shard.index_path, moved[shard.index_path])
    try:
        labels = [int(label) for _, batch in evaluation for label in batch.numpy()]
    finally:
        for index_path, kept in moved.items():
            os.rename(kept, index_path)
    assert labels == [info.classes.index(path.split("/")[0]) for path in expected]


def test_a_truncated_or_missing_masked_file_is_named(masked, tmp_path):
    """One count check a file (against its live records) and one presence check still name the file."""
    split = reader.dataset_info(masked).split("train")
    runs = [s for s in split.shards if s.path == split.shards[0].path]
    assert len(runs) >= 2
    cut = str(tmp_path / "cut.tfrecord")
    shutil.copy(runs[0].path, cut)
    last = runs[-1]
    offset, size = _frames(last.index_path)[last.first + last.num_examples - 1]
    os.truncate(cut, offset)  # the last run loses its last record, at a record boundary
    live = sum(s.num_examples for s in runs)
    for path, message in ((cut, rf"cut\.tfrecord\W* is corrupt or truncated: read {live - 1} of the {live} records its "
                                "version reads"),
                          (str(tmp_path / "gone.tfrecord"), r"gone\.tfrecord\W* is listed in the manifest but does not exist")):
        extents = [dataclasses.replace(s, path=path) for s in runs]
        files = interleave_records(file_order([path] * len(runs), [s.num_examples for s in runs], extents=extents,
                                              join_runs=True))
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            list(files.as_numpy_iterator())


def test_the_training_order_and_its_resume_positions_are_the_ones_it_had(masked):
    split = reader.dataset_info(masked).split("train")
    counts, indexes, firsts = [s.num_examples for s in split.shards], [s.index_path for s in split.shards], \
        [s.first for s in split.shards]
    layout = order.stream_layout(split.num_examples, 2, streams=2, window=6)  # windows cross runs mid-run

    def now(step: int) -> list:
        return list(order.host_records(split.files, counts, indexes, layout, 5, tf.constant(step, tf.int64), 1, 1, 0,
                                       SegmentReader(), firsts).as_numpy_iterator())

    def before(step: int) -> list:  # the graph without offsets: every segment looks its start up
        return list(order.host_records_graph(SegmentReader())(
            tf.constant(split.files), tf.constant(counts, tf.int64), tf.constant(indexes), tf.constant(firsts, tf.int64),
            tf.constant([layout.num_records, layout.batch_size, layout.streams, layout.window], tf.int64),
            tf.constant(5, tf.int64), tf.constant(step, tf.int64), tf.constant(1, tf.int64), tf.constant(2, tf.int64),
            tf.constant(0, tf.int64)).as_numpy_iterator())

    whole = now(0)
    assert [(_path_of(raw), key) for raw, key in whole] == [(_path_of(raw), key) for raw, key in before(0)]
    paths = [_path_of(raw) for raw, _ in whole]  # an epoch: each live record once (G = 2: an odd one waits)
    assert len(set(paths)) == len(paths) == layout.steps_per_epoch * 2 and set(paths) <= set(_live_paths(split))
    resumed = now(3)  # a position at step 3: mid-window, mid-run
    assert [(_path_of(raw), key) for raw, key in resumed] == [(_path_of(raw), key) for raw, key in whole[6:]]
