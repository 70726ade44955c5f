"""The converter on a real Dask cluster (scheduler and two workers on loopback) through Beam's DaskRunner."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, run_converter

pytestmark = pytest.mark.e2e  # every test here runs the command line, a subprocess or a server

distributed = pytest.importorskip("distributed", reason="the dask extra is not installed: pip install '.[dask]'")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """``dask scheduler`` + two ``dask worker`` processes on 127.0.0.1, shared by the module's tests (each starts
    its own runs on it; a cluster's start costs each worker an import of Beam); yields the scheduler address.

    Every process gets its own ``PYTHONHASHSEED``, as on a real cluster: Beam's
    Dask groupby once split string keys across workers whose seeds differ
    (apache/beam#29365), so the test must not hide that by sharing one.
    Workers run without a nanny, because the nanny starts every worker process
    with the same seed (distributed's ``nanny.pre-spawn-environ``), which
    would hide it too.
    """
    tmp_path = tmp_path_factory.mktemp("dask")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": REPO}
    bindir = os.path.dirname(sys.executable)
    procs = [subprocess.Popen([os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], env={**env, "PYTHONHASHSEED": "101"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    for index in range(2):
        procs.append(subprocess.Popen(
            [os.path.join(bindir, "dask"), "worker", address, "--nthreads", "1", "--name", f"w{index}", "--no-nanny",
             "--no-dashboard", "--local-directory", str(tmp_path / f"w{index}")],
            env={**env, "PYTHONHASHSEED": str(202 + index)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    client = distributed.Client(address, timeout=60)
    try:
        client.wait_for_workers(2, timeout=60)
        yield address, client
    finally:
        client.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # a worker without a nanny can linger closing its comms
                proc.kill()
                proc.wait(timeout=30)


def test_conversion_on_a_dask_cluster_matches_the_direct_runner_byte_for_byte(tmp_path, demo_src, dask_cluster):
    address, client = dask_cluster
    common = ["--src", demo_src, "--shards", "4", "--val-fraction", "0.2", "--no-progress"]
    before = client.run(lambda dask_worker: dask_worker.state.transition_counter)  # the cluster is the module's
    started = time.time()
    # Dask cuts the work into small parts (many parts, key buckets and hash ranges), the direct runner
    # into its default: the bytes must not depend on it.
    run_converter(*common, "--out", str(tmp_path / "dask"), "--runner=dask", f"--dask_client_address={address}",
                  "--part-size", "37", check=True, timeout=600)
    run_converter(*common, "--out", str(tmp_path / "direct"), check=True)

    # The workers hash strings differently, as processes on different machines do.
    assert len(set(client.run(lambda: hash("train")).values())) == 2
    # The work ran on the cluster: both workers executed tasks of this run.
    transitions = client.run(lambda dask_worker: dask_worker.state.transition_counter)
    assert len(transitions) == 2 and all(count > before.get(worker, 0) for worker, count in transitions.items()), \
        (before, transitions)
    assert time.time() - started < 600

    def shards(folder):
        return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder)) if name.endswith(".tfrecord")}

    dask_shards = shards(tmp_path / "dask")
    assert len(dask_shards) == 5
    assert dask_shards == shards(tmp_path / "direct")
    for name in ("labels.txt", "rejected.jsonl", "duplicates.jsonl"):
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes()
    manifests = [json.loads((tmp_path / run / "manifest.json").read_text()) for run in ("dask", "direct")]
    for manifest in manifests:
        del manifest["created"], manifest["written_by"], manifest["options"]["out"], manifest["options"]["part_size"]
    assert manifests[0] == manifests[1]


def test_archives_hub_parquet_and_coco_convert_on_a_dask_cluster_to_the_bytes_of_a_local_run(tmp_path, demo_src,
                                                                                              dask_cluster):
    """A tar holding class tars (their headers and members read by offset in the workers) and a .tar.gz class
    (inflated into the work folder by the launcher, read there by the workers) on Dask: the bytes of the
    extracted folder, direct runner. A Hugging Face snapshot (row groups read by the workers): the bytes of
    its local run."""
    from tests.archive_data import tar_folder
    from tests.converter.test_archives import dataset_contents

    address, _ = dask_cluster
    packed = tmp_path / "packed"
    packed.mkdir()
    tar_folder(os.path.join(demo_src, "circle"), packed / "circle.tar")
    tar_folder(os.path.join(demo_src, "square"), packed / "square.tar")
    tar_folder(os.path.join(demo_src, "triangle"), packed / "triangle.tar.gz", "w:gz")
    src = tar_folder(packed, tmp_path / "shapes.tar")
    common = ["--shards", "3", "--val-fraction", "0.2", "--part-size", "37", "--no-progress"]
    run_converter("--src", src, "--out", str(tmp_path / "dask"), *common, "--archive-scan", "workers",
                  "--runner=dask", f"--dask_client_address={address}", check=True, timeout=600)
    run_converter("--src", demo_src, "--out", str(tmp_path / "direct"), *common, check=True)
    dask, direct = dataset_contents(tmp_path / "dask"), dataset_contents(tmp_path / "direct")
    for contents in (dask, direct):
        del contents["manifest.json"]["written_by"]
    assert dask == direct

    from tests import hub_data

    hub_data.hub_snapshot(str(tmp_path / "beans"))
    dask, direct = _on_dask_and_direct(tmp_path, "beans", address)
    assert dask == direct

    # A COCO tree: objects travel with their images through the work files of any runner.
    from converter.demo import write_object_demo

    write_object_demo(str(tmp_path / "coco"), "coco", images=40, seed=3)
    dask, direct = _on_dask_and_direct(tmp_path, "coco", address)
    assert dask == direct and dask["manifest.json"]["task"] == "objects"


def _on_dask_and_direct(tmp_path, name: str, address: str) -> tuple[dict, dict]:
    """``tmp_path/name`` converted on the cluster and on the direct runner: each dataset's contents, the
    manifest without the runner it names."""
    from tests.converter.test_archives import dataset_contents

    found = []
    for out, flags in ((f"{name}-dask", ["--runner=dask", f"--dask_client_address={address}"]),
                       (f"{name}-direct", [])):
        run_converter("--src", str(tmp_path / name), "--out", str(tmp_path / out), "--shards", "2",
                      "--part-size", "7", "--no-progress", *flags, check=True, timeout=600)
        contents = dataset_contents(tmp_path / out)
        del contents["manifest.json"]["written_by"]
        found.append(contents)
    return found[0], found[1]

