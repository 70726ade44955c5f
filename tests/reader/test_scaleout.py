"""Reading across processes: a real tf.data service cluster, and MultiWorkerMirroredStrategy workers."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import time

import pytest

from tests.reader import forked

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}  # added to this process's environment for each forked process


def _wait_for_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port}")


@pytest.fixture
def data_service():
    """A DispatchServer and two WorkerServers, each its own process (``python -m reader.service``, forked from one
    that imported TensorFlow once: tests/reader/forked.py), on loopback."""
    dispatcher_port = _free_port()
    procs = [forked.start([sys.executable, "-m", "reader.service", "dispatcher", "--port", str(dispatcher_port)],
                          env=_ENV)]
    _wait_for_port(dispatcher_port)
    for _ in range(2):
        port = _free_port()
        procs.append(forked.start(
            [sys.executable, "-m", "reader.service", "worker", "--dispatcher", f"localhost:{dispatcher_port}",
             "--port", str(port)], env=_ENV))
        _wait_for_port(port)
    try:
        yield f"grpc://localhost:{dispatcher_port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
            proc.result()


def _image_hashes(dataset) -> list[str]:
    return [hashlib.sha256(image.tobytes()).hexdigest()
            for images, _ in dataset.as_numpy_iterator() for image in images]


def test_an_eval_epoch_through_the_tf_data_service_yields_every_record_once(demo_dataset, data_service):
    import tensorflow as tf

    import reader

    local = reader.build_dataset(demo_dataset, "train", batch_size=8, image_size=32, training=False, dtype=tf.uint8)
    served = reader.build_dataset(demo_dataset, "train", batch_size=8, image_size=32, training=False, dtype=tf.uint8,
                                  options={"service": data_service})
    expected = _image_hashes(local)
    got = _image_hashes(served)
    assert len(got) == len(expected) == 72
    assert sorted(got) == sorted(expected)  # every record exactly once

    training = reader.build_dataset(demo_dataset, "train", batch_size=8, image_size=32, seed=1, options={"service": data_service})
    batches = list(training.take(12))  # more than one epoch's worth of training batches
    assert len(batches) == 12 and batches[0][0].shape == (8, 32, 32, 3)


_WORKER = """
import json, os, sys, hashlib
import tensorflow as tf
import reader

strategy = tf.distribute.MultiWorkerMirroredStrategy()
data_dir, out = sys.argv[1], sys.argv[2]
ds = reader.distributed_dataset(strategy, data_dir, "train", batch_size=8, image_size=32, training=False,
                                dtype=tf.uint8)
hashes = []
for images, labels in ds:
    for local in strategy.experimental_local_results(images):
        hashes += [hashlib.sha256(image.tobytes()).hexdigest() for image in local.numpy()]
with open(out, "w") as handle:
    json.dump(hashes, handle)
"""


def test_multi_worker_mirrored_strategy_workers_read_disjoint_sets_that_cover_the_split(demo_dataset, tmp_path):
    import tensorflow as tf

    import reader

    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    procs = []
    for index in range(2):  # each worker a process of its own, forked (tests/reader/forked.py)
        env = {**_ENV, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        procs.append(forked.start([sys.executable, str(script), demo_dataset, str(tmp_path / f"w{index}.json")],
                                  env=env))
    for proc in procs:
        proc.wait(timeout=600)
        assert proc.returncode == 0, proc.result().stderr[-3000:]
    seen = [json.loads((tmp_path / f"w{index}.json").read_text()) for index in range(2)]
    expected = _image_hashes(reader.build_dataset(demo_dataset, "train", batch_size=8, image_size=32, training=False,
                                                  dtype=tf.uint8))
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(expected)
