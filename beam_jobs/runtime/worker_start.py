"""Local workers started from Python's ``multiprocessing`` forkserver, with Beam already imported.

Each local worker process used to import Beam before reading an image (2-3 s of
CPU; docs/design.md, "Who converts a small run"). The launcher now starts the
standard library's forkserver as soon as it knows the run is local
(:func:`start_early`), and stops it when the run returns (:func:`stop`; a notebook's kernel would otherwise keep a
process with Beam loaded for its life): a fresh ``python`` (exec'd, so none of the launcher's
threads or descriptors) that imports Beam's SDK harness and the stages once,
while the launcher lists SRC. Each worker is then forked from it, already
loaded, and runs :func:`beam_jobs.runtime.local_worker.main` as the command
line version does: the same environment (the launcher's, as it is when the
worker starts, and the runner's channels), working folder, stdout and stderr,
stop signals ignored, dying with its parent.

Beam's runner starts local workers through the handler registered for its
subprocess environment; ``worker_handler.ForkedOrSubprocessHandler`` takes that place
and forks only the command :mod:`beam_jobs.runtime.runners` gives our own
workers (:data:`FORKED_COMMAND`), when the forkserver runs (:func:`running`).
Any other command (another pipeline of the caller's, or no forkserver on this
platform or for this program) starts as Beam starts it. This module imports
no Beam, so the CLI starts the forkserver before the launcher's own import.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing import reduction
from typing import Iterator, Optional, Sequence

from beam_jobs.runtime import work_size

logger = logging.getLogger(__name__)

# What the forkserver imports once for all workers: first the stop signals ignored, then Beam's harness (most of
# the 2-3 s) and the stages.
PRELOAD = ["beam_jobs.runtime.forkserver_signals", "apache_beam.runners.worker.sdk_worker_main",
           "beam_jobs.runtime.local_worker", "beam_jobs.transforms"]
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
_context: Optional[multiprocessing.context.BaseContext] = None
# The forkserver start_early started (None: none, or the caller's own ran already) and the preload it replaced.
_started_pid: Optional[int] = None
_preload_before: Optional[list[str]] = None
# The worker command (runners.py) that a forked worker stands in for; set by runners at import.
FORKED_COMMAND: Optional[str] = None


def start_for(src: Optional[str], pipeline_args: Sequence[str] = (), downsizing: bool = False) -> None:
    """:func:`start_early`, unless the run will stay in the launcher's process: its flags leave the worker count
    and mode to the size rule (``runners.sized_for``) and a glance at a local SRC finds less work than workers pay
    for (:func:`beam_jobs.runtime.work_size.glance`). Flags that ask for workers, a remote SRC, an archive, a tree
    too large to glance at: started. ``downsizing``: ``--max-side`` is given (the images will be decoded).

    Started for nothing, the forkserver would import Beam on the other core beside the small run, and hold the
    run's stdout and stderr open until its import ends. Where the glance says small and the plan then disagrees,
    the workers start as commands (:class:`beam_jobs.runtime.worker_handler.ForkedOrSubprocessHandler`): slower, the
    same bytes.
    """
    sized = not any(arg.startswith(("--direct_running_mode", "--direct_num_workers")) for arg in pipeline_args)
    if sized and src is not None:
        work = work_size.glance(src, downsizing)
        if work is not None and not work_size.wants_workers(work):
            logger.debug("no forkserver: %s is about %.1f s of work", src, work.seconds())
            return
    start_early()


def start_early() -> None:
    """Start the forkserver now, so its imports overlap the launcher's listing; nothing where the platform has
    none. Idempotent: a process's later runs reuse it (it ends with the process)."""
    global _context, _started_pid, _preload_before
    if _context is not None or "forkserver" not in multiprocessing.get_all_start_methods() or not _main_is_safe():
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver  # noqa: SLF001 - the standard library's one forkserver of this process
    already = getattr(server, "_forkserver_pid", None)  # the caller's own forkserver, if it runs: never stopped
    context = multiprocessing.get_context("forkserver")
    _preload_before = list(getattr(server, "_preload_modules", ["__main__"]))
    context.set_forkserver_preload(PRELOAD)
    # The forkserver inherits the mask: a Ctrl-C to the terminal's group while it imports stays pending
    # there, never a traceback; the launcher gets its own as soon as the mask is back.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if _main_thread() else None
    try:
        forkserver.ensure_running()
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    _context = context
    _started_pid = None if already else getattr(server, "_forkserver_pid", None)


