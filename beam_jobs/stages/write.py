"""Stage 5: write one shard: read its images in order, encode, frame, stream to a file.

In:  the shard's records in order (``Accepted``, streamed from its slices, see
     :mod:`beam_jobs.stages.order_bucket`), and each image's bytes (the source file,
     or its spilled re-encoding).
Out: the shard file in staging and a :class:`ShardResult` (its manifest entry); with ``table``, the shard's
     rows of its split's records table and the shard's figures in its footer (:class:`ShardRows`,
     :mod:`record_files.records_table`), which :mod:`beam_jobs.stages.join_tables` joins per split.

A shard holds one image in memory at a time. The file is written into the
run's private staging folder under its final name; nothing in OUT changes
until :mod:`beam_jobs.files.publish` commits the whole dataset. A runner that retries
the writer rewrites the same bytes, because every step is deterministic.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
from apache_beam.io.filesystem import CompressionTypes

import record_schema
from beam_jobs import annotations, masks, placed_codec
from beam_jobs.files import filesystems
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import EncodeOptions
from beam_jobs.planning.discover import display_path
from beam_jobs.sources.archives.member_reads import MemberReader
from beam_jobs.stage_records import Accepted
from beam_jobs.stages.encode import Encoded, encode_image
from beam_jobs.stages.validate import read_source, read_spilled, read_stamped
from record_files import idx, records_table
from record_files.record_stats import ObjectValues, SplitStats
from record_files.tfrecord import (ByteStrings, Floats, Ints, bytes_entry_head, example_of_entries, frame_parts,
                                   list_entry, repeated_entry, serialize_example)


class SourceChangedError(RuntimeError):
    """An input file changed between validation and writing."""


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What was written to one shard; becomes a manifest entry."""

    split: str
    index: int
    num_shards: int
    file: str
    num_examples: int
    num_bytes: int
    sha256: str
    label_counts: dict[int, int]  # records per label; in an object dataset, objects per class id
    reencoded: dict[str, int]
    max_side: int = 0  # the longest side of any stored image (readers skip reduced-scale decoding below 2x their size)
    grayscale: int = 0  # records whose JPEG has one channel (image/channels = 1)
    small: int = 0  # records whose shorter side is under record_schema.SMALL_SIDE
    dali_index: str = ""  # the shard's record index file (DALI's format)
    index_bytes: int = 0  # its size: a reader checks a copied dataset's indexes against it from one listing

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ShardResult":
        raw = json.loads(text)
        raw["label_counts"] = {int(k): v for k, v in raw["label_counts"].items()}
        return cls(**raw)


def build_example(
    encoded: Encoded, relpath: str, label: int, class_name: str, sha256_hex: Optional[str] = None
) -> bytes:
    """The serialized ``tf.train.Example`` of one stored image of a classification dataset (keys in record_schema).

    ``sha256_hex`` of ``encoded.data`` may be passed when already known. The bytes are
    :func:`record_files.tfrecord.serialize_example`'s for the same features (a test pins it), composed
    directly: the map entries of the image, its name and its hash get their few header bytes computed,
    and every other entry (label, label text, size, channels, format) takes few distinct values and is
    serialized once per process. No dict, sort or list of parts per record: about half of
    ``serialize_example``'s CPU on a 33 KB photo (6 against 11 us).
    """
    data = encoded.data
    name = display_path(relpath).encode("utf-8")
    sha = (sha256_hex or hashlib.sha256(data).hexdigest()).encode("ascii")
    return example_of_entries((  # the entries in key order (CLASSIFICATION_KEYS), as serialize_example sorts them
        repeated_entry(record_schema.CHANNELS, encoded.channels),
        repeated_entry(record_schema.LABEL, label),
        repeated_entry(record_schema.LABEL_TEXT, class_name.encode("utf-8")),
        bytes_entry_head(record_schema.IMAGE_ENCODED, len(data)), data,
        bytes_entry_head(record_schema.FILENAME, len(name)), name,
        repeated_entry(record_schema.IMAGE_FORMAT, record_schema.IMAGE_FORMAT_JPEG),
        repeated_entry(record_schema.HEIGHT, encoded.height),
        bytes_entry_head(record_schema.SHA256, len(sha)), sha,
        repeated_entry(record_schema.WIDTH, encoded.width),
    ))


