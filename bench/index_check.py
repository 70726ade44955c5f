"""What the reader's record-index check costs when a pipeline is built: ``python -m bench.index_check``.

A split of 1,024 shards (the ``--shards auto`` count of an ImageNet-sized split), each with its ``.idx``,
locally and in S3 (moto's server on loopback). Timed: :func:`reader.record_index.usable` (one listing of
the folder, sizes compared with the manifest's), against reading every index, the check it replaces.
Results go to ``bench/results/index_check.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import tempfile
import time

from reader import record_index, storage
from reader.info import ShardInfo, SplitInfo

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "index_check.json")
RECORDS_PER_SHARD = 1250  # ImageNet's train split in 1,024 shards


def _index_text() -> bytes:
    lines, offset = [], 0
    for record in range(RECORDS_PER_SHARD):
        size = 100_000 + record
        lines.append(f"{offset} {size}\n")
        offset += size
    return "".join(lines).encode("ascii")


def _split(folder: str, shards: int, index_bytes: int) -> SplitInfo:
    infos = tuple(ShardInfo(f"{folder}/train-{i:05d}-of-{shards:05d}.tfrecord", RECORDS_PER_SHARD, 1, "",
                            f"{folder}/train-{i:05d}-of-{shards:05d}.tfrecord.idx", index_bytes)
                  for i in range(shards))
    return SplitInfo("train", shards * RECORDS_PER_SHARD, shards, infos, ())


def _time(function, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def _measure(folder: str, shards: int, rounds: int, write) -> dict:
    index = _index_text()
    for shard in _split(folder, shards, len(index)).shards:
        write(shard.path, b"x")
        write(shard.index_path, index)
    split = _split(folder, shards, len(index))
    check = _time(lambda: record_index.usable(split), rounds)
    read_all = _time(lambda: [storage.read_bytes(s.index_path) for s in split.shards], 1)
    return {"shards": shards, "check_s": round(check, 4), "read_every_index_s": round(read_all, 3),
            "index_bytes_each": len(index)}


def _local(shards: int, rounds: int) -> dict:
    def write(path, data):
        with open(path, "wb") as handle:
            handle.write(data)

    with tempfile.TemporaryDirectory() as folder:
        return _measure(folder, shards, rounds, write)


def _s3(shards: int, rounds: int) -> dict:
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        storage.configure_s3(endpoint_url=env["AWS_ENDPOINT_URL"])

        def write(path, data):
            client.put_object(Bucket="bench", Key=path[len("s3://bench/"):], Body=data)

        return _measure("s3://bench/dataset", shards, rounds, write)
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = {"local": _local(args.shards, args.rounds), "s3 (moto on loopback)": _s3(args.shards, args.rounds)}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as handle:
        json.dump(results, handle, indent=2)
    for where, numbers in results.items():
        print(f"{where}: check {numbers['check_s'] * 1000:.1f} ms for {numbers['shards']} shards "
              f"(reading every index instead: {numbers['read_every_index_s']:.2f} s)")


if __name__ == "__main__":
    main()
