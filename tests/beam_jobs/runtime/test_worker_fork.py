"""``python -m converter`` forks its local workers instead of starting processes that import Beam again.

The workers' output is the same bytes as workers started as processes of their
own (the library's path, which forks nothing); the launcher's stand-ins are the
workers as far as Beam's runner and a stop are concerned; a launcher killed
outright takes the zygote and every worker with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import REPO, processes_marked, run_converter


def _shards(folder) -> dict:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder)) if name != "manifest.json"}


def _tree(root: int) -> dict[int, tuple[int, str]]:
    """``pid -> (parent pid, command line)`` of every process below ``root``."""
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry)] = (int(stat[stat.rfind(b")") + 2:].split()[1]), command)
    below, stack = {}, [root]
    while stack:
        parent = stack.pop()
        for pid, (ppid, command) in table.items():
            if ppid == parent:
                below[pid] = (ppid, command)
                stack.append(pid)
    return below


def _start(src: str, out: str, marker: str, fault: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO, "IMGSHARDS_FAULT": fault, "IMGSHARDS_FORK_TEST": marker}
    return subprocess.Popen([sys.executable, "-m", "converter", "--src", src, "--out", out, "--shards", "2",
                             "--direct_num_workers=2", "--no-progress"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_workers(proc: subprocess.Popen, count: int) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        tree = _tree(proc.pid)
        if sum("worker_stand_in.py" in command for _, command in tree.values()) == count and len(tree) >= 2 * count + 1:
            return tree
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no {count} workers after 120 s: {_tree(proc.pid)}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers are Linux's (PR_SET_PDEATHSIG)")
def test_the_commands_workers_are_forked_from_its_launcher_and_write_the_bytes_of_workers_of_their_own(
        tmp_path, demo_src):
    marker = uuid.uuid4().hex
    forked = str(tmp_path / "forked")
    # Each worker pauses after its first part, so the process tree can be read while the run is live.
    proc = _start(demo_src, forked, marker, "sleep:1@part-validated")
    tree = _wait_for_workers(proc, 2)
    launcher_children = {pid for pid, (ppid, _) in tree.items() if ppid == proc.pid}
    zygotes = [pid for pid in launcher_children if "worker_stand_in.py" not in tree[pid][1]]
    assert len(zygotes) == 1, tree  # the zygote, beside the two stand-ins Beam's runner started
    workers = [pid for pid, (ppid, _) in tree.items() if ppid == zygotes[0]]
    assert len(workers) == 2, tree
    assert not any("local_worker" in command for _, command in tree.values()), tree  # no worker imported Beam anew
    # Any local process can reach an abstract socket: the zygote forks only for stand-ins its launcher started.
    name = next(command.split()[-1] for _, command in tree.values() if "worker_stand_in.py" in command)
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect("\0" + name)
    request = json.dumps({"CONTROL_API_SERVICE_DESCRIPTOR": "url: 'localhost:1'"}).encode()
    try:
        socket.send_fds(stranger, [struct.pack("!I", len(request))], [0, 1, 2])
        stranger.sendall(request)
    except OSError:
        pass  # closed already
    try:
        reply = stranger.recv(4)
    except ConnectionResetError:  # closed with the request unread
        reply = b""
    assert reply == b""  # refused: closed without a worker or an exit status
    stranger.close()
    assert len([pid for pid, (ppid, _) in _tree(proc.pid).items() if ppid == zygotes[0]]) <= 2
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "refused a worker request from process" in stderr
    assert not processes_marked(marker)  # the zygote ended with the run

    apart = str(tmp_path / "apart")  # in this process: the library's path, whose workers are processes of their own
    run_converter("--src", demo_src, "--out", apart, "--shards", "2", "--direct_num_workers=2", "--no-progress",
                  check=True)
    assert _shards(forked) == _shards(apart)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers are Linux's (PR_SET_PDEATHSIG)")
def test_a_launcher_killed_outright_takes_its_zygote_and_every_forked_worker_with_it(tmp_path, demo_src):
    marker = uuid.uuid4().hex
    proc = _start(demo_src, str(tmp_path / "out"), marker, "sleep:30@part-validated")
    _wait_for_workers(proc, 2)
    os.kill(proc.pid, signal.SIGKILL)  # as the OOM killer does: nothing of the launcher's runs
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while processes_marked(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_marked(marker), "processes of the killed run are still alive"


def test_forking_is_turned_off_by_the_environment(monkeypatch):
    from beam_jobs.runtime import worker_fork

    monkeypatch.setenv(worker_fork.ENV, "0")
    assert worker_fork.start_zygote() is False
    assert worker_fork.worker_command() is None  # the runner starts workers that import Beam, as before