# The keys of a classification record in the order build_example writes them: sorted, as serialize_example
# writes map entries (tests/beam_jobs/stages/test_write.py checks both).
CLASSIFICATION_KEYS = (record_schema.CHANNELS, record_schema.LABEL, record_schema.LABEL_TEXT,
                       record_schema.IMAGE_ENCODED, record_schema.FILENAME, record_schema.IMAGE_FORMAT,
                       record_schema.HEIGHT, record_schema.SHA256, record_schema.WIDTH)


def build_multilabel_example(encoded: Encoded, relpath: str, ids: Sequence[int], classes: Sequence[str],
                             sha256_hex: Optional[str] = None) -> bytes:
    """The serialized ``tf.train.Example`` of an image of several labels: ``image/class/label`` an int64 list
    (Model Garden's classification input reads it so with ``is_multilabel``), ``image/class/text`` theirs."""
    return serialize_example(
        {
            **_image_features(encoded, relpath, sha256_hex),
            record_schema.LABEL: Ints(ids),
            record_schema.LABEL_TEXT: ByteStrings(classes[i].encode("utf-8") for i in ids),
        }
    )


def build_object_example(encoded: Encoded, relpath: str, objects: annotations.Objects, classes: Sequence[str],
                         sha256_hex: Optional[str] = None, class_mask: bytes = b"") -> bytes:
    """The serialized ``tf.train.Example`` of an image and its placed objects, in Model Garden's layout.

    ``objects``: placed by :func:`beam_jobs.annotations.place` (normalized to the stored image, upright);
    ``classes[i]`` is the text of class id i. Areas are written in pixels of the stored image.
    ``class_mask``: the image's semantic mask file's bytes, when it has one.
    """
    boxes = objects.boxes
    pixels = encoded.width * encoded.height
    if not (objects.masks or objects.class_mask or objects.keypoints or objects.captions):
        return _boxes_example(encoded, relpath, objects, classes, sha256_hex)
    return serialize_example(
        {
            **_image_features(encoded, relpath, sha256_hex),
            record_schema.SOURCE_ID: objects.source_id.encode("utf-8"),
            record_schema.BBOX_XMIN: Floats(box.xmin for box in boxes),
            record_schema.BBOX_YMIN: Floats(box.ymin for box in boxes),
            record_schema.BBOX_XMAX: Floats(box.xmax for box in boxes),
            record_schema.BBOX_YMAX: Floats(box.ymax for box in boxes),
            record_schema.OBJECT_LABEL: Ints(box.label for box in boxes),
            record_schema.OBJECT_TEXT: ByteStrings(classes[box.label].encode("utf-8") for box in boxes),
            record_schema.OBJECT_AREA: Floats(box.area * pixels for box in boxes),
            record_schema.OBJECT_IS_CROWD: Ints(int(box.crowd) for box in boxes),
            record_schema.OBJECT_DIFFICULT: Ints(int(box.difficult) for box in boxes),
            record_schema.OBJECT_TRUNCATED: Ints(int(box.truncated) for box in boxes),
            **({record_schema.OBJECT_MASK: ByteStrings(
                masks.mask_png(box.mask, objects.mask_frame, objects.mask_turn, (encoded.width, encoded.height),
                               box.crowd) for box in boxes)} if objects.masks else {}),
            **({record_schema.SEGMENTATION_ENCODED: masks.class_mask_png(
                class_mask, objects.orientation, (encoded.width, encoded.height), display_path(objects.class_mask[0]),
                *objects.class_mask[2:]),
                record_schema.SEGMENTATION_FORMAT: b"png"} if objects.class_mask else {}),
            **(_keypoint_features(boxes) if objects.keypoints else {}),
            **({record_schema.CAPTION: ByteStrings(text.encode("utf-8") for text in objects.captions)}
               if objects.captions else {}),
        }
    )


