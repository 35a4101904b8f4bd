"""Registers the worker's components with the Faust app: agents, timers, signal
handlers and HTTP views, each a thin call into a component. Nothing is built
here (``streams.bootstrap`` builds); behaviour lives in the components.

Agents: accounting (messages; control, apart so completions never queue behind
messages; erase requests, from their own topic) and the processor (commands).
Timers: reconciliation, outbox relay, table flush, lag, progress, the loop's lag.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust

from core.settings import Settings
from streams.http.pins import register_admin_posts
from streams.http.views import register_views
from streams.kafka.consumer import CommandToken, ConsumerSide
from streams.kafka.faust_app import raw_topic
from streams.kafka.log_limits import limit_repeats
from streams.kafka.message_groups import account_message_groups
from streams.kafka.table_context import TableContexts
from streams.runtime import WorkerRuntime
from streams.worker.acks_after_flush import AcksAfterFlush
from streams.worker.components import Components
from streams.worker.records import record_of

log = logging.getLogger("compactor.worker")


@dataclass
class Worker:
    """What registration hands to the agents, timers and signal handlers."""

    app: faust.App
    settings: Settings
    components: Components[CommandToken]
    runtime: WorkerRuntime
    side: ConsumerSide
    topics: dict[str, faust.TopicT]
    contexts: TableContexts
    acks: AcksAfterFlush


def register(
    app: faust.App,
    settings: Settings,
    components: Components[CommandToken],
    runtime: WorkerRuntime,
    side: ConsumerSide,
    topics: dict[str, faust.TopicT],
    contexts: TableContexts,
    config_path: Path | None = None,
) -> None:
    """``config_path``: the file a token reload (SIGHUP) reads again."""
    acks = AcksAfterFlush(components.table)
    worker = Worker(app, settings, components, runtime, side, topics, contexts, acks)
    register_agents(worker)
    register_rebalance(worker)
    register_timers(worker)
    register_lifecycle(worker)
    register_views(app, settings, components, runtime, config_path)
    register_admin_posts(app, components, runtime, settings.budget.budget_tokens)


def register_agents(worker: Worker) -> None:
    """Each agent waits for the runtime once, before its first event."""
    app, components, contexts = worker.app, worker.components, worker.contexts
    accounting, intake = components.accounting, components.intake

    @app.agent(raw_topic(app, components.names.messages), concurrency=1)
    async def accounting_messages(stream: faust.StreamT[bytes]) -> None:
        """Concurrency 1 (the table's writer); groups acked once durable (``AcksAfterFlush``)."""
        await worker.runtime.wait_open()
        manual: faust.StreamT[bytes] = stream.noack()  # type: ignore[attr-defined]
        await account_message_groups(
            manual,
            accounting,
            worker.acks,
            limit=worker.settings.service.accounting_batch_max,
            seen=contexts.seen,
        )

    @app.agent(worker.topics["control"], concurrency=1)
    async def accounting_control(stream: faust.StreamT[bytes]) -> None:
        """Completions and reconcile requests, never queued behind a message backlog."""
        await worker.runtime.wait_open()
        async for event in stream.events():
            contexts.seen(event)
            await accounting.handle(record_of(event))

    @app.agent(worker.topics["erasures"], concurrency=1)
    async def accounting_erasures(stream: faust.StreamT[bytes]) -> None:
        """Erase requests: the only records that erase (operators write this topic)."""
        await worker.runtime.wait_open()
        async for event in stream.events():
            contexts.seen(event)
            await accounting.handle(record_of(event))

    @app.agent(worker.topics["commands"], concurrency=1)
    async def processor_agent(stream: faust.StreamT[bytes]) -> None:
        """Hands commands to the scheduler; acks come from it, in offset order."""
        await worker.runtime.wait_open()
        manual: faust.StreamT[bytes] = stream.noack()  # type: ignore[attr-defined]
        async for event in manual.events():
            await intake.submit(record_of(event), event.message.tp, (manual, event))


def register_rebalance(worker: Worker) -> None:
    app, components, side = worker.app, worker.components, worker.side
    names = components.names

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        side.rebalance.on_revoked(set(revoked))
        gone = {tp.partition for tp in revoked if tp.topic in (names.messages, names.control)}
        components.table.flush_partitions(gone)  # still ours: the changelog gets them
        components.table.forget(gone)
        worker.acks.drop(gone)
        worker.contexts.forget(gone)

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]
    async def on_rebalanced(sender: faust.App, **kwargs: Any) -> None:
        components.table.invalidate_index()  # tables restored: rebuilt at the next pass
        await side.rebalance.rewind_uncommitted()


def register_timers(worker: Worker) -> None:
    """Each tick logs its own errors: an exception in a Faust timer stops the worker.
    Those that read the store wait until the runtime is open."""
    app, service, components = worker.app, worker.settings.service, worker.components
    runtime = worker.runtime

    @app.timer(interval=service.reconcile_interval_seconds)  # type: ignore[untyped-decorator]
    async def reconcile() -> None:
        if runtime.is_open:
            await components.reconciler.tick()

    @app.timer(interval=service.outbox_relay_interval_seconds)  # type: ignore[untyped-decorator]
    async def relay_outbox() -> None:
        if runtime.is_open:
            await components.relay.tick()

    @app.timer(interval=max(service.table_flush_seconds, 0.5))  # type: ignore[untyped-decorator]
    async def flush_table() -> None:
        """Entries (and the acks waiting on them) of a stream that went quiet."""
        try:
            await worker.acks.settle()
        except Exception as error:
            log.warning("table flush failed, retried at the next one: %s", error)

    @app.timer(interval=5.0)  # type: ignore[untyped-decorator]
    async def measure_lag() -> None:
        worker.side.lag.tick()

    @app.timer(interval=service.stall_check_seconds)  # type: ignore[untyped-decorator]
    async def watch_progress() -> None:
        await worker.side.watchdog.tick()


def register_lifecycle(worker: Worker) -> None:
    """Open the runtime once at start; at shutdown settle, drain and close it."""
    app, components, runtime = worker.app, worker.components, worker.runtime
    health = components.health

    @app.task  # type: ignore[untyped-decorator]
    async def open_runtime() -> None:
        def waiting(error: Exception) -> None:
            health.report("runtime", f"opening PostgreSQL: {type(error).__name__}: {error}")

        await runtime.open(on_failure=waiting)
        health.clear("runtime")

    @app.task  # type: ignore[untyped-decorator]
    async def quiet_outage_logs_then_watch_the_loop() -> None:
        """After Faust has set up logging, so its configuration cannot drop the filter."""
        limit_repeats()
        await components.loop_watch.run()  # for as long as the worker runs

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_runtime(sender: faust.App, **kwargs: Any) -> None:
        try:  # the changelog current and the held acks given, before Faust's last commit
            await worker.acks.settle(force=True)
        except Exception as error:
            log.warning("final table flush failed: %s", error)
        grace = worker.settings.service.shutdown_grace_seconds
        abandoned = await components.intake.scheduler.drain_within(grace)
        if abandoned:
            log.warning(
                "shutdown: %d compaction(s) unfinished after %.0fs abandoned; "
                "they are unacked and will be redone", abandoned, grace,
            )  # fmt: skip
        await runtime.close()
        await components.reconciler.close()
