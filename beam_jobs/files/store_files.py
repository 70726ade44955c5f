"""OUT's files wherever OUT is (a local folder, or a prefix in S3 or GCS), as ``--update`` reads and publishes them.

In:  OUT and a file's name relative to it (``versions/00002/train.records.parquet``); local folders of the
     launcher's.
Out: the file's path (:func:`path_in`), whether it is there, its bytes, a seekable handle on it (pyarrow reads
     records tables through one, a shard is read by offsets), a folder's names and files; a local file uploaded
     into a store and a store's downloaded; and, around all of it for OUT in a store, what the store raises
     (no credentials, no bucket, a refused connection) as one :class:`StoreError` naming OUT (:func:`reading`),
     checked at once by :func:`probe_store`.

Everything goes through Beam's ``FileSystems`` (:mod:`beam_jobs.files.filesystems`), so a store's flags are the
pipeline's (``--s3_*``); a local OUT is read with ``open`` as before. (docs/update.md, "Left for #59".)
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import BinaryIO, Iterator, Optional

from apache_beam.io.filesystem import BeamIOError, CompressionTypes

from beam_jobs.files.filesystems import (
    FileSystems,
    is_local,
    list_names,
    local_path,
    open_for_scanning,
    s3_client,
    write_bytes,
)
from beam_jobs.files.publish import PublishError

_COPY_CHUNK = 8 << 20


class StoreError(PublishError):
    """OUT's store refused or failed a request (a message naming OUT, the store's reason and what to check)."""


def path_in(out: str, name: str) -> str:
    """OUT's file ``name`` (relative to OUT, ``/`` between folders): a local path, or the object's in OUT's store."""
    if is_local(out):
        return os.path.join(local_path(out), name)
    return out.rstrip("/") + "/" + name


@contextlib.contextmanager
def reading(out: str, flag: str = "--out") -> Iterator[None]:
    """Around reads and writes of a remote OUT (or of the path ``flag`` names): what the store raises (no
    credentials, no such bucket, a refused connection) becomes a :class:`StoreError` naming it. Local: nothing
    changes."""
    if is_local(out):
        yield
        return
    try:
        yield
    except store_errors() as err:
        if _launchers_own(err):
            raise  # its own message names the local file or the full disk; "check the bucket" would mislead
        detail = " ".join(str(err).split())
        raise StoreError(
            f"{flag} {out}: the store refused or failed a request ({detail[:400]}); check that the bucket exists "
            "and that the credentials reach it (--s3_* flags or the AWS variables for S3, Google's default "
            "credentials for GCS)") from None


# A local file's failure on the launcher (a full disk while downloading a table, a staging folder it cannot write):
# not the store's. Review of ac71f63, F5: every OSError read as "the store refused".
_LOCAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EMFILE, errno.ENFILE})


def _launchers_own(err: BaseException) -> bool:
    """Whether ``err`` is the launcher's local trouble: an OSError of a full or read-only disk or too many open
    files, or one naming a local file (Python's file calls set ``filename``; a store's path has a scheme)."""
    if not isinstance(err, OSError) or isinstance(err, BeamIOError):
        return False
    filename = err.filename if isinstance(err.filename, str) else None
    return err.errno in _LOCAL_ERRNOS or (filename is not None and "://" not in filename)


def exists_in(out: str, name: str) -> bool:
    """Whether OUT holds the file ``name``."""
    with reading(out):
        return os.path.exists(path_in(out, name)) if is_local(out) else FileSystems.exists(path_in(out, name))


def read_in(out: str, name: str) -> Optional[bytes]:
    """The bytes of OUT's file ``name``; None when it is missing."""
    path = path_in(out, name)
    if is_local(out):
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
    with reading(out):
        if not FileSystems.exists(path):
            return None
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return handle.read()


@contextlib.contextmanager
def open_in(out: str, name: str) -> Iterator[BinaryIO]:
    """A seekable handle on OUT's file ``name`` (a records table for pyarrow, a shard read by offsets): the file
    on disk; in a store, ranged reads through a window that widens while they stay close
    (:func:`beam_jobs.files.open_for_scanning`)."""
    path = path_in(out, name)
    if is_local(out):
        with open(path, "rb") as handle:
            yield handle
        return
    with reading(out), open_for_scanning(path) as handle:
        yield handle


