"""The shard writer: a re-encoded image's spilled bytes copied (no second read of the source, no second encode), a
local file read again checked by its stamp instead of a second hash, classification Examples composed directly."""

from __future__ import annotations

import hashlib
import os
import random
import time

import pytest

import record_schema
from beam_jobs.options import EncodeOptions
from beam_jobs.planning.discover import display_path
from beam_jobs.stage_records import Accepted, ImageRef
from beam_jobs.stages import validate
from beam_jobs.stages.encode import Encoded
from beam_jobs.stages.validate import validate_chunk
from beam_jobs.stages.write import (CLASSIFICATION_KEYS, SourceChangedError, build_example, encode_accepted,
                                    write_shard)
from record_files.tfrecord import ByteStrings, Floats, Ints, serialize_example
from tests.conftest import read_records


def test_reencoded_images_are_written_from_the_spill_without_reading_the_source_again(tmp_path, sample_images):
    src, work, out = tmp_path / "src", tmp_path / "work", tmp_path / "out"
    for folder in (src / "a", work, out):
        folder.mkdir(parents=True)
    (src / "a" / "p.png").write_bytes(sample_images["png_rgb"])
    (src / "a" / "j.jpg").write_bytes(sample_images["jpeg_rgb"])
    refs = [ImageRef("train", "a/j.jpg", 0), ImageRef("train", "a/p.png", 0)]
    results = [checked.item for checked in validate_chunk(str(src), refs, EncodeOptions(), str(work), chunk=7)]
    assert all(isinstance(r, Accepted) for r in results)
    passthrough, png = results
    assert passthrough.spill == () and png.spill[:2] == (7, 0)
    (src / "a" / "p.png").unlink()  # the writer must not need the source of a re-encoded image
    result = write_shard(str(src), str(out), "train", 0, 1, results, ["a"], EncodeOptions(), work=str(work))
    rows = read_records(str(out / result.file))
    assert [r["image/filename"] for r in rows] == [b"a/j.jpg", b"a/p.png"]
    spilled = (work / "spill-000000000007.jpeg-bytes").read_bytes()
    assert rows[1]["image/encoded"] == spilled and hashlib.sha256(spilled).hexdigest().encode() == rows[1]["image/key/sha256"]
    assert rows[0]["image/encoded"] == sample_images["jpeg_rgb"]


def test_a_classification_example_composed_directly_is_serialize_examples_bytes():
    """build_example writes the bytes serialize_example would (itself pinned against TensorFlow), at every length
    where a varint grows a byte, and its keys in serialize_example's (sorted) order."""
    assert list(CLASSIFICATION_KEYS) == sorted(CLASSIFICATION_KEYS)
    rng = random.Random(3)
    for size in (0, 1, 100, 127, 128, 16_383, 16_384, 16_500, 2**21 - 60, 2**21 + 5):
        for label, name, relpath in ((0, "cats", "cats/1.jpg"), (127, "dögs", "ünï/" + "x" * 300 + ".jpg"),
                                     (128, "", "caf\udce9/x.jpg"), (2**31, "n" * 200, "a.jpg")):
            encoded = Encoded(rng.randbytes(size), rng.choice((1, 127, 128, 70_000)), rng.choice((1, 300, 2**20)),
                              "jpeg", channels=rng.choice((1, 3)))
            for sha in (None, "ab" * 32):
                expected = serialize_example({
                    record_schema.IMAGE_ENCODED: encoded.data, record_schema.IMAGE_FORMAT: b"jpeg",
                    record_schema.HEIGHT: encoded.height, record_schema.WIDTH: encoded.width,
                    record_schema.CHANNELS: encoded.channels,
                    record_schema.FILENAME: display_path(relpath).encode("utf-8"),
                    record_schema.SHA256: (sha or hashlib.sha256(encoded.data).hexdigest()).encode("ascii"),
                    record_schema.LABEL: label, record_schema.LABEL_TEXT: name.encode("utf-8")})
                assert build_example(encoded, relpath, label, name, sha) == expected, (size, label, relpath)