def running() -> bool:
    return _context is not None


def stop() -> None:
    """Stop the forkserver :func:`start_early` started, if it did; the next run starts one again.

    Called when a run returns (:func:`stopped_after`), when its workers have exited: the forkserver holds Beam
    and the stages loaded and nothing else, so it is killed at once, even midway through its imports (a run that
    ended in a second must not wait for them). A forkserver the caller's own code had started is left running,
    and the preload it had is given back.
    """
    global _context, _started_pid
    if _context is None:
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver  # noqa: SLF001
    pid, _context, _started_pid = _started_pid, None, None
    if _preload_before is not None:
        server.set_forkserver_preload(_preload_before)
    stop_server = getattr(server, "_stop", None)  # private, as the standard library's tests use it
    if pid is None or getattr(server, "_forkserver_pid", None) != pid or stop_server is None:
        logger.debug("forkserver left running: not ours, or this Python stops it otherwise")
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    try:
        stop_server()  # reaps it and closes its socket
    except OSError as err:
        logger.debug("forkserver %d: %s", pid, err)


@contextlib.contextmanager
def stopped_after() -> Iterator[None]:
    """The body, then :func:`stop`: what a conversion or an update runs inside."""
    try:
        yield
    finally:
        stop()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _main_is_safe() -> bool:
    """Whether a process forked from the forkserver may import this program's ``__main__``, as multiprocessing
    has every child do: yes for ``python -m pkg`` (a ``__main__`` module it skips) and an interactive session;
    a script (``python train.py``) or another module might convert again when imported, so its runs keep the
    workers that start as a command."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return name == "__main__" or name.endswith(".__main__")
    return getattr(main, "__file__", None) is None


class _Descriptor:
    """One of the launcher's file descriptors, handed to the forked worker as multiprocessing hands them."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)  # only while the Process is pickled for the forkserver


def _received(handle):
    return handle


def run_forked(env: dict, cwd: str, stdout, stderr) -> None:
    """A forked worker's body: the launcher's environment, folder and output, then the worker's main."""
    for signum in _STOP_SIGNALS:  # ignored (a pending one discarded) before the forkserver's mask is lifted
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    from beam_jobs.runtime import local_worker

    os.dup2(stdout.detach(), 1)
    os.dup2(stderr.detach(), 2)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    import tempfile

    tempfile.tempdir = None  # from TMPDIR, as a new process would
    local_worker.main()


class ForkedSdkWorker:
    """One worker forked from the forkserver, run as Beam's ``SubprocessSdkWorker`` runs its subprocess: a
    logging server for it, the channels in its environment, and an error if it exits with a failure."""

    def __init__(self, control_address: str, provision_info, worker_id: Optional[str]) -> None:
        self._control_address = control_address
        self._provision_info = provision_info
        self._worker_id = worker_id

    def run(self) -> None:
        import grpc
        from apache_beam.portability.api import beam_fn_api_pb2_grpc, endpoints_pb2
        from apache_beam.runners.portability.local_job_service import BeamFnLoggingServicer
        from apache_beam.utils import thread_pool_executor
        from google.protobuf import json_format, text_format

        server = grpc.server(thread_pool_executor.shared_unbounded_instance(),
                             options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)])
        port = server.add_insecure_port("[::]:0")
        server.start()
        beam_fn_api_pb2_grpc.add_BeamFnLoggingServicer_to_server(BeamFnLoggingServicer(), server)

        def descriptor(url: str) -> str:
            return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))

        env = dict(os.environ, CONTROL_API_SERVICE_DESCRIPTOR=descriptor(self._control_address),
                   LOGGING_API_SERVICE_DESCRIPTOR=descriptor(f"localhost:{port}"),
                   PIPELINE_OPTIONS=json_format.MessageToJson(self._provision_info.provision_info.pipeline_options))
        if self._worker_id:
            env["WORKER_ID"] = self._worker_id
        process = _context.Process(target=run_forked, args=(env, os.getcwd(), _Descriptor(1), _Descriptor(2)),
                                   daemon=False)
        try:
            process.start()
            process.join()
            if process.exitcode:
                raise RuntimeError(f"Worker subprocess exited with return code {process.exitcode}")
        finally:
            if process.is_alive():
                process.kill()
            server.stop(0)
