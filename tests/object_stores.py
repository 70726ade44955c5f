"""Real object-store servers on loopback, each started as its own process.

S3: moto's server mode. GCS: gcp-storage-emulator. Beam's file systems,
boto3 and google-cloud-storage talk HTTP to them exactly as they would to the
clouds; nothing is patched. One server per test session; each test uses its
own bucket.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

import boto3

KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


@dataclass
class S3Server:
    endpoint: str

    @property
    def flags(self) -> list[str]:
        """The Beam pipeline flags that point the converter at this endpoint."""
        return [f"--s3_endpoint_url={self.endpoint}", f"--s3_access_key_id={KEYS['aws_access_key_id']}",
                f"--s3_secret_access_key={KEYS['aws_secret_access_key']}", f"--s3_region_name={KEYS['region_name']}"]

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS environment variables for the same endpoint (what boto3 and the reader read)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": KEYS["aws_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": KEYS["aws_secret_access_key"], "AWS_DEFAULT_REGION": KEYS["region_name"]}

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, **KEYS)

    def new_bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload(self, folder: str, bucket: str, prefix: str) -> str:
        client = self.client()
        for root, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                client.upload_file(path, bucket, f"{prefix}/{os.path.relpath(path, folder)}")
        return f"s3://{bucket}/{prefix}"

    def record(self) -> None:
        """Start recording the requests the server answers (moto's recorder), forgetting earlier ones."""
        for action in ("reset-recording", "start-recording"):
            urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}",
                                                          method="POST"), timeout=30)

    def recorded(self) -> list[tuple[str, str, str]]:
        """``(method, path, Range header)`` of every request answered since :meth:`record`; stops recording."""
        import json
        from urllib.parse import unquote, urlparse

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/recorder/stop-recording",
                                                      method="POST"), timeout=30)
        with urllib.request.urlopen(f"{self.endpoint}/moto-api/recorder/download-recording", timeout=60) as reply:
            rows = [json.loads(line) for line in reply.read().decode().splitlines() if line.strip()]
        return [(row["method"], unquote(urlparse(row["url"]).path), row["headers"].get("Range", "")) for row in rows]

    def snapshot(self, bucket: str, prefix: str) -> dict[str, bytes]:
        """name (relative to prefix) -> bytes of every object under ``prefix/``."""
        client, found = self.client(), {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            for item in page.get("Contents", []):
                found[item["Key"][len(prefix) + 1:]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(argv: list[str], port: int, what: str, env=None) -> tuple[subprocess.Popen, str]:
    """Start a server process and wait until it answers HTTP on ``port``; returns it and its endpoint."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2)
            return proc, endpoint
        except urllib.error.HTTPError:
            return proc, endpoint  # it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{what} did not start on {endpoint}") from None
            time.sleep(0.2)


def start() -> tuple[subprocess.Popen, S3Server]:
    port = _free_port()
    # Its recorder (off until S3Server.record) writes here, not into the current folder.
    recording = os.path.join(tempfile.mkdtemp(prefix="moto-recording-"), "requests.jsonl")
    proc, endpoint = _serve([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port,
                            "moto's S3 server", env={**os.environ, "MOTO_RECORDER_FILEPATH": recording})
    return proc, S3Server(endpoint)


@dataclass
class GCSEmulator:
    """gcp-storage-emulator's server: the GCS JSON API on loopback. google-cloud-storage (and so Beam's GCS
    file system, which makes an anonymous client when no credentials are configured) talks to it when
    ``STORAGE_EMULATOR_HOST`` names it."""

    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def client(self):
        import os

        from google.cloud import storage

        os.environ.update(self.env)
        client = storage.Client.create_anonymous_client()
        client.project = "test"
        return client

    def new_bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(name)
        return name

    def upload(self, folder: str, bucket: str, prefix: str) -> str:
        target = self.client().bucket(bucket)
        for root, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                target.blob(f"{prefix}/{os.path.relpath(path, folder)}").upload_from_filename(path)
        return f"gs://{bucket}/{prefix}"

    def snapshot(self, bucket: str, prefix: str) -> dict[str, bytes]:
        return {blob.name[len(prefix) + 1:]: blob.download_as_bytes()
                for blob in self.client().list_blobs(bucket, prefix=prefix + "/")}


def start_gcs() -> tuple[subprocess.Popen, GCSEmulator]:
    port = _free_port()
    command = os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    proc, endpoint = _serve([command, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"], port,
                            "the GCS emulator")
    return proc, GCSEmulator(endpoint)
