"""Our handler of local workers in Beam's registry of worker handlers, checked first; Beam's own where it is not
what this code was written against.

In:  nothing: :func:`install` is called by :mod:`beam_jobs.runtime.runners` when it sets up a local
     multi-processing run.
Out: :class:`ForkedOrSubprocessHandler` registered for Beam's subprocess environment, which forks our workers
     from the forkserver (:mod:`beam_jobs.runtime.worker_start`); or, when Beam's internals moved, Beam's handler
     left in place and one warning naming what moved (the workers then start as commands: slower, the same bytes).

Beam has no public way to start a runner's SDK workers otherwise than as a command. This module leans on four of
its private things, each checked before it is used (:func:`problems`):

1. ``WorkerHandler._registered_environments``: the dict, environment URN -> (constructor, payload type), that
   ``WorkerHandler.register_environment`` fills and ``WorkerHandler.create`` reads;
2. its entry for ``python_urns.SUBPROCESS_SDK``: ``SubprocessSdkWorkerHandler``, with a ``bytes`` payload;
3. ``SubprocessSdkWorkerHandler.start_worker`` and ``stop_worker``, which our subclass replaces and keeps
   (``self.worker``, ``self.worker_thread`` joined on stop);
4. ``local_job_service.SubprocessSdkWorker.run``, which ``worker_start.ForkedSdkWorker.run`` re-implements (its
   logging server, the environment it gives the worker, its error on a failed exit).

Items 3 and 4 are checked by their source's SHA-256 against the code this was written against
(:data:`REIMPLEMENTED`): any change to them in a new Beam, even one that would still run, is a change we have not
read, so Beam's handler runs instead. setup.py pins Beam to the minor versions tested; the test
``tests/beam_jobs/runtime/test_worker_handler.py`` fails naming the thing that moved when a new Beam moves one.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import textwrap
import threading
from typing import Callable, Optional

from apache_beam.portability import python_urns
from apache_beam.runners.portability import local_job_service
from apache_beam.runners.portability.fn_api_runner.worker_handlers import SubprocessSdkWorkerHandler, WorkerHandler

from beam_jobs.runtime import worker_start

logger = logging.getLogger(__name__)

# Beam's code our handler replaces or re-implements -> the SHA-256 of its dedented source in the Beam this was
# written against (2.77). A new digest means: read Beam's new code, carry its change into ours, and update it here.
REIMPLEMENTED: dict[str, str] = {
    "SubprocessSdkWorkerHandler.start_worker": "0046adb8b7f27ea0273bc01422d0593c18b41bd82ac4076dfd44866d518978be",
    "SubprocessSdkWorkerHandler.stop_worker": "1816cdc9fe3c128b52c4b9ab76e488b72eb4fdb41b95ea06c8bcee63659db3a4",
    "SubprocessSdkWorker.run": "d1f1a430c456ad37a2b689b92e38df7a504c2139d7538ffe0b85e7201ddd2f2a",
}


class ForkedOrSubprocessHandler(SubprocessSdkWorkerHandler):
    """Beam's handler of subprocess workers, forking ours from the forkserver once it runs."""

    def start_worker(self) -> None:
        command = self._worker_command_line.decode("utf-8")
        if not worker_start.running() or command != worker_start.FORKED_COMMAND:
            super().start_worker()
            return
        self.worker = worker_start.ForkedSdkWorker(self.control_address, self.provision_info, self.worker_id)
        self.worker_thread = threading.Thread(name="run_worker", target=self.worker.run)
        self.worker_thread.start()


def _methods() -> dict[str, Callable]:
    return {"SubprocessSdkWorkerHandler.start_worker": SubprocessSdkWorkerHandler.start_worker,
            "SubprocessSdkWorkerHandler.stop_worker": SubprocessSdkWorkerHandler.stop_worker,
            "SubprocessSdkWorker.run": getattr(getattr(local_job_service, "SubprocessSdkWorker", None), "run", None)}


def source_digest(function: Optional[Callable]) -> str:
    """SHA-256 of ``function``'s dedented source; "" when it is gone or its source cannot be read."""
    if function is None:
        return ""
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return ""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


REGISTRY = "WorkerHandler._registered_environments"


def problems(registry: Optional[object] = None) -> dict[str, str]:
    """What is not as this module expects in Beam (``registry``: Beam's, unless given): the thing's name -> what
    it is instead; empty when our handler may be registered."""
    if registry is None:
        registry = getattr(WorkerHandler, "_registered_environments", None)
    found = {}
    if not isinstance(registry, dict):
        found[REGISTRY] = f"a {type(registry).__name__}, not the dict of environment URN -> (handler, payload type)"
    elif registry.get(python_urns.SUBPROCESS_SDK) not in ((SubprocessSdkWorkerHandler, bytes),
                                                           (ForkedOrSubprocessHandler, bytes)):
        found[REGISTRY] = (f"its handler of {python_urns.SUBPROCESS_SDK} is "
                           f"{registry.get(python_urns.SUBPROCESS_SDK)!r}, not (SubprocessSdkWorkerHandler, bytes)")
    for name, function in _methods().items():
        digest = source_digest(function)
        if digest != REIMPLEMENTED[name]:
            found[name] = (f"not the code re-implemented here (source SHA-256 {digest[:12] or 'unreadable'}, "
                           f"expected {REIMPLEMENTED[name][:12]})")
    return found


_installed: Optional[bool] = None


def install(registry: Optional[dict] = None) -> bool:
    """Register :class:`ForkedOrSubprocessHandler` for Beam's subprocess environment, once per process; True when
    it is. Where Beam is not what this module expects (:func:`problems`), log one warning naming why, leave Beam's
    handler in place, and stop the forkserver started for nothing. ``registry``: Beam's, unless given (tests)."""
    global _installed
    if registry is None and _installed is not None:
        return _installed
    found = problems(registry)
    if found:
        logger.warning("local workers start as Beam starts them (a command each, slower; the same output), not "
                       "forked from a loaded process: this Beam (%s) is not the one beam_jobs.runtime.worker_handler "
                       "was written for: %s", _beam_version(),
                       "; ".join(f"{name}: {detail}" for name, detail in found.items()))
        worker_start.stop()
    else:
        if registry is None:
            WorkerHandler.register_environment(python_urns.SUBPROCESS_SDK, bytes)(ForkedOrSubprocessHandler)
        else:
            registry[python_urns.SUBPROCESS_SDK] = (ForkedOrSubprocessHandler, bytes)
    if registry is None:
        _installed = not found
    return not found


def _beam_version() -> str:
    import apache_beam

    return f"apache-beam {getattr(apache_beam, '__version__', '?')}"
