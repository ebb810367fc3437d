"""``python -m flopcount``: the same command as the ``flopcount`` console script."""

import sys

from flopcount.cli import main

if __name__ == "__main__":
    sys.exit(main())
