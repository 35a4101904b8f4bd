"""The Faust application: it creates the app, its topics and the token table,
and registers the worker's components (``streams.worker``) as agents, timers
and signal handlers. Behaviour lives in the components, not here.

Agents: accounting (messages; control, apart so completions never queue
behind messages) and the processor (commands). Timers: reconciliation,
outbox relay, lag. The picture is in docs/architecture.md.

Every write is idempotent by message id or compaction id (Kafka delivers at
least once); the table is a cache of PostgreSQL, rebuilt from it when lost.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faust

from core.settings import ConfigError, Settings
from streams.addresses import configured_bootstrap
from streams.app_timers import register_timers
from streams.bootstrap import LazyRuntime
from streams.kafka import consumer, faust_patches
from streams.kafka.consumer import CommandToken
from streams.kafka.publisher import FaustPublisher
from streams.kafka.security import kafka_security
from streams.kafka.table_context import TableContexts
from streams.metrics import Metrics
from streams.topics import TOPICS, TopicNames
from streams.worker import Components, assemble, batching
from streams.worker.records import record_of

log = logging.getLogger("compactor.worker")


def create_app(settings: Settings, servers: str) -> faust.App:
    svc = settings.service
    return faust.App(
        svc.app_id,
        broker=[f"kafka://{server.strip()}" for server in servers.split(",") if server.strip()],
        broker_credentials=kafka_security(settings.kafka).faust_credentials(),
        store=svc.store,
        datadir=str(Path(svc.data_dir) / svc.app_id),
        topic_partitions=settings.kafka.partitions,
        topic_replication_factor=settings.kafka.replication_factor,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        # How long a dead worker keeps its partitions (Faust's default is 60 s).
        broker_session_timeout=settings.kafka.session_timeout_seconds,
        broker_heartbeat_interval=settings.kafka.heartbeat_interval_seconds,
        producer_acks=-1,
        # A rebalance does not wait for records being processed: revoked work is
        # abandoned (every write is idempotent and the new owner redoes it), so
        # neither a slow LLM call nor a database outage can hold up the group.
        stream_wait_empty=False,
        producer_max_request_size=settings.kafka.max_request_bytes,
        web_enabled=True,
        web_host=svc.web_host,
        web_port=svc.web_port,
        web_bind=svc.web_host,
        web_in_thread=False,
    )


def raw_topic(app: faust.App, *names: str, partitions: int | None = None) -> faust.TopicT:
    """Bytes in, bytes out: the components decode and validate themselves."""
    return app.topic(
        *names,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
    )


def build_app(settings: Settings, *, bootstrap: str | None = None) -> faust.App:
    """The worker's Faust app. ``bootstrap`` overrides env and config (tests)."""
    servers = bootstrap or configured_bootstrap(settings)
    if not servers:
        raise ConfigError(
            "no Kafka broker configured: set KAFKA_BOOTSTRAP_SERVERS or [kafka].bootstrap_servers, "
            "or run `compactor dev up`"
        )
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
    conversations = app.Table(
        "conversations",
        default=None,
        partitions=partitions,
        key_type=str,
        help="Token tally per conversation (a cache of PostgreSQL)",
    )
    metrics = Metrics()
    resources = LazyRuntime(settings, metrics)
    contexts = TableContexts()
    components: Components[CommandToken] = assemble(
        settings,
        table=conversations,
        publisher=FaustPublisher(topics),
        resources=resources,
        ack=consumer.ack_command,
        still_assigned=lambda record: consumer.assigned(app, record),
        owns=consumer.owns_conversation(app, names.control, partitions),
        metrics=metrics,
        write_context=contexts,
        tables_ready=lambda: not app.in_recovery,
    )
    register(app, settings, components, resources, topics, contexts)
    app.components = components  # type: ignore[attr-defined]
    return app


def register(
    app: faust.App,
    settings: Settings,
    components: Components[CommandToken],
    resources: LazyRuntime,
    topics: dict[str, faust.TopicT],
    contexts: TableContexts,
) -> None:
    """Agents, timers and signal handlers, each a thin call into a component."""
    names = components.names
    accounting, intake = components.accounting, components.intake
    acks = batching.AcksAfterFlush(components.table)
    control_topic = topics["control"]
    side = consumer.ConsumerSide.of(app, settings.service, components)

    @app.agent(raw_topic(app, names.messages), concurrency=1)
    async def accounting_messages(stream: faust.StreamT[bytes]) -> None:
        """Concurrency 1 (the table's writer); a group is acked once it is durable,
        its table entries included (``AcksAfterFlush``)."""
        manual: faust.StreamT[bytes] = stream.noack()  # type: ignore[attr-defined]
        limit = settings.service.accounting_batch_max
        async for group in batching.in_groups(manual, limit, contexts.seen):
            revoked = await accounting.handle_batch([record_of(event) for event in group])
            acks.hold(manual, group, skip=revoked)
            await acks.settle()

    @app.agent(control_topic, concurrency=1)
    async def accounting_control(stream: faust.StreamT[bytes]) -> None:
        """Completions and reconcile requests, never queued behind a message backlog."""
        async for event in stream.events():
            contexts.seen(event)
            await accounting.handle(record_of(event))

    @app.agent(topics["commands"], concurrency=1)
    async def processor_agent(stream: faust.StreamT[bytes]) -> None:
        """Hands commands to the scheduler; acks come from it, in offset order."""
        manual: faust.StreamT[bytes] = stream.noack()  # type: ignore[attr-defined]
        async for event in manual.events():
            await intake.submit(record_of(event), event.message.tp, (manual, event))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        side.rebalance.on_revoked(set(revoked))
        gone = {tp.partition for tp in revoked if tp.topic in (names.messages, names.control)}
        components.table.flush_partitions(gone)  # still ours: the changelog gets them
        components.table.forget(gone)
        acks.drop(gone)
        contexts.forget(gone)

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]
    async def on_rebalanced(sender: faust.App, **kwargs: Any) -> None:
        components.table.invalidate_index()  # tables restored: rebuilt at the next pass
        await side.rebalance.rewind_uncommitted()

    register_timers(app, settings, components, side, acks)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_resources(sender: faust.App, **kwargs: Any) -> None:
        try:  # the changelog current and the held acks given, before Faust's last commit
            await acks.settle(force=True)
        except Exception as error:
            log.warning("final table flush failed: %s", error)
        await intake.scheduler.drain()
        await resources.close()

    from streams.http.views import register_views

    register_views(app, settings, components, resources)
