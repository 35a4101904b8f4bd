"""How late the event loop runs, and what holds it when it stalls.

Everything the worker does shares one event loop: the Kafka consumers and
their heartbeats, the agents, and the reads a platform makes at every turn. A
step that holds the loop for long delays all of them (a read's p95 is set by
such moments: docs/performance.md section 10), and a profile's averages hide
it. ``LoopWatch`` measures the loop's lag (how late a short timer fires) and,
from a thread, logs the main thread's stack while the loop has not come back
for ``stall_seconds``: the code that holds it, named while it holds it. One
stack per ``REPORT_EVERY`` seconds at most (a saturated worker stalls often);
every stall is counted.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger("compactor.worker")

#: At most one logged stack per this many seconds; the others are counted.
REPORT_EVERY = 10.0
#: Frames of the held stack logged, innermost last.
STACK_FRAMES = 14


class LoopWatch:
    """Run ``run()`` as a task of the loop to watch (module doc)."""

    def __init__(
        self,
        observe_lag: Callable[[float], None],
        count_stall: Callable[[], None],
        *,
        stall_seconds: float,
        interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._observe_lag = observe_lag
        self._count_stall = count_stall
        self._stall_seconds = stall_seconds
        self._interval = interval
        self._clock = clock
        self._due = clock() + interval  # when the loop should next come back
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def lag_only(cls) -> LoopWatch:
        """A watch that counts nothing: for components built outside the worker."""
        return cls(lambda _: None, lambda: None, stall_seconds=0)

    async def run(self) -> None:
        """Measure the lag for ever; with ``stall_seconds`` > 0, watch for stalls too."""
        if self._stall_seconds > 0:
            self.start_watching(threading.get_ident())
        try:
            while True:
                self._due = self._clock() + self._interval
                await asyncio.sleep(self._interval)
                self._observe_lag(max(0.0, self._clock() - self._due))
        finally:
            self._stopped.set()

    def start_watching(self, loop_thread: int) -> None:
        self._thread = threading.Thread(
            target=self._watch, args=(loop_thread,), name="loop-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self, loop_thread: int) -> None:
        """The thread: look four times per ``stall_seconds``; one report per stall."""
        reported_due: float | None = None
        last_report = -REPORT_EVERY
        stalls_since = 0
        while not self._stopped.wait(self._stall_seconds / 4):
            due = self._due
            held = self._clock() - due
            if held < self._stall_seconds or due == reported_due:
                continue
            reported_due = due
            self._count_stall()
            stalls_since += 1
            if self._clock() - last_report < REPORT_EVERY:
                continue
            last_report = self._clock()
            log.warning(
                "event loop held for %.0f ms so far (%d stall(s) of %.0f ms or more since "
                "the last report), in:\n%s",
                held * 1000, stalls_since, self._stall_seconds * 1000,
                held_stack(loop_thread),
            )  # fmt: skip
            stalls_since = 0


def held_stack(thread_id: int) -> str:
    """The innermost ``STACK_FRAMES`` frames ``thread_id`` is running, formatted."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "  (thread gone)"
    return "".join(traceback.format_stack(frame)[-STACK_FRAMES:]).rstrip()
