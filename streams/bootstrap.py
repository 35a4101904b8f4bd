"""The composition root: settings → adapters → components → the Faust app.

The one module that chooses the adapters (``core.adapters``; with
``streams.database``, which finds PostgreSQL, the only ones that import them,
as an import-linter contract says): the worker and every CLI command open
their store, embedder, model and compactor here, so both run exactly the
same pipeline. Slow constructors
(an LLM SDK import, a local embedding model, an embedded PostgreSQL) run in
threads: the worker opens its runtime from inside its event loop, where they
would stall every agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import faust
from faust.types import TableT

from core.adapters.embedding.factory import build_embedder
from core.adapters.llm.factory import build_fallback_provider, build_model_provider
from core.adapters.postgres.embedded import POSTGRES_DSN_ENV, EmbeddedPostgres, resolve_dsn
from core.adapters.postgres.store import PostgresStore, ReadPool
from core.compaction.calibration import Calibration, open_calibration
from core.compaction.compactor import PipelineCompactor
from core.compaction.factory import create_compactor
from core.compaction.offload import ThreadOffload, planning_threads
from core.ports.embedding import Embedder
from core.ports.model import ModelProvider
from core.settings import ResolvedModel, Settings, resolve_model
from streams.app import register
from streams.database import check_database, configured_dsn
from streams.kafka import consumer, faust_patches
from streams.kafka.command_backlog import KafkaCommandBacklog
from streams.kafka.consumer import CommandToken, ConsumerSide, LagMeter, Rebalance
from streams.kafka.faust_app import create_app, raw_topic
from streams.kafka.publisher import FaustPublisher
from streams.kafka.security import kafka_security
from streams.kafka.table_context import TableContexts
from streams.kafka.watchdog import Watchdog, WatchdogLimits
from streams.metrics import Metrics
from streams.preflight import startup_checks, worker_bootstrap
from streams.runtime import WorkerRuntime
from streams.topics import TOPICS, TopicNames
from streams.worker.assembly import build_components
from streams.worker.components import Components
from streams.worker.loop_watch import LoopWatch
from streams.worker.runtime import StorePorts

log = logging.getLogger("compactor.runtime")

Token = TypeVar("Token")


# -- What is open ---------------------------------------------------------------


@dataclass
class Opened(StorePorts):
    """Everything ``open_all`` opened: the worker's runtime holds it, and a CLI
    command reads the store's roles from it (``opened.history``, ...)."""

    settings: Settings
    store: PostgresStore
    model: ModelProvider
    resolved_model: ResolvedModel
    dsn: str
    embedded: EmbeddedPostgres | None
    compactor: PipelineCompactor  # one per runtime: its circuit breaker spans compactions
    planning: Executor  # the threads the compactor's text-sized steps run in

    def opened_store(self) -> PostgresStore:
        return self.store

    async def close(self) -> None:
        embedded, self.embedded = self.embedded, None
        self.planning.shutdown(wait=False, cancel_futures=True)
        await _release(self.store, embedded)


async def _release(store: PostgresStore | None, embedded: EmbeddedPostgres | None) -> None:
    try:
        if store is not None:
            await store.close()
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


async def open_all(settings: Settings) -> Opened:
    """Open the store, the embedder, the model and the compactor; the caller closes."""
    resolved = resolve_model(settings.summarization)
    dsn, embedded = await _database(settings)
    try:
        embedder = await asyncio.to_thread(build_embedder, settings.embedding)
        store = await _open_store(settings, dsn, embedder)
    except BaseException:
        await _release(None, embedded)
        raise
    try:
        model = await asyncio.to_thread(
            build_model_provider,
            resolved,
            timeout_seconds=settings.summarization.timeout_seconds,
            prompt_caching=settings.summarization.prompt_caching,
        )
        calibration = await open_calibration(
            settings.budget.token_estimate, resolved, store.calibration
        )
    except BaseException:
        await _release(store, embedded)
        raise
    planning = planning_threads()
    offload = ThreadOffload(planning)
    compactor = _compactor(settings, resolved, model, store, embedder, offload, calibration)
    return Opened(settings, store, model, resolved, dsn, embedded, compactor, planning)


