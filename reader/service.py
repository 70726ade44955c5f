"""Start a tf.data service cluster: ``python -m reader.service dispatcher|worker``.

A dispatcher hands out work; workers run the input pipelines (read, decode,
augment, batch) and stream batches to trainers, which pass
``service="grpc://HOST:PORT"`` to :func:`reader.build_dataset`::

    python -m reader.service dispatcher --port 5050
    python -m reader.service worker --dispatcher localhost:5050 --port 5051   # on each CPU host

Workers need TensorFlow and read access to the shards, not this package: the
pipeline travels to them as a serialized graph.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import tensorflow as tf


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reader.service", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    dispatcher = sub.add_parser("dispatcher", help="run the dispatcher")
    dispatcher.add_argument("--port", type=int, required=True)
    dispatcher.add_argument("--work-dir", default=None, help="fault-tolerance journal folder (default: none)")
    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("--dispatcher", required=True, help="HOST:PORT of the dispatcher")
    worker.add_argument("--port", type=int, required=True)
    worker.add_argument("--address", default="localhost", help="host name trainers use to reach this worker")
    args = parser.parse_args(argv)
    if args.role == "dispatcher":
        config = tf.data.experimental.service.DispatcherConfig(
            port=args.port, work_dir=args.work_dir, fault_tolerant_mode=args.work_dir is not None)
        server = tf.data.experimental.service.DispatchServer(config)
    else:
        config = tf.data.experimental.service.WorkerConfig(
            dispatcher_address=args.dispatcher, worker_address=f"{args.address}:{args.port}", port=args.port)
        server = tf.data.experimental.service.WorkerServer(config)
    print(f"{args.role} serving on port {args.port}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
