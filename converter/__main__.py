"""``python -m converter``: see :mod:`converter.cli`."""

import os
import sys

from converter.cli import main

if __name__ == "__main__":
    status = main()
    if status in (129, 130, 143):
        # Stopped by a signal, cleanup done: exit now rather than wait on threads a stopped runner left.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # after SIGHUP the terminal may be gone
                pass
        os._exit(status)
    sys.exit(status)
