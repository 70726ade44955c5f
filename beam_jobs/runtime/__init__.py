"""What runs the job and watches it: the runner, its local workers, stop signals, progress.

``runners`` (which Beam runner, with which options), ``local_worker`` (the worker process a local
multi-process run starts), ``interrupt`` (SIGINT, SIGTERM, SIGHUP end a run promptly, keeping its
finished work), ``progress`` (bars on a terminal, lines into a log).
"""
