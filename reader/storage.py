"""Where the reader gets bytes: TensorFlow's file systems, and S3, which TensorFlow no longer reads.

TensorFlow reads local paths and ``gs://`` itself. Its ``s3://`` file system
moved to tensorflow-io, whose plugin stops at older TensorFlow releases, so
``s3://`` datasets are read here with boto3 (the ``.[aws]`` extra): the
manifest and listings directly, and shards as a stream of records that feeds
the same tf.data pipeline (:func:`s3_records`). boto3 finds the endpoint and
credentials the usual way: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` and the
rest of the environment, ``~/.aws``, or an instance role.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import BinaryIO, Iterator, Optional

import tensorflow as tf

from record_files import idx
from record_files.tfrecord import FrameError, read_frames

S3 = "s3://"
_STREAM_CHUNK = 1 << 20  # bytes per read from an S3 response body
_THREAD = threading.local()
_LOCK = threading.Lock()


def is_s3(path: str) -> bool:
    return path.startswith(S3)


def exists(path: str) -> bool:
    if not is_s3(path):
        return tf.io.gfile.exists(path)
    client, (bucket, key) = _client(), _split(path)
    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except client.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def read_bytes(path: str) -> bytes:
    """The whole file (raises FileNotFoundError naming it when missing)."""
    if not is_s3(path):
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read()
    client, (bucket, key) = _client(), _split(path)
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        raise FileNotFoundError(f"{path} does not exist") from None


@contextlib.contextmanager
def open_read(path: str) -> Iterator[BinaryIO]:
    """A file object to ``read(n)`` from, front to back (for S3, the object's response stream)."""
    if not is_s3(path):
        with tf.io.gfile.GFile(path, "rb") as handle:
            yield handle
        return
    client, (bucket, key) = _client(), _split(path)
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
    except client.exceptions.NoSuchKey:
        raise FileNotFoundError(f"{path} does not exist") from None
    try:
        yield body
    finally:
        body.close()


def iter_lines(path: str, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a file (without their newline), read ``chunk`` bytes at a time: bounded memory."""
    with open_read(path) as handle:
        rest = b""
        while True:
            data = handle.read(chunk)
            if not data:
                break
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            yield from lines
        if rest:
            yield rest


def size(path: str) -> int:
    if not is_s3(path):
        return tf.io.gfile.stat(path).length
    bucket, key = _split(path)
    return _client().head_object(Bucket=bucket, Key=key)["ContentLength"]


def listdir(folder: str) -> list[str]:
    """Names directly in ``folder`` (for S3: the first path component of every key under the prefix)."""
    if not is_s3(folder):
        return [name.rstrip("/") for name in tf.io.gfile.listdir(folder or ".")]
    bucket, prefix = _split(folder.rstrip("/") + "/")
    names = set()
    for page in _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        names.update(item["Key"][len(prefix):].split("/")[0] for item in page.get("Contents", []))
    return sorted(names)


def tree_size(folder: str) -> tuple[int, float]:
    """Bytes of every file under ``folder``, and the newest one's modification time (seconds since the epoch)."""
    total, newest = 0, 0.0
    if not is_s3(folder):
        for root, _, files in tf.io.gfile.walk(folder):
            for name in files:
                stat = tf.io.gfile.stat(os.path.join(root, name))
                total, newest = total + stat.length, max(newest, stat.mtime_nsec / 1e9)
        return total, newest
    bucket, prefix = _split(folder.rstrip("/") + "/")
    for page in _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            total, newest = total + item["Size"], max(newest, item["LastModified"].timestamp())
    return total, newest


def list_sizes(folder: str) -> dict[str, Optional[int]]:
    """Name -> size of every file directly in ``folder``, from one listing; None where a listing gives no size.

    Local folders are listed with their sizes (a stat each, microseconds);
    S3 lists sizes itself, 1,000 keys per request; TensorFlow's other file
    systems (gs://) list names only. A missing folder lists as empty.
    """
    if is_s3(folder):
        bucket, prefix = _split(folder.rstrip("/") + "/")
        found: dict[str, Optional[int]] = {}
        for page in _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            found.update({item["Key"][len(prefix):]: item["Size"] for item in page.get("Contents", [])})
        return found
    if "://" not in folder or folder.startswith("file://"):
        local = folder[len("file://"):] if folder.startswith("file://") else folder
        try:
            # A folder in a file's place lists with size -1: present, never a usable file of any size.
            return {entry.name: entry.stat().st_size if entry.is_file() else -1 for entry in os.scandir(local or ".")}
        except FileNotFoundError:
            return {}
    try:
        return {name.rstrip("/"): None for name in tf.io.gfile.listdir(folder)}
    except tf.errors.NotFoundError:
        return {}


def read_range(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes of ``path`` from byte ``offset`` (fewer at its end): one ranged request on S3, a seek
    elsewhere."""
    if size <= 0:
        return b""
    if is_s3(path):
        client, (bucket, key) = _client(), _split(path)
        try:
            return client.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{offset + size - 1}")["Body"].read()
        except client.exceptions.NoSuchKey:
            raise FileNotFoundError(f"{path} does not exist") from None
    with tf.io.gfile.GFile(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(size)


def write_bytes(path: str, data: bytes) -> None:
    """Write a whole file (a temporary name renamed into place where the file system can rename)."""
    if is_s3(path):
        bucket, key = _split(path)
        _client().put_object(Bucket=bucket, Key=key, Body=data)
        return
    if "://" in path and not path.startswith("file://"):  # an object store: an object appears whole
        with tf.io.gfile.GFile(path, "wb") as handle:
            handle.write(data)
        return
    temp = path + ".partial"
    with tf.io.gfile.GFile(temp, "wb") as handle:
        handle.write(data)
    tf.io.gfile.rename(temp, path, overwrite=True)


def isdir(path: str) -> bool:
    return bool(listdir(path)) if is_s3(path) else tf.io.gfile.isdir(path)


def s3_records(path: tf.Tensor, skip_missing: bool = False, index_path: "tf.Tensor | str" = "",
               first: "tf.Tensor | int" = 0) -> tf.data.Dataset:
    """The serialized records of one ``s3://`` shard from record ``first``, streamed as TFRecordDataset reads a local one.

    With the shard's record index (``index_path``) the stream starts at the
    record's byte (a ranged GET); without, the records before it are read and dropped.

    A record whose length or data fails its CRC ends the stream, as a corrupt
    record does under ``ignore_errors`` locally, so the caller's record count
    check names the shard. A missing object is an error naming it (with
    ``skip_missing``, a warning and no records).
    """
    return tf.data.Dataset.from_generator(
        _stream, args=(path, skip_missing, index_path, tf.cast(first, tf.int64)),
        output_signature=tf.TensorSpec([], tf.string))


def _stream(path: bytes, skip_missing: bool, index_path: bytes = b"", first: int = 0) -> Iterator[bytes]:
    url = path.decode("utf-8")
    client, (bucket, key) = _client(), _split(url)
    offset = 0
    if first and index_path:  # "offset size" per record; a lost or damaged index: read through instead
        try:
            offset = idx.offset_of(read_bytes(index_path.decode("utf-8")), first) or 0
        except FileNotFoundError:
            offset = 0
    skip = 0 if offset or not first else first
    ranged = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        body = client.get_object(Bucket=bucket, Key=key, **ranged)["Body"]
    except client.exceptions.NoSuchKey:
        message = f"shard {url} is listed in the manifest but does not exist"
        if skip_missing:
            print(f"WARNING: skipping {message} (all its records)", file=sys.stderr)
            return
        raise FileNotFoundError(message) from None
    # A damaged or cut frame ends the stream, as a corrupt record does under ignore_errors locally: the
    # caller's record count check then names the shard.
    try:
        for frame in read_frames(_Chunks(body.iter_chunks(_STREAM_CHUNK)), url):
            if skip:
                skip -= 1
            else:
                yield frame.data
    except FrameError:
        return


class _Chunks:
    """``read(n)`` over an iterator of byte chunks (an S3 response body read 1 MiB at a time)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""
        self._start = 0

    def read(self, size: int) -> bytes:
        while len(self._buffer) - self._start < size:
            chunk = next(self._chunks, b"")
            if not chunk:
                break
            self._buffer, self._start = self._buffer[self._start:] + chunk, 0
        data = self._buffer[self._start:self._start + size]
        self._start += len(data)
        return data


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url[len(S3):].partition("/")
    return bucket, key


_CLIENT_OPTIONS: dict = {}


def configure_s3(endpoint_url: Optional[str] = None, access_key_id: Optional[str] = None,
                 secret_access_key: Optional[str] = None, session_token: Optional[str] = None,
                 region_name: Optional[str] = None, verify: Optional[object] = None,
                 use_ssl: Optional[bool] = None) -> None:
    """Point the reader's S3 client somewhere else than the AWS environment says; call before reading.

    What the converter's ``--s3_*`` flags (Beam's) set, for ``verify`` and
    ``inspect`` to take the same flags. None leaves a setting to boto3.
    """
    given = {"endpoint_url": endpoint_url, "aws_access_key_id": access_key_id,
             "aws_secret_access_key": secret_access_key, "aws_session_token": session_token,
             "region_name": region_name, "verify": verify, "use_ssl": use_ssl}
    _CLIENT_OPTIONS.clear()
    _CLIENT_OPTIONS.update({key: value for key, value in given.items() if value is not None})
    _THREAD.__dict__.pop("client", None)


def _client():
    """One boto3 client per thread, made under a lock (a boto3 session is not thread-safe)."""
    client = getattr(_THREAD, "client", None)
    if client is None:
        with _LOCK:
            client = _THREAD.client = _session().client("s3", **_CLIENT_OPTIONS)
    return client


@functools.lru_cache(maxsize=1)
def _session():
    try:
        import boto3
    except ImportError:
        raise ImportError("reading s3:// needs boto3: pip install 'imgshards[aws]' (or pip install boto3)") from None
    return boto3.session.Session()