def _boxes_example(encoded: Encoded, relpath: str, objects: annotations.Objects, classes: Sequence[str],
                   sha256_hex: Optional[str]) -> bytes:
    """:func:`build_object_example`'s bytes for objects of boxes alone (no masks, keypoints or captions: COCO's
    and VOC's boxes), composed directly as :func:`build_example` composes a classification record: the entries
    in key order (:data:`OBJECT_KEYS`), the repeating ones serialized once a process, each per-object list built
    whole. About half of ``serialize_example``'s CPU (#57 §6; a test pins the bytes equal)."""
    boxes, data = objects.boxes, encoded.data
    name = display_path(relpath).encode("utf-8")
    sha = (sha256_hex or hashlib.sha256(data).hexdigest()).encode("ascii")
    source_id = objects.source_id.encode("utf-8")
    pixels = encoded.width * encoded.height
    flags = [int(box.crowd) for box in boxes], [int(box.difficult) for box in boxes], \
        [int(box.truncated) for box in boxes]
    return example_of_entries((  # in key order (OBJECT_KEYS), as serialize_example sorts them
        repeated_entry(record_schema.CHANNELS, encoded.channels),
        bytes_entry_head(record_schema.IMAGE_ENCODED, len(data)), data,
        bytes_entry_head(record_schema.FILENAME, len(name)), name,
        repeated_entry(record_schema.IMAGE_FORMAT, record_schema.IMAGE_FORMAT_JPEG),
        repeated_entry(record_schema.HEIGHT, encoded.height),
        bytes_entry_head(record_schema.SHA256, len(sha)), sha,
        list_entry(record_schema.OBJECT_AREA, Floats([box.area * pixels for box in boxes])),
        list_entry(record_schema.BBOX_XMAX, Floats([box.xmax for box in boxes])),
        list_entry(record_schema.BBOX_XMIN, Floats([box.xmin for box in boxes])),
        list_entry(record_schema.BBOX_YMAX, Floats([box.ymax for box in boxes])),
        list_entry(record_schema.BBOX_YMIN, Floats([box.ymin for box in boxes])),
        list_entry(record_schema.OBJECT_LABEL, Ints([box.label for box in boxes])),
        list_entry(record_schema.OBJECT_TEXT, ByteStrings([classes[box.label].encode("utf-8") for box in boxes])),
        list_entry(record_schema.OBJECT_DIFFICULT, Ints(flags[1])),
        list_entry(record_schema.OBJECT_IS_CROWD, Ints(flags[0])),
        list_entry(record_schema.OBJECT_TRUNCATED, Ints(flags[2])),
        bytes_entry_head(record_schema.SOURCE_ID, len(source_id)), source_id,
        repeated_entry(record_schema.WIDTH, encoded.width),
    ))


# The keys of a record of boxes in the order _boxes_example writes them: sorted (tests/beam_jobs/stages/test_write.py).
OBJECT_KEYS = (record_schema.CHANNELS, record_schema.IMAGE_ENCODED, record_schema.FILENAME, record_schema.IMAGE_FORMAT,
               record_schema.HEIGHT, record_schema.SHA256, record_schema.OBJECT_AREA, record_schema.BBOX_XMAX,
               record_schema.BBOX_XMIN, record_schema.BBOX_YMAX, record_schema.BBOX_YMIN, record_schema.OBJECT_LABEL,
               record_schema.OBJECT_TEXT, record_schema.OBJECT_DIFFICULT, record_schema.OBJECT_IS_CROWD,
               record_schema.OBJECT_TRUNCATED, record_schema.SOURCE_ID, record_schema.WIDTH)


def _keypoint_features(boxes: Sequence[annotations.Box]) -> dict:
    """Each object's placed keypoints (``x, y, visibility`` each point) in the TF Object Detection API's keys."""
    return {record_schema.KEYPOINT_X: Floats(v for box in boxes for v in box.keypoints[0::3]),
            record_schema.KEYPOINT_Y: Floats(v for box in boxes for v in box.keypoints[1::3]),
            record_schema.KEYPOINT_VISIBILITY: Ints(int(v) for box in boxes for v in box.keypoints[2::3]),
            record_schema.KEYPOINT_NUM: Ints(sum(1 for v in box.keypoints[2::3] if v) for box in boxes)}


