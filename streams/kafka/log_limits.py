"""Rate limits for log lines that repeat during an outage.

While a broker is away, aiokafka logs every failed connection attempt: about
1,600 ERROR lines per 30 s per worker, which buries the lines that matter
and fills disks. The same line (same logger, same message template) is let
through a few times per window, then counted; the next one let through says
how many were held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

NOISY_LOGGERS = ("aiokafka", "faust.transport")


@dataclass
class _Seen:
    window_start: float
    passed: int = 0
    held: int = 0


class RepeatLimiter(logging.Filter):
    def __init__(
        self,
        *,
        window_seconds: float = 30.0,
        burst: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._window = window_seconds
        self._burst = burst
        self._clock = clock
        self._seen: dict[tuple[str, str], _Seen] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        seen = self._seen.get(key)
        if seen is None or now - seen.window_start >= self._window:
            held = seen.held if seen is not None else 0
            self._seen[key] = _Seen(now, passed=1)
            if held:
                # Appended to the formatted text, with no arguments left to format it
                # with: an empty tuple, not None, which mode's ExtensionFormatter (the
                # worker's) turns into (None,) and then fails on "msg % (None,)".
                record.msg = str(record.getMessage()) + (
                    f" [{held} more like this held back in the last {self._window:.0f}s]"
                )
                record.args = ()
            return True
        if seen.passed < self._burst:
            seen.passed += 1
            return True
        seen.held += 1
        return False


def limit_repeats(
    prefixes: Iterable[str] = NOISY_LOGGERS, limiter: RepeatLimiter | None = None
) -> RepeatLimiter:
    """Attach one limiter to every existing logger under ``prefixes``.

    Call it after the libraries are imported: their loggers are created at
    import, and a filter on a logger does not apply to its children.
    """
    limiter = limiter or RepeatLimiter()
    prefixes = tuple(prefixes)
    names = [
        name
        for name in list(logging.root.manager.loggerDict)
        if any(name == p or name.startswith(p + ".") for p in prefixes)
    ]
    for name in [*prefixes, *names]:
        logger = logging.getLogger(name)
        if limiter not in logger.filters:
            logger.addFilter(limiter)
    return limiter
