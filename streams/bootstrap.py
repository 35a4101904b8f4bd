"""Wiring: settings → PostgreSQL, embedder, model provider, compactor.

The one path by which the worker and every CLI command open their resources,
so both run exactly the same pipeline. Slow constructors (an LLM SDK import,
a local embedding model, an embedded PostgreSQL) run in threads: the worker
calls this from inside its event loop, where they would stall every agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from core.adapters.embedding.factory import build_embedder
from core.adapters.llm.factory import build_model_provider
from core.adapters.postgres.embedded import EmbeddedPostgres, resolve_dsn
from core.adapters.postgres.store import PostgresStore
from core.compactor import PipelineCompactor, create_compactor
from core.ports.model import ModelProvider
from core.settings import ResolvedModel, Settings, resolve_model
from streams.addresses import configured_dsn
from streams.metrics import Metrics

log = logging.getLogger("compactor.runtime")


@dataclass
class Runtime:
    settings: Settings
    store: PostgresStore
    model: ModelProvider
    resolved_model: ResolvedModel
    dsn: str
    embedded: EmbeddedPostgres | None
    compactor: PipelineCompactor  # one per runtime: its circuit breaker spans compactions

    async def close(self) -> None:
        embedded, self.embedded = self.embedded, None
        await _release(self.store, embedded)


async def _release(store: PostgresStore | None, embedded: EmbeddedPostgres | None) -> None:
    try:
        if store is not None:
            await store.close()
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


async def open_resources(settings: Settings) -> Runtime:
    """Open everything; the caller closes it (``Runtime.close``)."""
    resolved = resolve_model(settings.summarization)
    dsn, embedded = await asyncio.to_thread(
        resolve_dsn, configured_dsn(settings), settings.postgres.data_dir
    )
    if embedded is not None:
        log.info("PostgreSQL: embedded server in %s", embedded.pgdata)
    try:
        embedder = await asyncio.to_thread(build_embedder, settings.embedding)
        store = await PostgresStore.connect(
            dsn,
            embedder=embedder,
            min_size=settings.postgres.pool_min_size,
            max_size=settings.postgres.pool_max_size,
            raw_retention_days=settings.archive.raw_retention_days,
            single_conversation_transactions=settings.postgres.single_conversation_transactions,
        )
    except BaseException:
        await _release(None, embedded)
        raise
    try:
        model = await asyncio.to_thread(
            build_model_provider, resolved, timeout_seconds=settings.summarization.timeout_seconds
        )
    except BaseException:
        await _release(store, embedded)
        raise
    compactor = create_compactor(
        model=model,
        messages_store=store,
        memory_store=store,
        config=settings.summarization.compaction(),
        model_name=resolved.model,
        budget=settings.budget,
    )
    return Runtime(settings, store, model, resolved, dsn, embedded, compactor)


@asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[Runtime]:
    runtime = await open_resources(settings)
    try:
        yield runtime
    finally:
        await runtime.close()


class LazyRuntime:
    """The worker's resources, opened on first use and shared by its components.

    Building the app (for ``faust`` commands, tests, docs) needs neither
    PostgreSQL nor a model; the first event that needs them opens them.
    """

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.resolved_model: ResolvedModel = resolve_model(settings.summarization)
        self._metrics = metrics
        self._runtime: Runtime | None = None
        self._lock = asyncio.Lock()

    async def runtime(self) -> Runtime:
        if self._runtime is None:
            async with self._lock:
                if self._runtime is None:
                    runtime = await open_resources(self.settings)
                    if self._metrics is not None:
                        self._metrics.watch_provider_guard(runtime.compactor.provider_guard)
                    self._runtime = runtime
        return self._runtime

    async def store(self) -> PostgresStore:
        return (await self.runtime()).store

    async def compactor(self) -> PipelineCompactor:
        return (await self.runtime()).compactor

    async def close(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.close()
