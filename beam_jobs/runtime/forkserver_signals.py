"""Imported first by the workers' forkserver (``worker_start.PRELOAD``), for its side effects: the stop signals
ignored, and Beam's import-time noise kept off the user's terminal.

The launcher starts the forkserver with SIGINT, SIGTERM and SIGHUP blocked, so a Ctrl-C to the terminal's
process group while it starts stays pending; the libraries it then imports unblock some of them, and one
delivered then would end its import in a traceback on the user's terminal. Ignored here, before anything
else is imported, the pending ones are discarded and later ones never arrive: the launcher alone reports a
stop and kills its workers (``beam_jobs.runtime.interrupt``).

The forkserver's stderr is the user's terminal, and importing Beam there logs what a command-line worker's
handler filters (``apitools not found`` where the gcp extra is not installed): the same handler and filter
(:mod:`beam_jobs.runtime.log_filters`) are installed here first, at WARNING; each forked worker installs its
own at the run's level (:func:`beam_jobs.runtime.local_worker.main`). Nothing else imports this module.
"""

import logging
import signal
import sys

from beam_jobs.runtime.log_filters import not_beam_noise

for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_signum, signal.SIG_IGN)

_handler = logging.StreamHandler(sys.stderr)
_handler.setLevel(logging.WARNING)
_handler.addFilter(not_beam_noise)
logging.basicConfig(handlers=[_handler], format="%(levelname)s %(name)s: %(message)s")
