"""The records that pass between the conversion's stages, defined once; this module imports none of the stages.

    discover / sources ──ImageRef──> list_parts ──(part files)──> validate_part
    validate ──Accepted | RejectedInput──> validate_part ──(sorted runs)──> order_bucket ──> write

Each stage module imports its records from here (and :mod:`beam_jobs.files.work_records`,
which writes them to the work files, does too), so every import arrow points one
way. NamedTuples where millions are pickled between stages: tuples pickle several
times faster than dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple, Optional


class ImageRef(NamedTuple):
    """One listed input image: where it is and what it is labelled.

    ``relpath`` is relative to SRC, ``/``-separated: where the image is in SRC,
    or in its extraction when it is an archive's member. ``source`` is empty
    for a plain file, else the member's locator (where its bytes sit in the
    archive, or why it is refused: :mod:`beam_jobs.sources.archives.archive_members`).
    Everything the output holds depends on ``relpath`` only, so an archive
    converts to the bytes of its extraction. A NamedTuple, not a dataclass:
    millions of these are pickled between pipeline stages, and tuples pickle
    several times faster.
    """

    split: str
    relpath: str
    label: int
    source: str = ""
    # The image's objects (beam_jobs.annotations.encode), b"" for one class label: they travel with
    # their image, so no process holds the dataset's annotations.
    annotation: bytes = b""


class Accepted(NamedTuple):
    """A listed image that will be written (a NamedTuple: it is pickled between stages).

    Attributes:
      ref: the image.
      source_sha256: SHA-256 digest (32 bytes) of the input file: the duplicate searches' key, the
        record's ``image/key/sha256``, and how the writer tells if the file changed between the two reads.
      reencoded_because: "" when stored byte for byte.
      height, width: size of the stored image.
      spill: where a re-encoded image's JPEG bytes wait for the writer:
        (chunk id, byte offset, length) in the chunk's spill file; () when
        stored byte for byte.
      perceptual_hash: the stored pixels' 64-bit perceptual hash (:mod:`beam_jobs.stages.perceptual_hash`), for
        the near-duplicate search; None when the run takes none (``--near-distance off``).
      thumbnail: the same pixels' 8x8 gray thumbnail (64 bytes), which verifies the near search's pairs; b""
        when the run takes no hash.
      stamp: the version of the local file validation read (:func:`beam_jobs.stages.validate.file_stamp`, 16
        bytes): the shard writer reads the file again and, when its stamp is the same, does not hash it again;
        b"" when there is none (then it hashes).
    """

    ref: ImageRef
    source_sha256: bytes
    reencoded_because: str
    height: int
    width: int
    spill: tuple = ()
    channels: int = 3
    stored_bytes: int = 0  # bytes of the JPEG the record will hold (sizes shards for --shards auto)
    perceptual_hash: Optional[int] = None
    stamp: bytes = b""
    thumbnail: bytes = b""


@dataclasses.dataclass(frozen=True, slots=True)
class RejectedInput:
    """A listed image that will not be written, and why."""

    relpath: str  # as text (discover.display_path)
    reason: str
    detail: str
    annotation: str = ""  # a rejected object of the image (it is written with its other objects): its name

    def to_json(self) -> str:
        """One line of ``rejected.jsonl``."""
        line = {"path": self.relpath, "reason": self.reason, "detail": self.detail}
        if self.annotation:
            line["annotation"] = self.annotation
        return json.dumps(line, ensure_ascii=False)
