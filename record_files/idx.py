"""The record index file (``<shard>.idx``): each record's frame offset and size, one ``"offset size"`` line each.

NVIDIA DALI's format (what its ``tfrecord2idx`` writes), so DALI reads our
shards with our indexes. The one home of the format: the converter writes it
(:func:`index_line`, :func:`index_filename`), the reader reads it
(:func:`offset_of` in Python, :data:`LINE_PATTERN` in its TensorFlow graph),
``verify`` and ``reindex`` rebuild it from the frames (:func:`index_text`)
and check it (:func:`is_complete`, :func:`plausible_size`).

An index is only ever a shortcut: a reader that finds it missing, cut or
damaged reads through the records before the one it wants instead.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

SUFFIX = ".idx"
# One line, as a regular expression TensorFlow's regex_full_match takes too. 18 digits keep both
# numbers inside int64, which the graph's string-to-number conversion needs.
LINE_PATTERN = r"\d{1,18} \d{1,18}"
_LINE = re.compile(rb"^(\d{1,18}) (\d{1,18})$")
# The shortest and the longest line one record can have: "0 1\n" .. two 18-digit numbers.
_MIN_LINE, _MAX_LINE = 4, 38


def index_filename(shard: str) -> str:
    """The index's file name (or path) beside ``shard``."""
    return shard + SUFFIX


def index_line(offset: int, size: int) -> str:
    """The line of one record whose frame starts at ``offset`` and is ``size`` bytes long."""
    return f"{offset} {size}\n"


def index_text(frames: Iterable[tuple[int, int]]) -> str:
    """The whole index of records given as ``(offset, size)`` of their frames, in order."""
    return "".join(index_line(offset, size) for offset, size in frames)


def offset_of(index: bytes, record: int) -> Optional[int]:
    """The byte offset of ``record`` from an index's text, or None when the index does not reach it soundly.

    Sound: every line up to it parses, the first offset is 0, and each offset
    is the previous one plus its size. A reader that gets None reads through
    the records before it instead.
    """
    lines = index.split(b"\n", record + 1)[:record + 1]
    if len(lines) <= record:
        return None
    expected = 0
    for line in lines:
        match = _LINE.match(line)
        if not match or int(match.group(1)) != expected:
            return None
        offset, expected = expected, expected + int(match.group(2))
    return offset


def sound_offsets(index: bytes, records: Optional[int] = None) -> list[int]:
    """The byte offsets of the first ``records`` records (None: all) an index gives soundly, as
    :func:`offset_of` judges them: up to the first line that does not parse or chain. One pass, for a reader that
    needs several records' offsets of one file (a masked version's runs)."""
    lines = index.split(b"\n") if records is None else index.split(b"\n", records)[:records]
    offsets, expected = [], 0
    for line in lines:
        match = _LINE.match(line)
        if not match or int(match.group(1)) != expected:
            break
        offsets.append(expected)
        expected += int(match.group(2))
    return offsets


def is_complete(index: bytes, num_records: int, num_bytes: int) -> bool:
    """The whole index chains, has a line for each of ``num_records`` and ends where the shard ends."""
    lines = index.split(b"\n")
    if lines[-1] != b"" or len(lines) - 1 != num_records:
        return False
    if not num_records:
        return True
    last = _LINE.match(lines[-2])
    return offset_of(index, num_records - 1) is not None and last is not None and \
        int(last.group(1)) + int(last.group(2)) == num_bytes


def plausible_size(size: int, num_records: int) -> bool:
    """An index of ``size`` bytes could describe ``num_records`` records (for datasets that do not record it)."""
    return _MIN_LINE * num_records <= size <= _MAX_LINE * num_records
