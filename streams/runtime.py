"""The worker's runtime: the store and the compactor, opened once at start-up.

Building the app (for ``faust`` commands, tests, docs) needs neither
PostgreSQL nor a model. The worker opens them when it starts (``open``,
retried while PostgreSQL does not answer); the agents wait for it before
their first event. Until then every store role raises ``StoreUnavailable``,
which every component treats as a database outage. What opening means (which
adapters) is the composition root's: ``streams.bootstrap.open_all``, handed
in as ``opener``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_random_exponential

from core.compaction.compactor import PipelineCompactor
from core.domain.tokens import TokenCounter
from core.ports.compactor import Compactor
from core.ports.storage import Storage, StoreUnavailable
from core.settings import ResolvedModel, Settings, resolve_model
from streams.metrics import Metrics
from streams.worker.runtime import Runtime

log = logging.getLogger("compactor.runtime")

# The wait before the next try is drawn from [0, FIRST·2ⁿ], at most CAP seconds
# (full jitter): quick after a blip, gentle in an outage, and workers started
# together do not knock on the database together.
FIRST_WAIT_SECONDS = 0.2
MAX_WAIT_SECONDS = 10.0
# A failed try is logged on the first and every 20th: an outage is one line a while.
LOG_EVERY = 20


class Opened(Protocol):
    """What an opener opened (``streams.bootstrap.Opened``); the runtime closes it."""

    @property
    def store(self) -> Storage: ...

    @property
    def compactor(self) -> PipelineCompactor: ...

    async def close(self) -> None: ...


Opener = Callable[[Settings], Awaitable[Opened]]


class WorkerRuntime(Runtime):
    """The worker's ``streams.worker.runtime.Runtime``: handed to every component."""

    def __init__(self, settings: Settings, opener: Opener, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.resolved_model: ResolvedModel = resolve_model(settings.summarization)
        self._opener = opener
        self._metrics = metrics
        self._opened: Opened | None = None
        self._ready = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return self._opened is not None

    def opened_store(self) -> Storage:
        return self._open().store

    @property
    def compactor(self) -> Compactor:
        return self._open().compactor

    @property
    def token_counter(self) -> TokenCounter:
        return self._open().compactor.counter

    def _open(self) -> Opened:
        if self._opened is None:
            raise StoreUnavailable("the worker has not opened PostgreSQL yet")
        return self._opened

    async def open(
        self,
        on_failure: Callable[[Exception], None] = lambda _: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Open everything, retrying while PostgreSQL does not answer (not up yet);
        ``on_failure`` hears of each failed try."""
        if self._opened is None:
            opened: Opened = await self._retrying(on_failure, sleep)(self._opener, self.settings)
            if self._metrics is not None:
                self._metrics.watch_provider_guard(opened.compactor.provider_guard)
            self._opened = opened
        self._ready.set()

    @staticmethod
    def _retrying(
        on_failure: Callable[[Exception], None], sleep: Callable[[float], Awaitable[None]]
    ) -> AsyncRetrying:
        def failed(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            assert isinstance(error, Exception)
            attempt = state.attempt_number
            if attempt == 1 or (attempt - 1) % LOG_EVERY == 0:
                log.warning("opening PostgreSQL failed (attempt %d): %s", attempt, error)
            on_failure(error)

        return AsyncRetrying(
            retry=retry_if_exception_type((StoreUnavailable, OSError)),
            wait=wait_random_exponential(multiplier=FIRST_WAIT_SECONDS, max=MAX_WAIT_SECONDS),
            sleep=sleep,
            before_sleep=failed,
        )

    async def wait_open(self) -> None:
        await self._ready.wait()

    async def close(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened.close()