def test_a_record_of_boxes_composed_directly_is_serialize_examples_bytes():
    """build_object_example composes a record of boxes alone (no masks, keypoints or captions) directly: the bytes
    serialize_example gives for its features (pinned against TensorFlow), with 0, 1 and 200 boxes, class ids and
    flags past one varint byte, names and sizes whose varints grow, in serialize_example's (sorted) key order."""
    from beam_jobs import annotations
    from beam_jobs.stages.write import OBJECT_KEYS, build_object_example

    assert list(OBJECT_KEYS) == sorted(OBJECT_KEYS)
    rng = random.Random(5)
    classes = [f"c{i}" if i != 200 else "dög" * 50 for i in range(300)]
    for count in (0, 1, 5, 200):
        for size in (0, 127, 128, 20_000):
            boxes = tuple(annotations.Box(f"annotation {i}", rng.choice((0, 1, 127, 128, 200, 299)),
                                          rng.random() / 2, rng.random() / 2, 0.5 + rng.random() / 2,
                                          0.5 + rng.random() / 2, rng.random(), crowd=rng.random() < 0.3,
                                          difficult=rng.random() < 0.3, truncated=rng.random() < 0.3)
                          for i in range(count))
            objects = annotations.Objects(rng.choice(("17", "", "ünï" * 60)), boxes, (640, 480))
            encoded = Encoded(rng.randbytes(size), 480, 640, "jpeg", channels=rng.choice((1, 3)))
            expected = serialize_example({
                record_schema.IMAGE_ENCODED: encoded.data, record_schema.IMAGE_FORMAT: b"jpeg",
                record_schema.HEIGHT: 480, record_schema.WIDTH: 640, record_schema.CHANNELS: encoded.channels,
                record_schema.FILENAME: b"a/1.jpg", record_schema.SHA256: ("ab" * 32).encode("ascii"),
                record_schema.SOURCE_ID: objects.source_id.encode("utf-8"),
                record_schema.BBOX_XMIN: Floats(box.xmin for box in boxes),
                record_schema.BBOX_YMIN: Floats(box.ymin for box in boxes),
                record_schema.BBOX_XMAX: Floats(box.xmax for box in boxes),
                record_schema.BBOX_YMAX: Floats(box.ymax for box in boxes),
                record_schema.OBJECT_LABEL: Ints(box.label for box in boxes),
                record_schema.OBJECT_TEXT: ByteStrings(classes[box.label].encode("utf-8") for box in boxes),
                record_schema.OBJECT_AREA: Floats(box.area * 640 * 480 for box in boxes),
                record_schema.OBJECT_IS_CROWD: Ints(int(box.crowd) for box in boxes),
                record_schema.OBJECT_DIFFICULT: Ints(int(box.difficult) for box in boxes),
                record_schema.OBJECT_TRUNCATED: Ints(int(box.truncated) for box in boxes)})
            assert build_object_example(encoded, "a/1.jpg", objects, classes, "ab" * 32) == expected, (count, size)


def _validated(tmp_path, data: bytes) -> tuple[str, Accepted]:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "j.jpg").write_bytes(data)
    (checked,) = validate_chunk(str(src), [ImageRef("train", "a/j.jpg", 0)], EncodeOptions(), str(tmp_path), chunk=0)
    assert isinstance(checked.item, Accepted) and checked.objects is None  # no annotation: no objects' tally
    return str(src), checked.item


def test_a_local_file_read_again_with_its_validated_stamp_is_not_hashed_again(tmp_path, sample_images, monkeypatch):
    monkeypatch.setattr(validate, "RACY_NS", 0)  # the file was just written: no wait for the racy-time rule
    src, item = _validated(tmp_path, sample_images["jpeg_rgb"])
    assert len(item.stamp) == validate.STAMP_BYTES
    # The stamp is what the writer trusts: the bytes of a file whose stamp is the validated one are not hashed
    # again (here a hash that does not match would have stopped it).
    trusted = item._replace(source_sha256=bytes(32))
    encoded = encode_accepted(src, trusted, EncodeOptions())
    assert encoded.data == sample_images["jpeg_rgb"]
    without = item._replace(source_sha256=bytes(32), stamp=b"")  # no stamp (an old record): hashed, refused
    with pytest.raises(SourceChangedError, match="changed during the conversion"):
        encode_accepted(src, without, EncodeOptions())


def test_a_local_file_changed_after_validation_is_refused_even_with_its_size_and_mtime_put_back(
        tmp_path, sample_images, monkeypatch):
    monkeypatch.setattr(validate, "RACY_NS", 0)
    data = sample_images["jpeg_rgb"]
    src, item = _validated(tmp_path, data)
    path = os.path.join(src, "a", "j.jpg")
    before = os.stat(path)
    time.sleep(0.02)  # past the file system's clock tick
    changed = data[:-3] + bytes(b ^ 0xFF for b in data[-3:-2]) + data[-2:]
    with open(path, "r+b") as handle:  # the same inode, the same size
        handle.write(changed)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the mtime put back: the ctime still moved
    with pytest.raises(SourceChangedError, match="a/j.jpg changed during the conversion"):
        encode_accepted(src, item, EncodeOptions())
    os.remove(path)  # replaced by a new file of the very bytes validated: another inode, so hashed, and written
    with open(path, "wb") as handle:
        handle.write(data)
    assert encode_accepted(src, item, EncodeOptions()).data == data


def test_a_file_changed_within_the_racy_time_of_its_read_gets_no_stamp(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    stat = os.stat(path)
    assert validate.file_stamp(stat, stat.st_ctime_ns + validate.RACY_NS - 1) == b""
    old_enough = validate.file_stamp(stat, stat.st_ctime_ns + validate.RACY_NS)
    assert len(old_enough) == validate.STAMP_BYTES
    assert validate.file_stamp(stat, stat.st_ctime_ns + 10 * validate.RACY_NS) == old_enough
