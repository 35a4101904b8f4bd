"""Wiring: settings → PostgreSQL, embedder, model provider, compactor.

Shared by the CLI and the worker so both run exactly the same pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from core.compactor import PipelineCompactor, create_compactor
from core.embedding.factory import build_embedder
from core.model.factory import build_model_provider
from core.model.port import ModelProvider
from core.settings import ResolvedModel, Settings, resolve_model
from core.storage.embedded import POSTGRES_DSN_ENV, EmbeddedPostgres, resolve_dsn
from core.storage.postgres import PostgresStore
from streams.stack_state import Explicit, dev_stack_bootstrap, dev_stack_dsn

log = logging.getLogger("compactor.runtime")


@dataclass
class Runtime:
    settings: Settings
    store: PostgresStore
    model: ModelProvider
    resolved_model: ResolvedModel
    dsn: str
    embedded: EmbeddedPostgres | None

    def compactor(self) -> PipelineCompactor:
        return create_compactor(
            model=self.model,
            messages_store=self.store,
            memory_store=self.store,
            config=self.settings.summarization.compaction(),
            model_name=self.resolved_model.model,
        )


KAFKA_BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def configured_dsn(settings: Settings, *, dev_stack: bool = True) -> str | None:
    """``$POSTGRES_DSN`` wins over the file, as every other secret does; with neither,
    the PostgreSQL of a running ``compactor dev up`` stack, so that commands share it
    instead of each starting an embedded server. ``dev_stack=False`` asks only what
    was given explicitly (what ``dev up`` must not replace)."""
    explicit = os.environ.get(POSTGRES_DSN_ENV) or settings.postgres.dsn
    if explicit or not dev_stack:
        return explicit
    return dev_stack_dsn()


def configured_bootstrap(settings: Settings, *, dev_stack: bool = True) -> str | None:
    """``$KAFKA_BOOTSTRAP_SERVERS`` wins over the file; with neither, the broker of a
    running ``compactor dev up`` stack; None when there is no broker at all."""
    explicit = os.environ.get(KAFKA_BOOTSTRAP_ENV) or settings.kafka.bootstrap_servers
    if explicit or not dev_stack:
        return explicit
    return dev_stack_bootstrap()


@asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[Runtime]:
    resolved = resolve_model(settings.summarization)
    model = build_model_provider(resolved, timeout_seconds=settings.summarization.timeout_seconds)
    embedder = build_embedder(settings.embedding)
    dsn, embedded = await asyncio.to_thread(
        resolve_dsn, configured_dsn(settings), settings.postgres.data_dir
    )
    if embedded is not None:
        log.info("PostgreSQL: embedded server in %s", embedded.pgdata)
    try:
        store = await PostgresStore.connect(
            dsn,
            embedder=embedder,
            min_size=settings.postgres.pool_min_size,
            max_size=settings.postgres.pool_max_size,
        )
        try:
            yield Runtime(settings, store, model, resolved, dsn, embedded)
        finally:
            await store.close()
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


def explicit_addresses(settings: Settings) -> Explicit:
    """Addresses given by the environment or the config file: ``dev`` never replaces them."""
    return Explicit(
        kafka_bootstrap=configured_bootstrap(settings, dev_stack=False),
        kafka_source=(
            f"${KAFKA_BOOTSTRAP_ENV}"
            if os.environ.get(KAFKA_BOOTSTRAP_ENV)
            else "[kafka].bootstrap_servers"
        ),
        postgres_dsn=configured_dsn(settings, dev_stack=False),
        postgres_source=(
            f"${POSTGRES_DSN_ENV}" if os.environ.get(POSTGRES_DSN_ENV) else "[postgres].dsn"
        ),
    )
