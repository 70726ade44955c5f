"""Stage 1, in the launcher: cut the listed images into part files, and lay out the work folder.

In:  the listed images (``ImageRef``), in any order.
Out: ``parts/part-P`` files of ``part_size`` LISTED records each (see
     :mod:`beam_jobs.files.work_records`), in the :class:`~beam_jobs.files.work_layout.WorkLayout`
     every later stage uses to find its files. The pipeline's first PCollection is
     the part ids: ``ceil(N / part_size)`` small elements, whatever N is.

The layout (:mod:`beam_jobs.files.work_layout`) is planned here, before the parts are written.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable, Optional

from beam_jobs.files import work_records
from beam_jobs.files.work_layout import WorkLayout
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.runtime import interrupt
from beam_jobs.stage_records import ImageRef

# Parts of at most this many images: a part's records are sorted in one worker's memory (~200 B each).
MAX_PART_SIZE = 1 << 20
# At least this many per part: every part costs a few files in each stage.
MIN_PART_SIZE = 128
# Aim for this many parts, so small runs still spread over the workers.
TARGET_PARTS = 64


def choose_part_size(num_images: int, wanted: Optional[int] = None, unit: int = 0) -> int:
    """Images per part: ``wanted``, or about 1/64 of the images within [128, 2**20], and at least ``unit``.

    ``unit``: the rows a source reads as one (a Parquet row group): a part of
    at least that many rows reads each of them at most twice, where smaller
    parts would each read the whole row group for a few of its rows.
    """
    if wanted is not None:
        return wanted
    return max(MIN_PART_SIZE, min(MAX_PART_SIZE, math.ceil(num_images / TARGET_PARTS)), min(unit, MAX_PART_SIZE))


def write_parts(layout: WorkLayout, refs: Iterable[ImageRef], part_size: int) -> str:
    """Write ``refs`` into the layout's part files, ``part_size`` images each; return their SHA-256.

    Streams: one part's records are held at a time. The digest (of every
    record, length-prefixed, in order) is the listing's part of a run's
    fingerprint (:mod:`beam_jobs.planning.resume`), computed in the same pass.
    """
    digest = hashlib.sha256()
    for folder in layout.folders():
        if not FileSystems.exists(folder):
            FileSystems.mkdirs(folder)
    part, batch = 0, []
    for ref in refs:
        batch.append(work_records.encode_listed(ref))
        if len(batch) == part_size:
            interrupt.raise_if_received()  # a signal whose exception was lost (see interrupt.raise_if_received)
            _write_part(layout, part, batch, digest)
            part, batch = part + 1, []
    if batch:
        _write_part(layout, part, batch, digest)
    return digest.hexdigest()


def _write_part(layout: WorkLayout, part: int, records: list[bytes], digest) -> None:
    work_records.write_file(layout.part(part), work_records.LISTED, records)
    digest.update(b"".join(len(record).to_bytes(4, "big") + record for record in records))
