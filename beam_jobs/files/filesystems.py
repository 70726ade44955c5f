"""The job's file I/O: Beam's ``FileSystems`` (one boto3 client per process for S3), ranged reads, whole files.

Data in: paths (local, ``s3://``, ``gs://``...) and the pipeline's ``--s3_*`` options.
Data out: Beam's ``FileSystems``, unchanged in behaviour, which every module of the job imports from
here; handles that read exact ranges (:func:`open_for_ranges`, :class:`ReadAhead`); and the helpers
every stage writes and reads its files with: :func:`write_text`, :func:`write_bytes` and :func:`whole_file`
(a file appears whole or not at all), :func:`read_text`, :func:`remove_folder`, :func:`is_local`; and
:func:`gcs_anonymous_when_asked`, which connects to GCS without credentials at once when asked to.

Beam's S3 file system builds a new boto3 session and client for every call
(each open, exists, delete, rename, listing): about 100 ms of CPU each here,
more than the request itself. A conversion into S3 makes several calls per
work file and shard, so a 600-image run spent 45 of its 51 s building clients.
Here every such call gets its own Beam client object, as before (it keeps
per-download state), around one boto3 client per process and set of
``--s3_*`` settings, shared by all threads (boto3's low-level clients are
thread-safe).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import threading
import uuid
from typing import Any, BinaryIO, Iterator

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

try:  # Beam's S3 support (its module imports without boto3; using it needs the aws extra)
    from apache_beam.io.aws import s3filesystem as _s3filesystem
    from apache_beam.io.aws import s3io as _beam_s3io
    from apache_beam.io.aws.clients.s3.boto3_client import Client as _BeamClient
except ImportError:
    _s3filesystem = _beam_s3io = None
    _BeamClient = object

__all__ = ["FileSystems", "ReadAhead", "open_for_ranges", "open_for_scanning", "s3io", "s3_client"]

_SETTINGS = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token", "s3_endpoint_url", "s3_disable_ssl",
             "s3_region_name", "s3_api_version", "s3_verify")
_clients: dict[tuple, Any] = {}
S3_CONNECTIONS = 64  # connections the process's S3 client keeps open, for the threads that share it
_lock = threading.Lock()


def _settings(options: Any) -> tuple:
    """The ``--s3_*`` values of pipeline options (or of a dict of them), in a fixed order."""
    if isinstance(options, dict):
        return tuple(options.get(name) for name in _SETTINGS)
    from apache_beam.options.pipeline_options import S3Options

    view = options.view_as(S3Options)
    return tuple(getattr(view, name) for name in _SETTINGS)


def s3_client(options: Any):
    """The process's boto3 S3 client for these ``--s3_*`` settings (built on first use)."""
    key = _settings(options)
    with _lock:
        client = _clients.get(key)
        if client is None:
            import boto3

            access_key, secret_key, token, endpoint, disable_ssl, region, api_version, verify = key
            from botocore.config import Config

            # What Beam's own client passes (apache_beam.io.aws.clients.s3.boto3_client.Client), and a connection
            # pool for the threads that share the client (botocore keeps 10: the launcher reads YOLO's label
            # files 32 at a time, and a fuller pool discards a connection after each request, with a warning).
            client = _clients[key] = boto3.session.Session().client(
                service_name="s3", region_name=region, api_version=api_version, use_ssl=not disable_ssl,
                verify=verify, endpoint_url=endpoint, aws_access_key_id=access_key,
                aws_secret_access_key=secret_key, aws_session_token=token,
                config=Config(max_pool_connections=S3_CONNECTIONS))
    return client


def gcs_anonymous_when_asked(no_auth: bool = False) -> None:
    """With ``--no_auth`` (Beam's flag for "no credentials") or ``STORAGE_EMULATOR_HOST`` set (the GCS
    emulator, as google-cloud-storage reads it), Beam's GCS file system connects anonymously at once.

    Why: left alone, Beam looks for Google's default credentials with four retries, 25 s of backoff in every
    process, before it connects anonymously anyway (its GCS client in this version ignores ``--no_auth``).
    Beam's credentials are cached per process; this fills that cache with "none". Credentials that exist
    are never replaced: without the flag or the variable this does nothing.
    """
    if not (no_auth or os.environ.get("STORAGE_EMULATOR_HOST")):
        return
    try:
        from apache_beam.internal.gcp import auth
    except ImportError:  # no gcp extra: no GCS file system either
        return
    credentials = getattr(auth, "_Credentials", None)
    if credentials is None or not hasattr(credentials, "_credentials_init"):
        return  # another Beam: it keeps its own behaviour
    with credentials._credentials_lock:
        if not credentials._credentials_init:
            credentials._credentials, credentials._credentials_init = None, True


