"""Local workers forked from the launcher, so they do not import Beam again.

In: a launcher process (``python -m converter``) that has imported Beam and the
converter's stages. Out: :func:`worker_command`, the command Beam's local runner
runs for each worker, or ``None`` when workers are started the usual way.

A local multi-processing run starts one worker process per core, and each one
imported Beam before reading an image: about 2.3 s of CPU per worker (a
2,000-image run on 2 cores spent 11 s of CPU where the same run in one process
spent 6). Here the CLI forks a *zygote* from its own process right after Beam
loads, while the process has no thread of its own yet and has opened no gRPC
channel (forking after either is unsafe). When the runner starts a worker, the
command it runs is a stand-in (``worker_stand_in.py``, standard library only,
milliseconds to start) that hands the zygote its environment and its stdin,
stdout and stderr; the zygote forks the worker, which runs Beam's SDK harness
as ``python -m beam_jobs.runtime.local_worker`` would, and reports its exit
status back for the stand-in to exit with. Beam's runner, and our stop signals,
see the stand-in as the worker: when it dies the worker sees its connection
close and exits; when the launcher dies the kernel kills the zygote and, through
it, the workers (``PR_SET_PDEATHSIG``).

Only the CLI forks: a library caller's process (a notebook, the test process)
may hold threads or gRPC state we cannot see, so its workers start as before.
Linux only (the death signal and fd passing); elsewhere workers start as before,
and so they do with ``IMGSHARDS_FORK_WORKERS=0`` in the environment (a way out
should a process's own start-up, a ``sitecustomize`` say, make forking unsafe).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shlex
import signal
import socket
import struct
import sys
import time
import traceback
from typing import NamedTuple, Optional

from beam_jobs.runtime import local_worker

logger = logging.getLogger(__name__)

ENV = "IMGSHARDS_FORK_WORKERS"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Zygote(NamedTuple):
    pid: int
    end: int  # the pipe whose closing tells it to end
    address: str  # its socket, in the abstract namespace


_zygote: Optional[_Zygote] = None  # once forked, in the launcher


def start_zygote() -> bool:
    """Fork the zygote that local workers are forked from; True when it runs.

    Call from the process's own entry point, after Beam and the stages are
    imported and before any thread or pipeline starts. Idempotent.
    """
    global _zygote
    if _zygote is not None:
        return True
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds") or os.environ.get(ENV) == "0":
        return False
    address = f"\0imgshards-workers-{os.getpid()}-{os.urandom(6).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
        listener.listen(64)
        end_read, end_write = os.pipe()
    except OSError as err:  # out of file descriptors, say: workers that import Beam still work
        listener.close()
        logger.info("workers start as processes of their own: %s", err)
        return False
    launcher = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a terminal gone after SIGHUP
            stream.flush()  # or the zygote's copy of a buffer would be written twice
    # A stop signal between the fork and the zygote ignoring it would run the launcher's handler there.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pid = os.fork()
    except OSError as err:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        listener.close()
        os.close(end_read)
        os.close(end_write)
        logger.info("workers start as processes of their own: could not fork (%s)", err)
        return False
    if pid == 0:
        os.close(end_write)
        _zygote_main(listener, end_read, launcher, blocked)  # never returns
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    listener.close()
    os.close(end_read)
    _zygote = _Zygote(pid, end_write, address)
    return True


def stop_zygote(timeout_s: float = 5.0) -> None:
    """End the zygote and wait for it, so the CPU time of its workers is counted as this process's children's
    (as a worker process's of its own would be). A launcher killed outright takes the zygote with it anyway."""
    global _zygote
    if _zygote is None:
        return
    pid, end_write, _ = _zygote
    _zygote = None
    os.close(end_write)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def worker_command() -> Optional[str]:
    """The shell command that starts one forked worker, or None when no zygote runs in this process."""
    if _zygote is None:
        return None
    stand_in = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_stand_in.py")
    # -S -E: the stand-in needs only the standard library, and starts in milliseconds without site.
    return (f"exec {shlex.quote(sys.executable)} -S -E {shlex.quote(stand_in)} "
            f"{shlex.quote(_zygote.address[1:])}")


def _zygote_main(listener: socket.socket, end: int, launcher: int, blocked: set) -> None:
    """The zygote: fork a worker for each stand-in that connects, report each one's exit. Never returns."""
    status = 1
    try:
        for signum in _STOP_SIGNALS:  # the launcher alone handles a stop (beam_jobs.runtime.interrupt)
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        local_worker.die_with_parent(launcher)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # the launcher's output stays its own; workers get their stand-in's
        os.close(devnull)
        from apache_beam.runners.worker import sdk_worker_main  # noqa: F401 - imported once, for every worker

        _serve(listener, end, launcher)
        status = 0
    except BaseException:  # noqa: BLE001 - the zygote must never unwind into the launcher's code
        traceback.print_exc()
    finally:
        os._exit(status)


def _serve(listener: socket.socket, end: int, launcher: int) -> None:
    """Accept stand-ins and fork their workers; send each stand-in its worker's exit status. Returns when
    the launcher closes ``end``, once every worker is gone (any still running is killed then)."""
    workers: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(end, selectors.EVENT_READ)
    ending = False
    while not ending or workers:
        for key, _ in selector.select(timeout=0.1):
            if key.fileobj == end:
                ending = True
                selector.unregister(end)
                for pid in workers:
                    os.kill(pid, signal.SIGKILL)
                continue
            connection, _ = listener.accept()
            if not _started_by(connection, launcher):
                connection.close()
                continue
            pid = _fork_worker(listener, connection, workers)
            if pid:
                workers[pid] = connection
        while workers:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            connection = workers.pop(pid, None)
            if connection is not None:
                try:
                    connection.sendall(struct.pack("!i", os.waitstatus_to_exitcode(wait_status)))
                except OSError:
                    pass  # the stand-in is gone already
                connection.close()


def _started_by(connection: socket.socket, launcher: int) -> bool:
    """Whether the process at the other end is a stand-in the launcher started (its child, as the same user).

    An abstract socket has no file permissions and its name is listed in /proc/net/unix: any local
    process could connect, and a worker runs whatever its control service sends it.
    """
    pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    parent = int(stat[stat.rfind(b")") + 2:].split()[1])
    if uid != os.getuid() or parent != launcher:
        print(f"imgshards: refused a worker request from process {pid}, which this run did not start",
              file=sys.stderr)
        return False
    return True


def _fork_worker(listener: socket.socket, connection: socket.socket, workers: dict) -> int:
    """Read a stand-in's request and fork its worker; the worker's pid, or 0 when the request was cut."""
    try:
        header, fds, _, _ = socket.recv_fds(connection, 4, 3)
        if len(header) != 4 or len(fds) != 3:
            raise OSError("a worker request without its length or its three streams")
        environment = json.loads(_receive_exactly(connection, struct.unpack("!I", header)[0]))
    except (OSError, ValueError) as err:
        print(f"imgshards: could not start a forked worker: {err}", file=sys.stderr)
        connection.close()
        return 0
    pid = os.fork()
    if pid == 0:
        _worker_main(listener, connection, fds, environment, workers)  # never returns
    for fd in fds:
        os.close(fd)
    return pid


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(min(size - len(data), 1 << 16))
        if not chunk:
            raise OSError("the stand-in closed its request early")
        data += chunk
    return data


def _worker_main(listener: socket.socket, connection: socket.socket, fds: list, environment: dict,
                 others: dict) -> None:
    """A forked worker: the stand-in's streams and environment, then the SDK harness. Never returns."""
    status = 1
    try:
        listener.close()
        for other in others.values():
            other.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(environment)
        sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_worker.py")]
        root = logging.getLogger()
        for handler in list(root.handlers):  # the launcher's handlers: the worker sets up its own
            root.removeHandler(handler)
        _exit_with_stand_in(connection)
        local_worker.main()
        status = 0
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:  # noqa: BLE001 - a worker's failure is its exit status, as a process's would be
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def _exit_with_stand_in(connection: socket.socket) -> None:
    """The worker ends when its stand-in does (Beam's runner or a stop killed it): its connection closes."""
    import threading

    def watch() -> None:
        try:
            while connection.recv(1):
                pass
        except OSError:
            pass
        os._exit(1)

    threading.Thread(target=watch, name="stand-in-watch", daemon=True).start()