async def _database(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """The DSN to connect to, and the embedded server started for it, if asked for."""
    configured = configured_dsn(settings)
    check_database(settings, configured)
    dsn, embedded = await asyncio.to_thread(
        resolve_dsn, configured, settings.postgres.data_dir, embedded=settings.postgres.embedded
    )
    if embedded is not None:
        log.warning(
            "PostgreSQL: embedded server in %s, a development database ([postgres].embedded"
            " = true); not for production: set %s or [postgres].dsn",
            embedded.pgdata,
            POSTGRES_DSN_ENV,
        )
    return dsn, embedded


async def _open_store(settings: Settings, dsn: str, embedder: Embedder | None) -> PostgresStore:
    return await PostgresStore.connect(
        dsn,
        embedder=embedder,
        min_size=settings.postgres.pool_min_size,
        max_size=settings.postgres.pool_max_size,
        raw_retention_days=settings.archive.raw_retention_days,
        single_conversation_transactions=settings.postgres.single_conversation_transactions,
        read_pool=ReadPool(
            settings.postgres.read_pool_max_size, settings.postgres.read_statement_timeout_seconds
        ),
        ingest_pool_size=settings.postgres.ingest_pool_size,
    )


def _compactor(
    settings: Settings,
    resolved: ResolvedModel,
    model: ModelProvider,
    store: PostgresStore,
    embedder: Embedder | None,
    offload: ThreadOffload,
    calibration: Calibration | None = None,
) -> PipelineCompactor:
    """One per runtime: its breaker and guard span compactions; ``offload``: its threads."""
    return create_compactor(
        model=model,
        memory=store.archive,
        config=settings.summarization.compaction(
            settings.compaction.strategy_config(settings.tenants)
        ).model_copy(update={"keep_verbatim": settings.keep_verbatim()}),
        model_name=resolved.model,
        budget=settings.budget,
        tenant_weights=settings.tenant_weights(),
        fallback=build_fallback_provider() if resolved.kind != "extractive" else None,
        prices=settings.usage.prices,
        embedder=embedder,
        offload=offload,
        calibration=calibration,
    )


@asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[Opened]:
    """What the CLI commands use: everything open for the block, closed after it."""
    opened = await open_all(settings)
    try:
        yield opened
    finally:
        await opened.close()


# -- The Faust app --------------------------------------------------------------


def consumer_side(
    app: faust.App, settings: Settings, components: Components[CommandToken]
) -> ConsumerSide:
    """What watches Faust's consumer: rebalances, lag and progress."""
    names = components.names
    service = settings.service
    return ConsumerSide(
        rebalance=Rebalance(
            lambda: app.consumer,
            components.intake.scheduler,
            {names.messages, names.control, names.commands},
        ),
        lag=LagMeter(lambda: app.consumer, components.metrics),
        watchdog=Watchdog(
            lambda: app,
            health=components.health,
            metrics=components.metrics,
            watched_topics={names.messages, names.control},
            limits=WatchdogLimits(service.stall_seconds, service.stall_reseeks_before_exit),
            crash=app.crash,
        ),
    )


def build_app(
    settings: Settings, *, bootstrap: str | None = None, config_path: Path | None = None
) -> faust.App:
    """The worker's Faust app. ``bootstrap`` overrides env and config (tests);
    ``config_path`` is the file a token reload (SIGHUP) reads again."""
    servers = worker_bootstrap(settings, bootstrap)
    startup_checks(settings, servers)
    faust_patches.apply()
    app = create_app(settings, servers)
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    faust_patches.bulk_topics_last({names.messages})  # completions never wait behind messages
    # What the worker sends to (it only reads the messages topic).
    topics: dict[str, faust.TopicT] = {
        role: raw_topic(app, names.logical(role), partitions=settings.kafka.partitions)
        for role in TOPICS
        if role != "messages"
    }
    metrics = Metrics(state_dir=Path(settings.service.data_dir))
    runtime = WorkerRuntime(settings, open_all, metrics)
    contexts = TableContexts()
    components = _worker_components(app, settings, servers, topics, runtime, metrics, contexts)
    side = consumer_side(app, settings, components)
    register(app, settings, components, runtime, side, topics, contexts, config_path)
    app.components = components  # type: ignore[attr-defined]
    return app


def _conversations_table(app: faust.App, settings: Settings) -> TableT[str, Any]:
    """The token tally per conversation, a Faust table (a cache of PostgreSQL)."""
    min_insync = settings.kafka.min_insync_replicas  # run_worker resolves an unset one
    return app.Table(
        "conversations",
        default=None,
        partitions=settings.kafka.partitions,
        key_type=str,
        help="Token tally per conversation (a cache of PostgreSQL)",
        # The changelog is created by Faust, with topic_replication_factor replicas.
        extra_topic_configs={"min.insync.replicas": str(min_insync)} if min_insync else None,
    )


def _worker_components(
    app: faust.App,
    settings: Settings,
    servers: str,
    topics: dict[str, faust.TopicT],
    runtime: WorkerRuntime,
    metrics: Metrics,
    contexts: TableContexts,
) -> Components[CommandToken]:
    """The components over Faust: its table, topics, consumer and recovery state."""
    partitions = settings.kafka.partitions
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    loop_watch = LoopWatch(
        metrics.loop_lag.observe, metrics.loop_stalls.inc,
        stall_seconds=settings.service.loop_stall_seconds,
    )  # fmt: skip
    built = build_components(
        settings,
        table=_conversations_table(app, settings),
        publisher=FaustPublisher(topics),
        runtime=runtime,
        ack=consumer.ack_command,
        still_assigned=lambda record: consumer.assigned(app, record),
        owns=consumer.owns_conversation(app, names.control, partitions),
        metrics=metrics,
        write_context=contexts,
        tables_ready=lambda: not app.in_recovery,
        backlog=KafkaCommandBacklog(
            bootstrap=servers, security=kafka_security(settings.kafka),
            group_id=app.conf.id, topic=names.commands, control_topic=names.control,
            partitions=partitions,
        ),
    )  # fmt: skip
    return replace(built, loop_watch=loop_watch)