def open_for_ranges(path: str) -> BinaryIO:
    """A seekable handle on ``path`` whose ``read(n)`` fetches n bytes and no more: one ranged request in S3 and GCS.

    Beam's readers read 16 MiB ahead on every read (buffers for streaming a file
    front to back), so reading one small range of a large file through them
    fetched 16 MiB. Here S3's buffer is taken off (Beam's downloader below it
    reads exactly what is asked, continuing one request while reads follow on)
    and GCS's read-ahead (google-cloud-storage's ``BlobReader``) is set to nothing.
    """
    if FileSystems.get_scheme(path) in (None, "file"):
        return open(path[len("file://"):] if path.startswith("file://") else path, "rb")  # noqa: SIM115
    handle = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if isinstance(handle, io.BufferedReader):  # S3: Beam's DownloaderStream under a 16 MiB buffer
        return handle.detach()
    if hasattr(handle, "_chunk_size"):  # GCS: BlobReader fetches max(asked, _chunk_size) at each read
        handle._chunk_size = 1
    return handle


def open_for_scanning(path: str) -> BinaryIO:
    """A seekable handle on ``path`` for reading what is spread through a file (tar headers, a zip's local
    headers): locally the file; in S3 and GCS a :class:`ReadAhead` over :func:`open_for_ranges`."""
    if FileSystems.get_scheme(path) in (None, "file"):
        return open(path[len("file://"):] if path.startswith("file://") else path, "rb")  # noqa: SIM115
    return ReadAhead(open_for_ranges(path))  # noqa: SIM115


class ReadAhead(io.RawIOBase):
    """Reads of a ranged handle through a window that widens while reads stay close and narrows at a jump.

    Beam's readers fetch 16 MiB at every read away from their buffer: right for
    a tar of images, whose headers sit every few hundred KB, wasteful for
    ImageNet's tar of tars, whose 1,000 headers sit 140 MB apart (16 GB
    fetched to read 1,000 headers). Here a read after a jump fetches
    :data:`NARROW` bytes, each read close after the window (within its width)
    fetches twice the last, up to :data:`WIDE`; the first read of a file is wide
    (a small archive costs one request). Memory: one window.
    """

    NARROW, WIDE = 64 << 10, 16 << 20

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw, self._start, self._data, self._position, self._width = raw, 0, b"", 0, self.WIDE
        self.fetches = 0  # requests made (what the tests count)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            self._position = self._raw.seek(offset, io.SEEK_END)
        else:
            self._position = max(0, offset + (self._position if whence == io.SEEK_CUR else 0))
        return self._position

    def readinto(self, buffer) -> int:
        wanted = len(buffer)
        at = self._position - self._start
        if at < 0 or at + wanted > len(self._data):
            end = self._start + len(self._data)
            if self.fetches:
                close = end <= self._position < end + self._width
                self._width = min(2 * self._width, self.WIDE) if close else self.NARROW
            self._raw.seek(self._position)
            self._start, self._data = self._position, self._raw.read(max(wanted, self._width))
            self.fetches += 1
            at = 0
        data = self._data[at:at + wanted]
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def s3io(options: Any = None, client: Any = None):
    """A Beam ``S3IO`` over the shared boto3 client (or over ``client``, as Beam's own signature allows)."""
    return _beam_s3io.S3IO(client=client if client is not None else _SharedClient(options))


class _SharedClient(_BeamClient):
    """Beam's S3 client (its per-download state), around the process's boto3 client."""

    def __init__(self, options: Any) -> None:  # Beam's constructor, minus building a session and client
        self.client = s3_client(options)
        self._download_request = None
        self._download_stream = None
        self._download_pos = 0