def _image_features(encoded: Encoded, relpath: str, sha256_hex: Optional[str]) -> dict:
    """The features every record has: the image, its size and name."""
    return {
        record_schema.IMAGE_ENCODED: encoded.data,
        record_schema.IMAGE_FORMAT: record_schema.IMAGE_FORMAT_JPEG,
        record_schema.HEIGHT: encoded.height,
        record_schema.WIDTH: encoded.width,
        record_schema.CHANNELS: encoded.channels,
        record_schema.FILENAME: display_path(relpath).encode("utf-8"),
        record_schema.SHA256: (sha256_hex or hashlib.sha256(encoded.data).hexdigest()).encode("ascii"),
    }


def encode_accepted(src: str, item: Accepted, options: EncodeOptions, work: str = "",
                    members: Optional[MemberReader] = None) -> Encoded:
    """The stored bytes of an accepted image: its spilled re-encoding, or the source re-read.

    ``members``: the shard's reader of archive members (each archive opened once).

    Raises:
      SourceChangedError: a pass-through file changed or vanished since it was
        validated; writing it now would break the manifest's accounting. A change is
        told by the file's SHA-256, or, for a local file, by its stamp where both reads
        have one (:func:`beam_jobs.stages.validate.file_stamp`: the ctime the kernel moves on
        every change), which saves hashing each image twice.
    """
    relpath = item.ref.relpath
    if item.spill and item.reencoded_because:
        # Encoded once, by validation (see beam_jobs.stages.validate): copy, never decode again.
        return Encoded(read_spilled(work, item), item.height, item.width, "", item.reencoded_because)
    if item.spill:  # stored as it is, kept by validation (a Parquet row): the very bytes validated
        data = read_spilled(work, item)
        if hashlib.sha256(data).digest() != item.source_sha256:
            raise SourceChangedError(f"{display_path(relpath)}: its bytes kept by validation changed; rerun the command")
        return Encoded(data, item.height, item.width, "jpeg", channels=item.channels)
    try:
        data, stamp = read_stamped(src, relpath, item.ref.source, work, members)
    except (OSError, ValueError) as err:  # ValueError: an archive member no longer what its archive declared
        raise SourceChangedError(f"{display_path(relpath)} vanished during the conversion ({err}); rerun the command") from err
    # A local file whose stamp is the one validation read holds the bytes validation hashed: no second hash.
    if not (stamp and stamp == item.stamp) and hashlib.sha256(data).digest() != item.source_sha256:
        raise SourceChangedError(f"{display_path(relpath)} changed during the conversion; rerun the command")
    if not item.reencoded_because:
        # Validated as storable byte for byte, and these are the very bytes validated.
        return Encoded(data, item.height, item.width, "jpeg", channels=item.channels)
    result = encode_image(data, options)  # an Accepted made without a spill file (tests, old callers)
    if not isinstance(result, Encoded):  # deterministic encode: only a library bug gets here
        raise RuntimeError(f"{display_path(relpath)} was accepted, then rejected on the second read: {result.detail}")
    return result


class ShardRows:
    """A shard's rows of the records table and its figures, added record by record as the writer writes them.

    What the writer already holds of each record (its place, classes, stored size, hashes, name) is all it
    takes: no image is decoded or read again. The figures are the report's (:mod:`record_files.record_stats`),
    boxes taken as the record's float32 values so they fall in the bins a scan of the record would.
    """

    def __init__(self, handle, shard: int, task: str) -> None:
        self._table, self._task = records_table.TableWriter(handle, shard), task
        self.stats = SplitStats("")

    def add(self, index: int, offset: int, item: Accepted, encoded: Encoded, sha256_hex: str,
            annotation) -> None:
        """Record ``index`` of the shard, whose frame starts at ``offset``; ``annotation`` as the writer decoded it."""
        objects = None
        if isinstance(annotation, annotations.Objects):
            boxes = annotation.boxes
            classes = [box.label for box in boxes]
            corners = np.array([(box.xmin, box.ymin, box.xmax, box.ymax) for box in boxes], np.float32).reshape(-1, 4)
            objects = ObjectValues(classes, [int(box.crowd) for box in boxes], [int(box.difficult) for box in boxes],
                                   *(corners[:, k].tolist() for k in range(4)))
        elif isinstance(annotation, annotations.Labels):
            classes = list(annotation.ids)
        else:
            classes = [item.ref.label]
        if self._task == record_schema.TASK_SEGMENTATION:
            classes, objects = [], None  # a mask's classes are its pixels': not counted without decoding it
        self._table.add(index, offset, classes, encoded.width, encoded.height, len(encoded.data),
                        bytes.fromhex(sha256_hex), item.perceptual_hash, display_path(item.ref.relpath))
        self.stats.add_image(encoded.width, encoded.height, len(encoded.data), record_schema.IMAGE_FORMAT_JPEG,
                             encoded.channels, self._task, classes, objects)

    def close(self, split: str) -> records_table.TableFile:
        return self._table.close(split, self.stats)


