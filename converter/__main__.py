"""``python -m converter``: see :mod:`converter.cli`."""

import sys

from converter.cli import main

if __name__ == "__main__":
    sys.exit(main())
