"""Beam's S3 file system, as the job uses it: one boto3 client per process, the same bytes as before."""

from __future__ import annotations

import io
import random
import threading

import pytest

pytest.importorskip("boto3", reason="the aws extra is not installed: pip install '.[aws]'")

from apache_beam.io.aws import s3filesystem  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from beam_jobs.files import filesystems  # noqa: E402
from beam_jobs.files.filesystems import FileSystems  # noqa: E402


@pytest.fixture()
def s3_options(s3_server):
    """FileSystems pointed at the test's S3 server by the converter's --s3_* flags (restored afterwards)."""
    before = FileSystems._pipeline_options
    FileSystems.set_options(PipelineOptions(s3_server.flags))
    yield s3_server
    FileSystems._pipeline_options = before


def _write(path: str, data: bytes) -> None:
    with FileSystems.create(path) as handle:
        handle.write(data)


def _read(path: str) -> bytes:
    with FileSystems.open(path) as handle:
        return handle.read()


@pytest.mark.e2e
def test_every_s3_call_reuses_the_processs_boto3_client_and_keeps_the_bytes(s3_options):
    bucket = s3_options.new_bucket()
    paths = [f"s3://{bucket}/work/part-{index}" for index in range(3)]
    for index, path in enumerate(paths):
        _write(path, bytes([index]) * (1000 + index))
    assert all(FileSystems.exists(path) for path in paths)
    FileSystems.rename([paths[0]], [paths[0] + ".done"])
    assert _read(paths[0] + ".done") == bytes([0]) * 1000
    FileSystems.delete([paths[0] + ".done"])
    assert not FileSystems.exists(paths[0] + ".done")
    listed = sorted(meta.path for meta in FileSystems.match([f"s3://{bucket}/work/*"])[0].metadata_list)
    assert listed == paths[1:]
    options = FileSystems.get_filesystem(paths[1])._options
    # Beam builds an S3IO per call; they now share one boto3 client for these settings.
    first, second = s3filesystem.s3io.S3IO(options=options), s3filesystem.s3io.S3IO(options=options)
    assert first.client is not second.client  # Beam's per-download state stays per call
    assert first.client.client is second.client.client is filesystems.s3_client(options)


@pytest.mark.e2e
def test_files_read_interleaved_in_one_thread_and_across_threads_keep_their_bytes(s3_options):
    """The shared client carries no per-file state: readers switching between objects get their own bytes."""
    bucket = s3_options.new_bucket()
    contents = {f"s3://{bucket}/run-{index}": bytes(range(256)) * (64 + index) for index in range(8)}
    for path, data in contents.items():
        _write(path, data)
    handles = {path: FileSystems.open(path) for path in contents}
    chunks: dict[str, bytes] = {path: b"" for path in contents}
    while any(len(chunks[path]) < len(data) for path, data in contents.items()):
        for path, handle in handles.items():  # a k-way merge's pattern: a little of each in turn
            chunks[path] += handle.read(1000)
    assert chunks == contents

    results: dict[str, bytes] = {}

    def read(path: str) -> None:
        results[path] = _read(path)

    threads = [threading.Thread(target=read, args=(path,)) for path in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == contents


class _CountedFile(io.FileIO):
    """A local file that counts the bytes read from it (what a ranged handle would fetch)."""

    fetched = 0

    def read(self, size=-1):
        data = super().read(size)
        self.fetched += len(data)
        return data


def test_read_ahead_reads_far_apart_headers_narrowly_and_close_ones_in_wide_windows(tmp_path):
    """ImageNet's tar of tars: 1,000 headers 140 MB apart cost 64 KiB each, not 16 MiB; a tar of images, whose
    headers sit 110 KB apart, is read in windows that widen to 16 MiB: a request per 16 MiB, not per header."""
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as handle:
        handle.truncate(12 * 140 << 20)  # no disk: a file of holes
    raw = _CountedFile(sparse)
    with filesystems.ReadAhead(raw) as handle:
        for index in range(12):
            handle.seek(index * 140 << 20)
            assert handle.read(512) == bytes(512)
        assert handle.fetches == 12
    assert raw.fetched == filesystems.ReadAhead.WIDE + 11 * filesystems.ReadAhead.NARROW

    dense = tmp_path / "dense"
    dense.write_bytes(random.Random(0).randbytes(48 << 20))
    raw = _CountedFile(dense)
    with filesystems.ReadAhead(raw) as handle:
        handle.seek(30 << 20)  # a jump (the window narrows), then headers every 110 KB to the end
        for offset in range(30 << 20, 48 << 20, 110 << 10):
            handle.seek(offset)
            handle.read(512)
        assert handle.fetches <= 12
    assert raw.fetched <= (16 << 20) + (48 << 20)


def test_read_ahead_returns_the_files_bytes_at_any_seek(tmp_path):
    data = random.Random(1).randbytes(3 << 20)
    (tmp_path / "file").write_bytes(data)
    rng = random.Random(2)
    with filesystems.ReadAhead(open(tmp_path / "file", "rb")) as handle:  # noqa: SIM115
        assert handle.seek(0, io.SEEK_END) == len(data)
        for _ in range(300):
            offset, size = rng.randrange(len(data) + 10), rng.choice([1, 512, 70_000, 5 << 20])
            handle.seek(offset)
            assert handle.read(size) == data[offset:offset + size] and handle.tell() == min(offset + size, len(data))


@pytest.fixture()
def fresh_gcs_credentials(monkeypatch):
    """Beam's per-process credentials cache, empty for the test and put back after it."""
    auth = pytest.importorskip("apache_beam.internal.gcp.auth", reason="the gcp extra is not installed")
    credentials = auth._Credentials
    monkeypatch.setattr(credentials, "_credentials_init", False)
    monkeypatch.setattr(credentials, "_credentials", None)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    return credentials


def test_gcs_connects_anonymously_at_once_with_no_auth_or_the_emulator_and_is_left_alone_otherwise(
        fresh_gcs_credentials, monkeypatch):
    """Beam would otherwise retry Google's default credentials for ~25 s in every process first."""
    filesystems.gcs_anonymous_when_asked(no_auth=False)
    assert fresh_gcs_credentials._credentials_init is False  # neither asked: Beam looks for credentials itself
    filesystems.gcs_anonymous_when_asked(no_auth=True)
    assert fresh_gcs_credentials._credentials_init is True and fresh_gcs_credentials._credentials is None
    monkeypatch.setattr(fresh_gcs_credentials, "_credentials_init", False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    filesystems.gcs_anonymous_when_asked()
    assert fresh_gcs_credentials.get_service_credentials(PipelineOptions([])) is None
