"""Read and check one listed image: accepted (with its sort key) or rejected with a reason.

The validation pass keeps no image bytes: an accepted image travels through the
pipeline as its path, sort key and source checksum only, and the shard writer
reads it again. That keeps every grouping step small, so peak memory does not
grow with the bytes of the dataset on any runner.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import NamedTuple, Union

from apache_beam.io.filesystem import CompressionTypes, FileSystem
from apache_beam.io.filesystems import FileSystems

from beam_jobs.discover import ImageRef, display_path
from beam_jobs.encode import Encoded, encode_image
from beam_jobs.options import EncodeOptions


class Accepted(NamedTuple):
    """A listed image that will be written (a NamedTuple: it is pickled between stages).

    Attributes:
      ref: the image.
      source_sha256: SHA-256 digest (32 bytes) of the input file, so the writer can tell if
        the file changed between the two reads.
      reencoded_because: "" when stored byte for byte.
      height, width: size of the stored image.
    """

    ref: ImageRef
    source_sha256: bytes
    reencoded_because: str
    height: int
    width: int


@dataclasses.dataclass(frozen=True)
class AcceptedBatch:
    """Accepted images that travel together between pipeline stages (a chunk, or a shard's worth).

    A wrapper rather than a list: Beam's default coder pickles each NamedTuple
    of a list on its own (about nine pickles per image over the pipeline, a
    tenth of the per-image CPU), while an unknown object like this one is
    pickled once, as a whole.
    """

    items: tuple[Accepted, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class RejectedInput:
    """A listed image that will not be written, and why."""

    relpath: str  # as text (discover.display_path)
    reason: str
    detail: str

    def to_json(self) -> str:
        """One line of ``rejected.jsonl``."""
        return json.dumps({"path": self.relpath, "reason": self.reason, "detail": self.detail}, ensure_ascii=False)


@functools.lru_cache(maxsize=16)
def source_filesystem(src: str) -> FileSystem:
    """Beam's filesystem for SRC, looked up once per process.

    ``FileSystems.open`` and ``FileSystems.join`` look the filesystem up on every
    call by walking every ``FileSystem`` subclass, which cost 80 us per image
    (as much as reading a small image from the page cache).
    """
    return FileSystems.get_filesystem(src)


def source_path(src: str, relpath: str) -> str:
    """Full path of an input given SRC and its ``/``-separated relative path."""
    return source_filesystem(src).join(src, *relpath.split("/"))


def read_source(src: str, relpath: str) -> bytes:
    """The bytes of one input file (raises OSError when it cannot be read).

    Read as stored: an image is never decompressed because its name ends in ``.gz``.
    """
    path = source_path(src, relpath)
    with source_filesystem(src).open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def validate_ref(src: str, ref: ImageRef, options: EncodeOptions) -> Union[Accepted, RejectedInput]:
    """Read ``ref`` and decide whether it is written.

    A file that vanished or cannot be read since the listing is rejected, not
    fatal: the run goes on and the report names it.
    """
    try:
        data = read_source(src, ref.relpath)
    except OSError as err:  # Beam's BeamIOError is an OSError too
        return RejectedInput(display_path(ref.relpath), "unreadable",
                             f"could not be read: {display_path(str(err))}")
    result = encode_image(data, options)
    if not isinstance(result, Encoded):
        return RejectedInput(display_path(ref.relpath), result.reason, result.detail)
    return Accepted(
        ref=ref,
        source_sha256=hashlib.sha256(data).digest(),
        reencoded_because=result.reencoded_because,
        height=result.height,
        width=result.width,
    )
