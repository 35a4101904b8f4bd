"""``python -m streams.cli``: the ``compactor`` console script without installing it."""

from __future__ import annotations

import sys

from streams.cli import main

if __name__ == "__main__":
    sys.exit(main())