def names_in(out: str, folder: str) -> list[str]:
    """The names in OUT's ``folder`` (none when it is missing)."""
    path = path_in(out, folder)
    if is_local(out):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    with reading(out):
        return sorted(list_names(path))


def list_files(folder: str) -> list[str]:
    """Every file under ``folder`` (at any depth), relative to it with ``/``, sorted; none when it is missing."""
    if is_local(folder):
        root = local_path(folder)
        return sorted(os.path.relpath(os.path.join(parent, name), root).replace(os.sep, "/")
                      for parent, _, names in os.walk(root) for name in names)
    base = folder.rstrip("/") + "/"
    return sorted(m.path[len(base):] for m in FileSystems.match([base + "**"])[0].metadata_list)


def upload(source: str, target: str) -> None:
    """Copy the local file ``source`` to ``target`` in a store, streamed (an object appears whole when its
    upload completes; an empty one is written as S3 needs it)."""
    with open(source, "rb") as handle:
        first = handle.read(_COPY_CHUNK)
        if len(first) < _COPY_CHUNK:  # the whole file: one request in S3
            write_bytes(target, first)
            return
        with FileSystems.create(target, compression_type=CompressionTypes.UNCOMPRESSED) as sink:
            while first:
                sink.write(first)
                first = handle.read(_COPY_CHUNK)


def download(source: str, target: str) -> None:
    """Copy ``source`` in a store to the local file ``target`` (its folders made), streamed."""
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as handle, \
            open(target, "wb") as sink:
        shutil.copyfileobj(handle, sink, _COPY_CHUNK)


def probe_store(path: str) -> None:
    """One request that fails at once when ``path``'s store cannot be reached as configured: in S3, a listing of
    one key under it through the process's client. Why: Beam's own S3 calls take an error without an HTTP
    status (no credentials) for a transient one and retry it with backoff for about 9 minutes before failing.
    Raises what the client raises (botocore's ``NoCredentialsError``; a ``ClientError`` naming ``NoSuchBucket``
    or ``AccessDenied``). Elsewhere (local, GCS): nothing."""
    if FileSystems.get_scheme(path) != "s3":
        return
    from apache_beam.io.aws.s3io import parse_s3_path

    bucket, key = parse_s3_path(path.rstrip("/") + "/", object_optional=True)
    s3_client(FileSystems.get_filesystem(path)._options).list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)


def check_reachable(path: str, flag: str) -> None:
    """For a conversion's SRC or OUT in S3: one quick listing (:func:`probe_store`) before any work, so that missing
    credentials or a missing bucket stop the run at once with a :class:`StoreError` naming ``flag`` and the path,
    not after Beam's minutes of retries. Local paths and other stores: nothing."""
    if not is_local(path):
        with reading(path, flag):
            probe_store(path)


def check_inputs_reachable(options) -> None:
    """:func:`check_reachable` for each path a conversion reads or writes (SRC, OUT, the label files): a label
    file in S3 beside a local SRC would otherwise meet Beam's retries too."""
    for flag, path in (("--src", options.src), ("--out", options.out), ("--labels", options.labels_file),
                       ("--annotations", options.annotations), ("--val-labels", options.val_labels),
                       ("--synsets", options.synsets)):
        if path:
            check_reachable(path, flag)


def store_errors() -> tuple[type[BaseException], ...]:
    """What reading or writing a store raises when the store, not the code, is at fault: no credentials, a
    bucket missing or forbidden, a connection refused (Beam wraps some in ``BeamIOError``, not all: an open
    raises the client's own). For messages naming the path instead of a trace."""
    found: list[type[BaseException]] = [OSError, BeamIOError]
    with contextlib.suppress(ImportError):
        import botocore.exceptions

        found += [botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError]
    with contextlib.suppress(ImportError):
        from apache_beam.io.aws.clients.s3 import messages

        found.append(messages.S3ClientError)
    with contextlib.suppress(ImportError):
        import google.api_core.exceptions
        import google.auth.exceptions

        found += [google.api_core.exceptions.GoogleAPIError, google.auth.exceptions.GoogleAuthError]
    return tuple(found)
