"""The event loop's lag is measured, and a step holding it is logged with its
stack while it holds it (``streams.worker.loop_watch``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from streams.worker.loop_watch import LoopWatch

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Seen:
    def __init__(self) -> None:
        self.lags: list[float] = []
        self.stalls = 0

    def lag(self, seconds: float) -> None:
        self.lags.append(seconds)

    def stall(self) -> None:
        self.stalls += 1


@asynccontextmanager
async def watching(seen: Seen, stall_seconds: float) -> AsyncIterator[LoopWatch]:
    watch = LoopWatch(seen.lag, seen.stall, stall_seconds=stall_seconds, interval=0.01)
    task = asyncio.create_task(watch.run())
    try:
        while not seen.lags:  # running: it has measured once
            await asyncio.sleep(0.01)
        yield watch
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        watch.stop()


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a step that does not yield


async def until(condition: object, what: str) -> None:
    async with asyncio.timeout(10):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_a_held_loop_shows_as_lag() -> None:
    seen = Seen()
    async with watching(seen, stall_seconds=0):
        hold_the_loop(0.2)
        await until(lambda: max(seen.lags) >= 0.15, "the lag measured")
    assert min(seen.lags) < 0.15  # and the turns around it were on time


async def test_a_stall_is_logged_with_the_code_holding_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = Seen()
    with caplog.at_level(logging.WARNING, logger="compactor.worker"):
        async with watching(seen, stall_seconds=0.1):
            hold_the_loop(0.5)
            await until(lambda: seen.stalls >= 1, "the stall counted")
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
                turns = len(seen.lags)
                await until(lambda: len(seen.lags) > turns, "the loop turned")  # noqa: B023
                hold_the_loop(0.4)  # another stall, not the last one going on
                await until(lambda: seen.stalls >= count, "each stall counted")  # noqa: B023
    assert seen.stalls == 3
    assert len([r for r in caplog.records if "event loop held" in r.getMessage()]) == 1


async def test_with_no_stall_threshold_no_thread_watches() -> None:
    seen = Seen()
    async with watching(seen, stall_seconds=0) as watch:
        hold_the_loop(0.2)
        await until(lambda: len(seen.lags) > 2, "measuring on")
        assert watch._thread is None
    assert seen.stalls == 0
