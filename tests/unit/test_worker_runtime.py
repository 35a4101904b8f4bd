"""The worker's runtime is opened once, at start-up, and waited out while it cannot be.

Why: the components are handed the runtime once and look their store role up
(``runtime.outbox``, …) on each call; before it is open that must look like a
database outage
(``StoreUnavailable``: accounting retries the same record, the watchdog does
not take the still partition for a stuck one), and a database that is not up
yet when the worker starts must delay the worker, never stop it.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from core.ports.storage import StoreUnavailable
from core.settings import Settings
from streams.runtime import MAX_WAIT_SECONDS, WorkerRuntime

pytestmark = pytest.mark.unit


class FakeOpened:
    def __init__(self) -> None:
        self.store = SimpleNamespace(outbox=object(), history=object())
        self.compactor = object()
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_the_runtime_is_an_outage_until_open_then_opens_once_through_failures() -> None:
    opened = FakeOpened()
    attempts: list[int] = []

    async def open_all(settings: Settings) -> Any:
        attempts.append(1)
        if len(attempts) < 3:
            raise StoreUnavailable("connection refused")
        return opened

    runtime = WorkerRuntime(Settings(), open_all)
    with pytest.raises(StoreUnavailable):  # every role is an outage until open
        _ = runtime.outbox
    with pytest.raises(StoreUnavailable):
        _ = runtime.history
    assert not runtime.is_open

    failures: list[Exception] = []
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    waiter = asyncio.create_task(runtime.wait_open())
    await runtime.open(on_failure=failures.append, sleep=sleep)
    await asyncio.wait_for(waiter, 5.0)
    assert len(attempts) == 3 and len(failures) == 2 and len(slept) == 2
    # Full jitter: each wait is drawn below 0.2 s, 0.4 s, … (as the fixed backoff was).
    assert 0 <= slept[0] <= 0.2 and 0 <= slept[1] <= 0.4
    assert runtime.is_open and runtime.opened_store() is opened.store
    assert runtime.outbox is opened.store.outbox  # a role of the opened store
    assert runtime.compactor is opened.compactor

    await runtime.open(sleep=sleep)  # opened once: a second call opens nothing
    assert len(attempts) == 3
    await runtime.close()
    assert opened.closed and not runtime.is_open


async def test_the_waits_widen_to_the_cap_and_are_jittered() -> None:
    """A long outage: the window doubles from 0.2 s up to MAX_WAIT_SECONDS, never
    beyond; within it the wait is random, so workers started together spread out."""
    failures_left = 40

    async def open_all(settings: Settings) -> Any:
        nonlocal failures_left
        if failures_left:
            failures_left -= 1
            raise OSError("connection refused")
        return FakeOpened()

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    runtime = WorkerRuntime(Settings(), open_all)
    await runtime.open(sleep=sleep)
    assert runtime.is_open and len(slept) == 40
    assert all(0 <= wait <= min(MAX_WAIT_SECONDS, 0.2 * 2**n) for n, wait in enumerate(slept))
    assert max(slept[10:]) > 0.2 * 2**5  # the window did widen
    assert len(set(slept)) > 1  # and the waits are drawn, not fixed


async def test_an_error_that_is_not_an_outage_is_not_retried() -> None:
    async def open_all(settings: Settings) -> Any:
        raise ValueError("a bug, not an outage")

    runtime = WorkerRuntime(Settings(), open_all)
    with pytest.raises(ValueError, match="a bug"):
        await runtime.open(sleep=lambda _: asyncio.sleep(0))
    assert not runtime.is_open
