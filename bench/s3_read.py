"""``python -m bench.s3_read``: the reader on shards in S3 against the same shards on local disk.

    python -m bench.s3_read --images 3000 --rounds 3 --out /tmp/bench-s3

The S3 endpoint is moto's server on loopback (``pip install ".[bench]"``): a
real HTTP S3 API, but one written in Python and sharing this machine's cores
with the reader, so S3 here is slower than a real bucket over a fast network;
the ratio is a floor, not a forecast. Two measurements, alternating rounds:
records only (read + parse, what the storage layer costs) and the training
preset at 224 px (what a training job sees, decode included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from bench import convert_bench, data, read_bench

BATCH, SIZE = 64, 224


def _start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint, timeout=2)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.2)
    return proc, endpoint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.s3_read", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)

    proc, endpoint = _start_moto()
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    import boto3
    import tensorflow as tf

    import reader

    work = tempfile.mkdtemp(prefix="imgshards-bench-s3-")
    try:
        data.make_photo_dataset(os.path.join(work, "photos"), args.images, seed=4)
        local = os.path.join(work, "shards")
        convert_bench.timed_run(convert_bench.ours(os.path.join(work, "photos"), local, 16))
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        for name in os.listdir(local):
            client.upload_file(os.path.join(local, name), "bench", f"shards/{name}")
        remote = "s3://bench/shards"

        def records(data_dir):
            def make():
                split = reader.dataset_info(data_dir).split("train")
                files = tf.data.Dataset.from_tensor_slices(
                    (list(split.files), tf.constant([s.num_examples for s in split.shards], tf.int64)))
                stream = reader.interleave_records(files, s3=data_dir.startswith("s3://"))
                return reader.parse_records(stream, batch=BATCH).batch(BATCH).repeat()
            return make

        def train(data_dir):
            return lambda: reader.build_dataset(data_dir, "train", BATCH, SIZE, training=True)

        makers = {"records_local": records(local), "records_s3": records(remote),
                  "train_local": train(local), "train_s3": train(remote)}
        measured = read_bench.alternating_rounds(makers, args.rounds, lambda name: args.batches)
    finally:
        proc.terminate()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "images": args.images, "rounds": args.rounds, "endpoint": "moto server on loopback (same machine)",
        "measured": measured,
        "ratio_s3_over_local": {kind: measured[f"{kind}_s3"]["images_per_s"] / measured[f"{kind}_local"]["images_per_s"]
                                for kind in ("records", "train")},
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "s3_read.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps({k: round(v, 3) for k, v in result["ratio_s3_over_local"].items()}),
          {k: round(v["images_per_s"]) for k, v in measured.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
