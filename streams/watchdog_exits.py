"""The count of watchdog exits, kept in the worker's data_dir.

The counter is raised just before the process exits, so no scrape would ever
see it; the next start reads it back, so ``increase()`` over the restart
shows the exit (``streams.metrics``: ``compactor_watchdog_exits_total``).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("compactor.metrics")

WATCHDOG_EXITS_FILE = "watchdog_exits"


class ExitsFile:
    """``state_dir``'s exits file; with no ``state_dir``, nothing is kept (tests)."""

    def __init__(self, state_dir: Path | None) -> None:
        self._path = state_dir / WATCHDOG_EXITS_FILE if state_dir is not None else None

    def read(self) -> int:
        """The exits recorded so far (0 when none, or when the file is damaged)."""
        if self._path is None:
            return 0
        try:
            return max(0, int(self._path.read_text().strip() or 0))
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as error:
            log.warning("ignoring %s: %s", self._path, error)
            return 0

    def record(self, count: int) -> None:
        """Best effort: the process is about to exit either way."""
        if self._path is None:
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._path.write_text(f"{count}\n")
        except OSError as error:
            log.warning("could not record the watchdog exit in %s: %s", self._path, error)