def write_shard(
    src: str,
    folder: str,
    split: str,
    index: int,
    num_shards: int,
    items: Iterable[Accepted],
    classes: Sequence[str],
    options: EncodeOptions,
    on_record: Optional[Callable[[], None]] = None,
    work: str = "",
    table: Optional[ShardRows] = None,
) -> ShardResult:
    """Write ``items`` (in order) as shard ``index`` of ``split`` into ``folder``.

    ``on_record`` is called after each record (progress reporting); ``work``
    holds the spill files of re-encoded images. Also writes ``<shard>.idx``:
    each record's offset and framed size, as DALI's ``tfrecord2idx`` would by
    reading the shard again (the reader seeks with it, DALI reads it). ``table``: each record's row
    of the records table is added to it (its caller closes it).
    """
    name = record_schema.shard_filename(split, index, num_shards)
    digest = hashlib.sha256()
    labels: collections.Counter[int] = collections.Counter()
    reencoded: collections.Counter[str] = collections.Counter()
    num_bytes = max_side = grayscale = small = count = 0
    index_lines = []
    # In shard order, archive members are read one by one (exactly, no read-ahead), each archive opened once.
    with MemberReader(src, work) as members, FileSystems.create(
            FileSystems.join(folder, name), compression_type=CompressionTypes.UNCOMPRESSED) as out:
        for item in items:
            encoded = encode_accepted(src, item, options, work, members)
            # A pass-through image is the source file, whose SHA-256 validation already computed.
            known = item.source_sha256.hex() if not encoded.reencoded else hashlib.sha256(encoded.data).hexdigest()
            annotation = placed_codec.decode_placed(item.ref.annotation) if item.ref.annotation else None
            if isinstance(annotation, annotations.Objects):  # label_counts counts objects by class
                class_mask = read_source(src, annotation.class_mask[0], annotation.class_mask[1], work, members) \
                    if annotation.class_mask else b""
                example = build_object_example(encoded, item.ref.relpath, annotation, classes, known, class_mask)
                labels.update(box.label for box in annotation.boxes)
            elif isinstance(annotation, annotations.Labels):  # several labels: images per label
                example = build_multilabel_example(encoded, item.ref.relpath, annotation.ids, classes, known)
                labels.update(annotation.ids)
            else:
                example = build_example(encoded, item.ref.relpath, item.ref.label, classes[item.ref.label], known)
                labels[item.ref.label] += 1
            # One write per record: a frame's 12- and 4-byte ends written apart cost a system call each (the
            # buffered file writes the large middle directly), more than copying the record once.
            header, footer = frame_parts(example)
            record = b"".join((header, example, footer))
            out.write(record)
            digest.update(record)
            index_lines.append(idx.index_line(num_bytes, len(record)))
            if table is not None:
                table.add(count, num_bytes, item, encoded, known, annotation)
            num_bytes += len(record)
            count += 1
            max_side = max(max_side, encoded.height, encoded.width)
            grayscale += encoded.channels == 1
            small += min(encoded.height, encoded.width) < record_schema.SMALL_SIDE
            if encoded.reencoded:
                reencoded[encoded.reencoded_because] += 1
            if on_record is not None:
                on_record()
    index_file, index_text = idx.index_filename(name), "".join(index_lines)
    filesystems.write_text(FileSystems.join(folder, index_file), index_text)
    return ShardResult(
        split=split,
        index=index,
        num_shards=num_shards,
        file=name,
        num_examples=count,
        num_bytes=num_bytes,
        sha256=digest.hexdigest(),
        label_counts=dict(sorted(labels.items())),
        reencoded=dict(sorted(reencoded.items())),
        max_side=max_side,
        grayscale=grayscale,
        small=small,
        dali_index=index_file,
        index_bytes=len(index_text),
    )
