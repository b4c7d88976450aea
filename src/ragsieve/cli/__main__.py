"""``python -m ragsieve.cli``: the ``ragsieve`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
