"""A real S3 endpoint on loopback: moto's server mode, started as its own process.

Beam's S3 filesystem and boto3 talk HTTP to it exactly as they would to AWS;
nothing is patched. One server per test session; each test uses its own bucket.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


def start() -> tuple[subprocess.Popen, S3Server]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2)
            return proc, S3Server(endpoint)
        except urllib.error.HTTPError:
            return proc, S3Server(endpoint)  # it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto's S3 server did not start on {endpoint}") from None
            time.sleep(0.2)
