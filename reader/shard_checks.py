"""The checks every shard read passes through: its record count at its end, its labels, its presence.

A shard that is corrupt or truncated (even at a record boundary, which
TFRecord's own CRCs cannot notice) fails naming the file, instead of
TensorFlow's nameless ``DataLossError``; with ``skip_corrupt`` the rest of it
is skipped with a warning. Split out of :mod:`reader.records`, which reads the
records these checks wrap.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Optional

import tensorflow as tf

# Records counted per call of the shard check (see reader.records.read_shard).
CHECK_BATCH = 256
# What a check's records are, for its message: a whole file, a run of one from a record, or a masked file's
# runs one after another (the records a version reads from it).
WHOLE, SEGMENT, RUNS = "file", "segment", "runs"
_TEMPLATES = {
    WHOLE: "shard {} is corrupt or truncated: read {} of its {} records",
    SEGMENT: "shard {} is corrupt or truncated: read {} of the {} records from record {}",
    RUNS: "shard {} is corrupt or truncated: read {} of the {} records its version reads from it (its live runs)",
}


@dataclasses.dataclass(frozen=True)
class LabelRange:
    """Labels a shard's records must carry: ``0 <= label + offset < num_classes`` (no upper bound if 0).

    Checked while reading shards that the converter did not write, so a
    foreign shard with a stray label fails naming the shard instead of
    training on it (or reaching a loss function as an out-of-range index).
    """

    key: str
    offset: int = 0
    num_classes: int = 0


def checked(records: tf.data.Dataset, path: tf.Tensor, num_records: tf.Tensor, skip_corrupt: bool,
            labels: Optional[LabelRange], s3: bool, first: Optional[tf.Tensor] = None,
            kind: Optional[str] = None) -> tf.data.Dataset:
    """``records``, failing (or warning) at their end unless there were ``num_records`` (< 0: any number).

    ``kind``: :data:`WHOLE` (the default without ``first``), :data:`SEGMENT` (with it) or :data:`RUNS`.
    """
    kind = kind or (WHOLE if first is None else SEGMENT)
    batches = records.batch(CHECK_BATCH)
    end = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))
    step = check_step(skip_corrupt, kind, labels)
    start = tf.constant(0, tf.int64) if first is None else tf.cast(first, tf.int64)
    path, num_records = tf.convert_to_tensor(path, tf.string), tf.cast(num_records, tf.int64)
    counted = batches.concatenate(end).scan(tf.constant(0, tf.int64),
                                            lambda count, batch: step(count, batch, path, num_records, start)).unbatch()
    return counted if s3 else if_present(path, counted, skip_corrupt)


@functools.lru_cache(maxsize=None)
def check_step(skip_corrupt: bool, kind: str, labels: Optional[LabelRange]):
    """The count check's scan step ``(count, batch, path, num_records, first) -> (count, batch)``.

    For whole shards, a ``tf.function`` traced once a process for each kind of check and called from every
    shard's scan (traced in each, it cost a third of the check's CPU to build), as for a masked file's runs
    (:data:`RUNS`). For segments (:data:`SEGMENT`: a run from record ``first``, the message says so), plain graph code:
    their only caller, the training order, is traced once a process, and a function called from it is
    instantiated again as each iterator starts (issue #50's first batch).
    """
    segment = kind == SEGMENT
    template = _TEMPLATES[kind]

    def step(count: tf.Tensor, batch: tf.Tensor, path: tf.Tensor, num_records: tf.Tensor, first: tf.Tensor) -> tuple:
        size = tf.size(batch, out_type=tf.int64)

        def at_end() -> tf.Tensor:
            complete = tf.logical_or(num_records < 0, tf.equal(count, num_records))
            message = tf.strings.format(template, (path, count, num_records, *((first,) if segment else ())))
            if skip_corrupt:
                check = tf.cond(
                    complete,
                    tf.no_op,
                    lambda: tf.print("WARNING: skipping the rest of", message, output_stream=sys.stderr),
                )
            else:
                check = tf.debugging.Assert(complete, [message])
            with tf.control_dependencies([check]):
                return tf.identity(batch)

        if labels is None:
            return count + size, tf.cond(tf.equal(size, 0), at_end, lambda: batch)
        return count + size, tf.cond(tf.equal(size, 0), at_end,
                                     lambda: _check_labels(batch, path, count + first, labels, skip_corrupt))

    if segment:
        return step
    return tf.function(step, input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.string),
                                              tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64),
                                              tf.TensorSpec([], tf.int64)], autograph=False)


def _check_labels(batch: tf.Tensor, path: tf.Tensor, first: tf.Tensor, labels: LabelRange,
                  skip_corrupt: bool) -> tf.Tensor:
    """``batch`` (records ``first``... of ``path``) if every label is in range; else fail or drop."""
    values = tf.io.parse_example(batch, {labels.key: tf.io.FixedLenFeature([], tf.int64)})[labels.key] + labels.offset
    good = values >= 0
    if labels.num_classes:
        good = tf.logical_and(good, values < labels.num_classes)
    bad = tf.where(tf.logical_not(good))[:, 0]
    index = tf.concat([bad, tf.zeros([1], tf.int64)], 0)[0]  # the first bad record (0 when there is none)
    valid = f"[0, {labels.num_classes})" if labels.num_classes else ">= 0"
    message = tf.strings.format(
        "shard {} record {} has label {} (after label_offset {}), outside " + valid + "; {} such records in this batch",
        (path, first + index, tf.gather(values, index), labels.offset, tf.size(bad)))
    ok = tf.equal(tf.size(bad), 0)
    if skip_corrupt:
        check = tf.cond(ok, tf.no_op, lambda: tf.print("WARNING: skipping records:", message, output_stream=sys.stderr))
        with tf.control_dependencies([check]):
            return tf.boolean_mask(batch, good)
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
        return tf.identity(batch)


def if_present(path: tf.Tensor, records: tf.data.Dataset, skip_corrupt: bool) -> tf.data.Dataset:
    """``records``, or for a missing file an error naming it (with ``skip_corrupt``, a warning and nothing)."""
    found = tf.size(tf.io.matching_files(_glob_escape(path))) > 0
    message = tf.strings.format("shard {} is listed in the manifest but does not exist", path)
    if skip_corrupt:
        warn = tf.cond(found, tf.no_op,
                       lambda: tf.print("WARNING: skipping", message, "(all its records)", output_stream=sys.stderr))
        with tf.control_dependencies([warn]):
            found = tf.identity(found)
        return records.take(tf.where(found, tf.constant(-1, tf.int64), 0))
    with tf.control_dependencies([tf.debugging.Assert(found, [message])]):
        found = tf.identity(found)
    return records.take(tf.where(found, tf.constant(-1, tf.int64), 0))


def _glob_escape(path: tf.Tensor) -> tf.Tensor:
    """``path`` as a pattern that matches only itself (``matching_files`` globs ``*?[`` and ``\\``)."""
    return tf.strings.regex_replace(path, r"([*?\[\]\\])", r"\\\1")
