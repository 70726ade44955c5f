"""Read and check each listed image: accepted or rejected with a reason, each image decoded once.

The validation pass keeps no image bytes in the pipeline: an accepted image
travels as its path, source checksum and size only, so every grouping step
stays small and peak memory does not grow with the bytes of the dataset on any
runner. An image stored byte for byte is read again by the shard writer, which
hashes it again only when it cannot tell from the file's stamp (:func:`file_stamp`)
that the file is the one validated. An image that had to be re-encoded is not
decoded and encoded a second time: its JPEG bytes are spilled, one file per
chunk of images, into the run's work folder (removed before the dataset is
published), and the writer copies them from there. So each image is decoded at
most once and encoded at most once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np
from apache_beam.io.filesystem import CompressionTypes, FileSystem
from apache_beam.io.localfilesystem import LocalFileSystem

from beam_jobs import annotations, formats, masks, placed_codec
from beam_jobs.files.filesystems import FileSystems
from beam_jobs.options import EncodeOptions
from beam_jobs.planning.discover import display_path
from beam_jobs.sources.archives import archive_members, member_reads
from beam_jobs.sources.archives.member_reads import MemberReader, keeps_bytes
from beam_jobs.stage_records import Accepted, ImageRef, RejectedInput
from beam_jobs.stages import perceptual_hash
from beam_jobs.stages.encode import Encoded, encode_image


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


def read_source(src: str, relpath: str, source: str = "", work: str = "",
                members: Optional[MemberReader] = None) -> bytes:
    """The bytes of one input: the file ``relpath`` of SRC, or the archive member ``source`` locates.

    ``members``: the chunk's reader of archive members (consecutive members
    by one ranged read); without one, a member is read alone.

    Raises OSError when it cannot be read, UnreadableItem (a ValueError) when an
    archive member's bytes are not what its archive declared or a Parquet row has no image. Read as stored:
    an image is never decompressed because its name ends in ``.gz``.
    """
    return read_stamped(src, relpath, source, work, members)[0]


def read_stamped(src: str, relpath: str, source: str = "", work: str = "",
                 members: Optional[MemberReader] = None) -> tuple[bytes, bytes]:
    """``(bytes, stamp)`` of one input (:func:`read_source`): the stamp names the version of a local file
    that was read (:func:`file_stamp`); b"" for an archive member, a file in an object store, or a local
    file changed too recently for its stamp to tell a later change."""
    if source:
        if members is not None:
            return members.read(source), b""
        with MemberReader(src, work) as alone:
            return alone.read(source), b""
    path = source_path(src, relpath)
    filesystem = source_filesystem(src)
    if isinstance(filesystem, LocalFileSystem):
        # What Beam's LocalFileSystem.open does (io.open), without its per-call checks, and unbuffered: a
        # whole file read at once needs no buffer. The open file is stat-ed after the read, so a change
        # made before the stat shows in the stamp.
        with open(path, "rb", buffering=0) as handle:
            data = handle.readall()
            return data, file_stamp(os.fstat(handle.fileno()), time.time_ns())
    # S3 reuses one boto3 client per process (beam_jobs.files.filesystems), not one per image.
    with filesystem.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read(), b""


# A file whose inode changed less than this before it was read gets no stamp: a second change in the same
# tick of the file system's clock (1 ns to 2 s, by file system) could leave its ctime as it was.
RACY_NS = 3_000_000_000
STAMP_BYTES = 16


def file_stamp(stat: os.stat_result, now_ns: int) -> bytes:
    """16 bytes that change whenever the file's content does: a digest of its device, inode, size, mtime and
    ctime. b"" when the ctime is missing (0) or within :data:`RACY_NS` of ``now_ns`` (the read's time).

    The kernel sets a file's ctime on every change to its content or its metadata, and no call sets it back
    (``utime`` sets the mtime, and moves the ctime to now); a file replaced by another is another inode. So
    a file read again whose stat still gives the same stamp holds the bytes read before: the shard writer
    checks that instead of hashing the bytes a second time (git's index and make rely on the same; the
    racy-time rule is git's too).
    """
    if stat.st_ctime_ns <= 0 or stat.st_ctime_ns > now_ns - RACY_NS:
        return b""
    identity = f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}".encode("ascii")
    return hashlib.blake2b(identity, digest_size=STAMP_BYTES).digest()


class ObjectTally(NamedTuple):
    """What stage 2 counts of an accepted image's annotation: taken from the objects :func:`validate_ref` decoded
    and placed, so the part does not decode the annotation again for each count (#57 §6: a decode of a 5-box
    annotation costs ~0.1 ms, and it was decoded three more times an image)."""

    placed: int = 0  # the objects its record will hold
    rejected: tuple[RejectedInput, ...] = ()  # its objects the source refused or validation could not place
    assumed: str = ""  # the frame its boxes were taken to be in where its size could not tell, else ""


def tally_objects(relpath: str, annotation: annotations.Annotation) -> ObjectTally:
    """The :class:`ObjectTally` of an accepted image's annotation as placed (a :class:`~beam_jobs.annotations.Labels`
    holds no objects: all zero). ``assumed`` is "" for an image holding no objects, even when its frame was
    assumed (nothing it holds was placed by it)."""
    if not isinstance(annotation, annotations.Objects):
        return ObjectTally()
    path = display_path(relpath)
    return ObjectTally(len(annotation.boxes),
                       tuple(RejectedInput(path, reason, detail, name) for name, reason, detail in annotation.rejected),
                       annotation.assumed if annotation.boxes or annotation.rejected else "")


def validate_ref(src: str, ref: ImageRef, options: EncodeOptions, work: str = "",
                 members: Optional[MemberReader] = None,
                 sign: bool = True) -> Union[tuple[Accepted, Encoded, Optional[ObjectTally]], RejectedInput]:
    """Read ``ref`` and decide whether it is written: ``(Accepted, Encoded, ObjectTally)`` or the rejection.

    The tally is None for an image without an annotation (:func:`tally_objects`).

    ``sign`` False: a JPEG stored as it is comes without its perceptual hash and thumbnail, its scaled decode in
    ``Encoded.signature_pixels`` for the caller to take them in a batch (:func:`validate_chunk`).

    A file that vanished or cannot be read since the listing is rejected, not
    fatal: the run goes on and the report names it. So is an archive member the
    listing refused (its reason), or whose bytes are not what its archive declares.
    """
    if ref.source.startswith(archive_members.REFUSED):
        refused = archive_members.parse_locator(ref.source)
        return RejectedInput(display_path(ref.relpath), refused.reason, refused.detail)
    try:
        data, stamp = read_stamped(src, ref.relpath, ref.source, work, members)
    except archive_members.UnreadableItem as err:
        return RejectedInput(display_path(ref.relpath), err.reason, display_path(str(err)))
    except OSError as err:  # Beam's BeamIOError is an OSError too
        if not ref.source and not FileSystems.exists(source_path(src, ref.relpath)):  # gone, or a label file's typo
            return RejectedInput(display_path(ref.relpath), "missing-file", missing_detail(ref.relpath))
        return RejectedInput(display_path(ref.relpath), "unreadable",
                             f"could not be read: {display_path(str(err))}")
    result = encode_image(data, options, sign)
    if not isinstance(result, Encoded):
        located = member_reads.where(ref.source)  # a Parquet row: its file and row, beside its record name
        return RejectedInput(display_path(ref.relpath), result.reason,
                             f"{located}: {result.detail}" if located else result.detail)
    annotation = annotations.decode(ref.annotation) if ref.annotation else None  # its one decode in stage 2
    if isinstance(annotation, annotations.Objects):  # placed on the stored pixels (turned, normalized, bad ones named)
        if annotation.class_mask:  # a semantic mask: a readable PNG of the image file's size, or the image goes
            problem = _class_mask_problem(src, annotation.class_mask, result.input_size, work, members)
            if problem is not None:
                return RejectedInput(display_path(ref.relpath), "bad-mask", problem)
        placed = annotations.place(annotation, result.input_size, result.orientation, options.annotation_frame,
                                   options.max_pixels)
        unwritable = () if options.keep_partial_images else annotations.unwritable(placed)
        if unwritable:
            return _rejected_for_object(ref.relpath, unwritable)
        ref = ref._replace(annotation=placed_codec.encode_placed(placed))  # packed for the writer, not JSON
        annotation = placed
    accepted = Accepted(ref, hashlib.sha256(data).digest(), result.reencoded_because, result.height, result.width,
                        channels=result.channels, stored_bytes=len(result.data), perceptual_hash=result.perceptual_hash,
                        stamp=stamp, thumbnail=result.thumbnail)
    return accepted, result, (tally_objects(ref.relpath, annotation) if annotation is not None else None)


def _rejected_for_object(relpath: str, unwritable: Sequence[tuple[str, str, str]]) -> RejectedInput:
    """An image rejected for its objects that cannot be written (:func:`beam_jobs.annotations.unwritable`): the
    first one's reason, named with its detail, and how many more there are."""
    name, reason, detail = unwritable[0]
    more = len(unwritable) - 1
    return RejectedInput(display_path(relpath), reason,
                         f"{name}: {detail}" + (f" (and {more} more object{'s' if more > 1 else ''})" if more else "")
                         + "; written without it, the object would train as background (--keep-partial-images "
                         "writes the image without it)")


def _class_mask_problem(src: str, class_mask: Sequence[str], size: tuple[int, int], work: str,
                        members: Optional[MemberReader]) -> Optional[str]:
    """Why an image's semantic mask cannot be used (unreadable, not a PNG of class ids, another size), or None."""
    relpath, source, *colours = class_mask  # a colour table for masks drawn in colours (masks.read_class_mask)
    try:
        masks.read_class_mask(read_source(src, relpath, source, work, members), size, display_path(relpath),
                              *colours)
    except masks.MaskError as err:
        return str(err)
    except (OSError, archive_members.UnreadableItem) as err:
        return f"its mask {display_path(relpath)} could not be read: {display_path(str(err))}"
    return None


def missing_detail(relpath: str) -> str:
    """What was looked for, for a listed file that is not there (no absolute path: reports stay identical)."""
    name = relpath.rpartition("/")[2]
    detail = f"listed, but --src has no file {display_path(relpath)}"
    if not formats.has_image_extension(name):
        detail += f", nor one named {display_path(name)} plus an image extension (.jpg, .png, ...)"
    return detail


def spill_path(work: str, chunk: int) -> str:
    """The spill file of chunk ``chunk`` (a part id) in the work folder."""
    return FileSystems.join(work, f"spill-{chunk:012d}.jpeg-bytes")


class Checked(NamedTuple):
    """An image :func:`validate_chunk` accepted: its work record, and its objects' tally (None: no annotation)."""

    item: Accepted
    objects: Optional[ObjectTally] = None


def validate_chunk(src: str, refs: Sequence[ImageRef], options: EncodeOptions, work: str,
                   chunk: int, on_result: Optional[Callable[[], None]] = None) -> list[Union[Checked, RejectedInput]]:
    """Validate a chunk of images; re-encoded ones leave their bytes in the chunk's spill file.

    ``on_result`` is called after each image (progress reporting).

    The spill file is written whole before this returns (a retried chunk
    rewrites the same bytes: encoding is deterministic), and only when some
    image of the chunk was re-encoded.
    """
    results: list[Union[Checked, RejectedInput]] = []
    unsigned = _Unsigned(results)
    spill = None
    offset = 0
    members = MemberReader(src, work, [ref.source for ref in refs], local_paths=options.local_paths)
    try:
        for ref in refs:
            result = validate_ref(src, ref, options, work, members, sign=False)
            if on_result is not None:
                on_result()
            if isinstance(result, RejectedInput):
                results.append(result)
                continue
            accepted, encoded, objects = result
            if encoded.signature_pixels is not None:
                unsigned.add(len(results), encoded.signature_pixels)
            # A Parquet row's bytes are spilled even when stored as they are: the writer, in shard order,
            # would otherwise read a whole row group for each row.
            if encoded.reencoded or keeps_bytes(ref.source):
                if spill is None:
                    spill = FileSystems.create(spill_path(work, chunk), compression_type=CompressionTypes.UNCOMPRESSED)
                spill.write(encoded.data)
                accepted = accepted._replace(spill=(chunk, offset, len(encoded.data)))
                offset += len(encoded.data)
            results.append(Checked(accepted, objects))
            unsigned.sign_when_full()
        unsigned.sign()
    finally:
        members.close()
        if spill is not None:
            spill.close()
    return results


class _Unsigned:
    """Accepted images (:class:`Checked`) whose perceptual hash and thumbnail are still to be taken, signed a batch at a time into
    the results list (:func:`perceptual_hash.signatures_of_scaled`: one image at a time, numpy's cost per call
    was most of a small image's hashing, #56 §5). A batch holds at most :data:`_SIGN_BATCH` images and
    :data:`_SIGN_BYTES` of scaled pixels, so a part of large photos holds a few MB of them at once."""

    def __init__(self, results: list) -> None:
        self._results = results
        self._waiting: list[tuple[int, np.ndarray]] = []
        self._bytes = 0

    def add(self, position: int, pixels: np.ndarray) -> None:
        self._waiting.append((position, pixels))
        self._bytes += pixels.nbytes

    def sign_when_full(self) -> None:
        if len(self._waiting) >= _SIGN_BATCH or self._bytes >= _SIGN_BYTES:
            self.sign()

    def sign(self) -> None:
        if not self._waiting:
            return
        signatures = perceptual_hash.signatures_of_scaled([pixels for _, pixels in self._waiting])
        for (position, _), (phash, thumbnail) in zip(self._waiting, signatures):
            checked = self._results[position]
            self._results[position] = checked._replace(item=checked.item._replace(perceptual_hash=phash,
                                                                                   thumbnail=thumbnail))
        self._waiting, self._bytes = [], 0


_SIGN_BATCH = 256
_SIGN_BYTES = 8 << 20


def read_spilled(work: str, item: Accepted) -> bytes:
    """The re-encoded JPEG bytes of ``item`` from its chunk's spill file."""
    chunk, offset, length = item.spill
    with source_filesystem(work).open(spill_path(work, chunk), compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise OSError(f"spill file of chunk {chunk} is short: {len(data)} of {length} bytes at {offset}")
    return data
