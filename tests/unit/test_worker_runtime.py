"""The worker's runtime is opened once, at start-up, and waited out while it cannot be.

Why: the components are handed the runtime once and read ``runtime.store`` on
each call; before it is open that must look like a database outage
(``StoreUnavailable``: accounting retries the same record, the watchdog does
not take the still partition for a stuck one), and a database that is not up
yet when the worker starts must delay the worker, never stop it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.ports.storage import StoreUnavailable
from core.settings import Settings
from streams import bootstrap
from streams.bootstrap import WorkerRuntime

pytestmark = pytest.mark.unit


class FakeOpened:
    def __init__(self) -> None:
        self.store = object()
        self.compactor = object()
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_the_runtime_is_an_outage_until_open_then_opens_once_through_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened = FakeOpened()
    attempts: list[int] = []

    async def open_all(settings: Settings) -> Any:
        attempts.append(1)
        if len(attempts) < 3:
            raise StoreUnavailable("connection refused")
        return opened

    monkeypatch.setattr(bootstrap, "open_all", open_all)
    runtime = WorkerRuntime(Settings())
    with pytest.raises(StoreUnavailable):
        _ = runtime.store
    assert not runtime.is_open

    failures: list[Exception] = []
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    waiter = asyncio.create_task(runtime.wait_open())
    await runtime.open(on_failure=failures.append, sleep=sleep)
    await asyncio.wait_for(waiter, 5.0)
    assert len(attempts) == 3 and len(failures) == 2 and slept == [0.2, 0.4]
    assert runtime.is_open and runtime.store is opened.store
    assert runtime.compactor is opened.compactor

    await runtime.open(sleep=sleep)  # opened once: a second call opens nothing
    assert len(attempts) == 3
    await runtime.close()
    assert opened.closed and not runtime.is_open
