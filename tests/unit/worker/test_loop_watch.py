"""The event loop's lag is measured, and a step holding it is logged with its
stack while it holds it (``streams.worker.loop_watch``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from streams.worker.loop_watch import LoopWatch

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Seen:
    def __init__(self) -> None:
        self.lags: list[float] = []
        self.stalls = 0  # counted by the watch's thread
        self.measured = asyncio.Event()  # set on the loop, at each lag measured

    def lag(self, seconds: float) -> None:
        self.lags.append(seconds)
        self.measured.set()

    async def turns(self, count: int = 1) -> None:
        """Until the watch has measured ``count`` more lags (the loop turned)."""
        async with asyncio.timeout(10):
            for _ in range(count):
                self.measured.clear()
                await self.measured.wait()

    def stall(self) -> None:
        self.stalls += 1


@asynccontextmanager
async def watching(seen: Seen, stall_seconds: float) -> AsyncIterator[LoopWatch]:
    watch = LoopWatch(seen.lag, seen.stall, stall_seconds=stall_seconds, interval=0.01)
    task = asyncio.create_task(watch.run())
    try:
        await seen.turns()  # running: it has measured once
        yield watch
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        watch.stop()


def hold_the_loop(seconds: float, seen_by: Callable[[], bool] | None = None) -> None:
    """A step that does not yield: ``seconds`` at least and, with ``seen_by``, until
    it returns true (a slow machine's watch thread still sees the stall); 10 s at most."""
    start = time.monotonic()
    while True:
        held = time.monotonic() - start
        if held >= 10 or (held >= seconds and (seen_by is None or seen_by())):
            return
        time.sleep(0.005)


async def test_a_held_loop_shows_as_lag() -> None:
    seen = Seen()
    async with watching(seen, stall_seconds=0):
        hold_the_loop(0.2)
        await seen.turns()
    assert max(seen.lags) >= 0.15
    assert min(seen.lags) < 0.15  # and the turns around it were on time


async def test_a_stall_is_logged_with_the_code_holding_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = Seen()
    with caplog.at_level(logging.WARNING, logger="compactor.worker"):
        async with watching(seen, stall_seconds=0.1):
            hold_the_loop(0.5, seen_by=lambda: seen.stalls >= 1)
    assert seen.stalls == 1  # one stall, one count, however long it lasts
    (record,) = [r for r in caplog.records if "event loop held" in r.getMessage()]
    assert "hold_the_loop" in record.getMessage()  # the stack names the step


async def test_stalls_after_the_first_are_counted_and_logged_once_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = Seen()
    with caplog.at_level(logging.WARNING, logger="compactor.worker"):
        async with watching(seen, stall_seconds=0.1):
            for count in (1, 2, 3):
                await seen.turns()  # a new stall, not the last one going on
                hold_the_loop(0.2, seen_by=lambda: seen.stalls >= count)  # noqa: B023
    assert seen.stalls == 3
    assert len([r for r in caplog.records if "event loop held" in r.getMessage()]) == 1


async def test_with_no_stall_threshold_no_thread_watches() -> None:
    seen = Seen()
    async with watching(seen, stall_seconds=0) as watch:
        hold_the_loop(0.2)
        await seen.turns(2)  # measuring on
        assert watch._thread is None
    assert seen.stalls == 0