class _S3ioModule:
    """Beam's ``s3io`` module as its S3 file system sees it, with ``S3IO`` building on the shared client."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def S3IO(self, client: Any = None, options: Any = None):  # noqa: N802 - the name Beam calls
        return s3io(options, client)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


# Beam's S3 file system calls s3io.S3IO(options=...) for everything it does.
if _s3filesystem is not None and not isinstance(_s3filesystem.s3io, _S3ioModule):
    _s3filesystem.s3io = _S3ioModule(_beam_s3io)


# --- whole files: what every stage writes and reads through the run's file systems ------------------------

def is_local(path: str) -> bool:
    return FileSystems.get_scheme(path) in (None, "file")


def local_path(path: str) -> str:
    return os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)


def list_names(folder: str) -> list[str]:
    if is_local(folder):
        return os.listdir(local_path(folder))
    # An object store has no folders: every object under the prefix, named by its first path component.
    base = folder.rstrip("/") + "/"
    return sorted({m.path[len(base):].split("/")[0] for m in FileSystems.match([base + "**"])[0].metadata_list})


def write_text(path: str, text: str) -> None:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str, data: bytes) -> None:
    """Write a small file whole or not at all (every stage's completion marker is one of these).

    Locally a temporary name is renamed into place: a kill during the write
    must never leave an empty or half marker that a resumed run would trust
    (the signal matrix once kept a part's empty counts file). In an object
    store an object appears whole when its upload completes.
    """
    if not is_local(path):
        _create(path, data)
        return
    temp = _temporary(path)
    _create(temp, data)
    FileSystems.rename([temp], [path])


def _temporary(path: str) -> str:
    """A name to write ``path`` under before it is renamed into place, its own for each writer: a runner may
    run a task twice at once (Beam's DaskRunner computes a side input's upstream again), and two writers of
    one fixed temporary name rename each other's file away. Both write the same bytes; the last rename wins."""
    return f"{path}.{uuid.uuid4().hex[:12]}.partial"


def _create(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` directly, as its file system needs: in S3 one PutObject (Beam's writer makes
    every file a multipart upload, three requests, and S3 refuses one with no parts)."""
    if FileSystems.get_scheme(path) == "s3" and len(data) <= S3_SINGLE_PUT:
        _put_s3_object(path, data)
        return
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(data)


class _LazyFile:
    """A file opened at its first write, so an empty one can be written the way its file system needs."""

    def __init__(self, path: str) -> None:
        self._path, self._handle = path, None

    def write(self, data: bytes) -> None:
        if data:
            if self._handle is None:
                self._handle = FileSystems.create(self._path, compression_type=CompressionTypes.UNCOMPRESSED)
            self._handle.write(data)

    def close(self) -> None:
        if self._handle is None:
            _create(self._path, b"")
        else:
            self._handle.close()


@contextlib.contextmanager
def whole_file(path: str) -> Iterator[_LazyFile]:
    """Write ``path`` so that no reader ever sees half of it: a temporary name, renamed once complete.

    A retried task rewrites the same bytes; a killed or failed one leaves only
    the temporary file. In an object store an object appears whole when its upload
    completes, so it is written in place (a rename there is a copy and a
    delete: three requests instead of one). Empty files work on S3 too (see
    :func:`_put_s3_object`).
    """
    local = is_local(path)
    temp = _temporary(path) if local else path
    handle = _LazyFile(temp)
    try:
        yield handle
    except BaseException:
        if local:  # an unfinished upload is left unfinished: closing it would publish half a file
            handle.close()
        raise
    handle.close()
    if local:
        FileSystems.rename([temp], [path])


# Bytes written in S3 with one PutObject rather than Beam's multipart upload (its minimum part is 5 MiB anyway).
S3_SINGLE_PUT = 16 << 20


def _put_s3_object(path: str, data: bytes) -> None:
    """An object written with one PutObject through the process's client for the same --s3_* options: one
    request where Beam's writer makes three (start, part, complete), and the only way to write an empty one
    (a run with no rejections has an empty ``rejected.jsonl``: S3 refuses a multipart upload of no parts,
    MalformedXML). The object appears whole when the request completes, as a completed upload does."""
    from apache_beam.io.aws.s3io import parse_s3_path

    options = FileSystems.get_filesystem(path)._options  # the --s3_* flags the pipeline was given
    bucket, key = parse_s3_path(path)
    s3_client(options).put_object(Bucket=bucket, Key=key, Body=data)


def read_text(path: str) -> str:
    with FileSystems.open(path) as handle:
        return handle.read().decode("utf-8")


def remove_folder(path: str) -> None:
    """Delete a folder and everything in it, on disk or in an object store (where it is a prefix)."""
    if is_local(path):
        shutil.rmtree(local_path(path), ignore_errors=True)
        return
    if list_names(path):
        FileSystems.delete([path.rstrip("/") + "/"])

