"""What runs the job and watches it: the runner, its local workers, stop signals, progress.

The modules, one line each: docs/design.md (the one module map).
"""
