"""The Faust application: topics, the token table, the two agents and the timers.

    messages ──► accounting agent ──► PostgreSQL (messages)
        ▲          │  table: conversations (changelog-backed)
        │          └──► compaction-commands ──► processor ──► compactor ──► PostgreSQL
        │                                                       (batches, deletes,
    accounting-control ◄── completions (outbox relay) ◄─────────  clip-archive, outbox)
                                                     └──► clip-archives (out)
    malformed records ──► dead-letters (original bytes + dlq.* headers)

Every write is idempotent by message id or compaction id, because Kafka
delivers at least once. The table is a cache of PostgreSQL: an entry that is
missing (a lost changelog, a new app id) is rebuilt from it on next use.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faust
from pydantic import ValidationError

from core.accounting import (
    Completion,
    ConversationTally,
    on_completion,
    on_message,
    on_reconcile,
    resynced,
)
from core.budget import over_budget
from core.compaction import AppliedStats, CompactionPlan, OutboxRecord
from core.compactor import PipelineCompactor, create_compactor
from core.embedding.factory import build_embedder
from core.messages import ConversationMessage
from core.model.factory import build_model_provider
from core.settings import ConfigError, ResolvedModel, Settings, resolve_model
from core.split import is_clip_archive
from core.storage.embedded import EmbeddedPostgres, resolve_dsn
from core.storage.postgres import PostgresStore
from core.tokens import estimate_message_tokens
from streams.events import (
    CONTROL_EVENT,
    BatchInfo,
    ClipArchiveEvent,
    CompactionCommand,
    CompactionCompleted,
    DeadLetterHeaders,
    MessageEvent,
    ReconcileRequest,
)
from streams.metrics import Metrics
from streams.runtime import configured_bootstrap, configured_dsn
from streams.scheduler import CompactionScheduler
from streams.topics import TopicNames

log = logging.getLogger("compactor.worker")


class InvalidRecord(Exception):
    """A record the service cannot use; it goes to the dead-letter topic."""

    def __init__(self, reason: str, error_type: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type


def describe_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "(record)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def now_utc() -> datetime:
    return datetime.now(UTC)


class Service:
    """What the agents share: settings, metrics, and the lazily opened resources.

    PostgreSQL and the model are opened on first use rather than at import,
    so building the app (for ``faust`` commands, tests, docs) needs neither.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = TopicNames.with_prefix(settings.kafka.topic_prefix)
        self.metrics = Metrics()
        self.budget = settings.budget
        self.resolved_model: ResolvedModel = resolve_model(settings.summarization)
        self._store: PostgresStore | None = None
        self._compactor: PipelineCompactor | None = None
        self._embedded: EmbeddedPostgres | None = None
        self._open_lock = asyncio.Lock()
        self.relay_lock = asyncio.Lock()
        self.last_reconcile_request: dict[str, float] = {}

    async def store(self) -> PostgresStore:
        if self._store is None:
            async with self._open_lock:
                if self._store is None:
                    await self._open()
        assert self._store is not None
        return self._store

    async def compactor(self) -> PipelineCompactor:
        await self.store()
        assert self._compactor is not None
        return self._compactor

    async def _open(self) -> None:
        settings = self.settings
        dsn, self._embedded = await asyncio.to_thread(
            resolve_dsn, configured_dsn(settings), settings.postgres.data_dir
        )
        store = await PostgresStore.connect(
            dsn,
            embedder=build_embedder(settings.embedding),
            min_size=settings.postgres.pool_min_size,
            max_size=settings.postgres.pool_max_size,
        )
        # In a thread: the first build imports an LLM SDK, which would hold the
        # event loop (and every agent on it) for up to a few seconds.
        model = await asyncio.to_thread(
            build_model_provider,
            self.resolved_model,
            timeout_seconds=settings.summarization.timeout_seconds,
        )
        self._compactor = create_compactor(
            model=model,
            messages_store=store,
            memory_store=store,
            config=settings.summarization.compaction(),
            model_name=self.resolved_model.model,
        )
        self._store = store

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None


def build_app(settings: Settings, *, bootstrap: str | None = None) -> faust.App:
    """The worker's Faust app. ``bootstrap`` overrides env and config (tests)."""
    servers = bootstrap or configured_bootstrap(settings)
    if not servers:
        raise ConfigError(
            "no Kafka broker configured: set KAFKA_BOOTSTRAP_SERVERS or [kafka].bootstrap_servers, "
            "or run `compactor dev up`"
        )
    service = Service(settings)
    svc = settings.service
    partitions = settings.kafka.partitions
    app = faust.App(
        svc.app_id,
        broker=[f"kafka://{server.strip()}" for server in servers.split(",") if server.strip()],
        store=svc.store,
        datadir=str(Path(svc.data_dir) / svc.app_id),
        topic_partitions=partitions,
        topic_replication_factor=settings.kafka.replication_factor,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        # How long a dead worker keeps its partitions (Faust's default is 60 s).
        broker_session_timeout=settings.kafka.session_timeout_seconds,
        broker_heartbeat_interval=settings.kafka.heartbeat_interval_seconds,
        producer_acks=-1,
        web_enabled=True,
        web_host=svc.web_host,
        web_port=svc.web_port,
        web_bind=svc.web_host,
        web_in_thread=False,
    )
    app.service_context = service  # type: ignore[attr-defined]
    names = service.names
    metrics = service.metrics

    def raw_topic(name: str) -> faust.TopicT:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=partitions,
        )

    control_topic = raw_topic(names.control)
    commands_topic = raw_topic(names.commands)
    clip_archives_topic = raw_topic(names.clip_archives)
    dead_letters_topic = raw_topic(names.dead_letters)
    by_logical = {"clip_archives": clip_archives_topic, "control": control_topic}

    conversations = app.Table(
        "conversations",
        default=None,
        partitions=partitions,
        key_type=str,
        help="Token tally per conversation (a cache of PostgreSQL)",
    )
    app.conversations_table = conversations  # type: ignore[attr-defined]

    async def dead_letter(event: faust.EventT[bytes], error: InvalidRecord) -> None:
        message = event.message
        headers = DeadLetterHeaders.model_validate(
            {
                "dlq.reason": error.reason,
                "dlq.error_type": error.error_type,
                "dlq.source_topic": message.topic,
                "dlq.source_partition": message.partition,
                "dlq.source_offset": message.offset,
                "dlq.failed_at": now_utc(),
            }
        )
        fut = await dead_letters_topic.send(
            key=message.key, value=message.value, headers=headers.to_kafka(), force=True
        )
        await fut
        metrics.dead_lettered.labels(message.topic, error.error_type).inc()
        log.warning(
            "dead-lettered %s[%d]@%d: %s",
            message.topic,
            message.partition,
            message.offset,
            error.reason,
        )

    def decode_key(event: faust.EventT[bytes]) -> str:
        key = event.key
        if not key:
            raise InvalidRecord("record has no key; it must be the conversation id", "missing_key")
        try:
            return bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRecord("record key is not UTF-8", "bad_key") from None

    def check_key(key: str, conversation_id: str) -> None:
        if key != conversation_id:
            # A wrong key puts the record on another conversation's partition,
            # whose worker does not own this conversation's table entry.
            raise InvalidRecord(
                f"record key {key[:80]!r} is not its conversation_id {conversation_id[:80]!r}",
                "key_mismatch",
            )

    def decode_message(event: faust.EventT[bytes]) -> MessageEvent:
        key = decode_key(event)
        try:
            parsed = MessageEvent.model_validate_json(bytes(event.value or b""))
        except ValidationError as error:
            kind = (
                "invalid_json" if error.errors()[0]["type"] == "json_invalid" else "invalid_event"
            )
            raise InvalidRecord(describe_validation_error(error), kind) from None
        limit = settings.service.max_content_chars
        if len(parsed.content) > limit:
            raise InvalidRecord(
                f"content has {len(parsed.content)} characters; the limit is {limit} "
                "([service].max_content_chars)",
                "oversized",
            )
        check_key(key, parsed.conversation_id)
        return parsed

    async def load_tally(conversation_id: str) -> ConversationTally | None:
        raw = conversations.get(conversation_id)
        return None if raw is None else ConversationTally.model_validate(raw)

    async def rebuilt_tally(store: PostgresStore, conversation_id: str) -> ConversationTally:
        """The tally as PostgreSQL says it is: for a missing entry or a redelivery."""
        total, count = await store.conversation_totals(conversation_id)
        return resynced(ConversationTally(conversation_id=conversation_id), total, count)

    async def send_command(tally: ConversationTally, reason: str) -> None:
        store = await service.store()
        assert tally.outstanding is not None
        command = CompactionCommand(
            compaction_id=tally.outstanding,
            conversation_id=tally.conversation_id,
            generation=tally.generation,
            up_to_seq=await store.last_seq(tally.conversation_id),
            issued_at=now_utc(),
            reason="reconcile" if reason == "reconcile" else "over_budget",
        )
        fut = await commands_topic.send(
            key=tally.conversation_id.encode(), value=command.model_dump_json().encode(), force=True
        )
        await fut
        metrics.commands_issued.labels(reason).inc()
        log.info(
            "compaction %s of %s requested (%s): %d tokens over budget %d",
            command.compaction_id,
            tally.conversation_id,
            reason,
            tally.token_total,
            service.budget.budget_tokens,
        )

    async def account_message(event: faust.EventT[bytes]) -> None:
        parsed = decode_message(event)
        store = await service.store()
        message = parsed.to_message()
        tokens = (
            parsed.token_count
            if parsed.token_count is not None
            else estimate_message_tokens(message)
        )
        inserted = await store.save_message(message, tokens)
        conversation_id = parsed.conversation_id
        tally = await load_tally(conversation_id)
        now = time.time()
        if tally is None or not inserted:
            # New to this table, or a redelivery the table may already have
            # counted: PostgreSQL (which has just stored the message) decides.
            base = await rebuilt_tally(store, conversation_id)
            if tally is not None:
                base = tally.model_copy(
                    update={"token_total": base.token_total, "message_count": base.message_count}
                )
            tally, issue = on_reconcile(base, service.budget, now, command_timeout=math.inf)
            metrics.events_in.labels("duplicate" if not inserted else "new").inc()
        else:
            tally, issue = on_message(tally, tokens, service.budget, now)
            metrics.events_in.labels("new").inc()
        conversations[conversation_id] = tally.model_dump()
        if issue:
            await send_command(tally, "over_budget")

    async def account_control(event: faust.EventT[bytes]) -> None:
        key = decode_key(event)
        try:
            control = CONTROL_EVENT.validate_json(bytes(event.value or b""))
        except ValidationError as error:
            raise InvalidRecord(describe_validation_error(error), "invalid_event") from None
        check_key(key, control.conversation_id)
        tally = await load_tally(control.conversation_id)
        if tally is None:
            tally = await rebuilt_tally(await service.store(), control.conversation_id)
        now = time.time()
        if isinstance(control, CompactionCompleted):
            completion = Completion(
                compaction_id=control.compaction_id,
                status=control.status,
                messages_compressed=control.messages_compressed,
                rows_removed=control.rows_removed,
                rows_added=control.rows_added,
                tokens_removed=control.tokens_removed,
                tokens_added=control.tokens_added,
            )
            tally, issue = on_completion(tally, completion, service.budget, now)
            reason = "continue"
        else:
            tally, issue = on_reconcile(
                tally, service.budget, now, settings.service.command_timeout_seconds
            )
            reason = "reconcile"
        conversations[control.conversation_id] = tally.model_dump()
        if issue:
            await send_command(tally, reason)

    @app.agent(
        app.topic(
            names.messages,
            names.control,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        ),
        concurrency=1,
    )
    async def accounting(stream: faust.StreamT[bytes]) -> None:
        """Writes the table, so it runs with concurrency 1 (acks stay in order)."""
        async for event in stream.events():
            try:
                if event.message.topic == names.messages:
                    await account_message(event)
                else:
                    await account_control(event)
            except InvalidRecord as error:
                if event.message.topic == names.messages:
                    metrics.events_in.labels("dead_lettered").inc()
                await dead_letter(event, error)

    # -- the processor -----------------------------------------------------

    def outbox_for(
        command: CompactionCommand, history: Sequence[ConversationMessage]
    ) -> Callable[[CompactionPlan, AppliedStats], list[OutboxRecord]]:
        def build(plan: CompactionPlan, stats: AppliedStats) -> list[OutboxRecord]:
            deleted = set(plan.deleted_message_ids)
            created = now_utc()
            clip_event = ClipArchiveEvent(
                compaction_id=plan.compaction_id,
                conversation_id=plan.conversation_id,
                generation=command.generation,
                clip_archive=plan.clip_archive,
                kept_message_ids=tuple(m.id for m in history if m.id not in deleted),
                compressed_message_ids=tuple(
                    m.id for m in history if m.id in deleted and not is_clip_archive(m)
                ),
                batches=tuple(
                    BatchInfo(
                        id=b.id,
                        label=b.label,
                        depth=b.batch.depth,
                        start_time=b.batch.start_time,
                        end_time=b.batch.end_time,
                        message_count=b.batch.message_count,
                        superseded_by=b.superseded_by,
                    )
                    for b in plan.new_batches
                ),
                tokens_before=plan.tokens_estimate_before,
                tokens_after=plan.tokens_estimate_after,
                created_at=created,
            )
            completed = CompactionCompleted(
                compaction_id=plan.compaction_id,
                conversation_id=plan.conversation_id,
                generation=command.generation,
                status="compacted",
                messages_compressed=plan.messages_compressed,
                rows_removed=len(plan.deleted_message_ids),
                rows_added=1,
                tokens_removed=stats.tokens_removed,
                tokens_added=stats.tokens_added,
                completed_at=created,
            )
            key = plan.conversation_id
            return [
                OutboxRecord(topic="clip_archives", key=key, payload=clip_event.model_dump_json()),
                OutboxRecord(topic="control", key=key, payload=completed.model_dump_json()),
            ]

        return build

    async def relay(compaction_id: str | None = None, *, again: bool = False) -> int:
        """Publish unpublished outbox rows, then mark them (at least once).

        ``again`` publishes every row of ``compaction_id``, published or not.
        A command that comes back for an applied compaction (redelivered, or
        re-sent by reconciliation because no completion arrived) means the
        completion may have been lost on its way (a crash, a rebalance); if it
        were not sent again the table would wait for it forever, re-sending
        the command every ``command_timeout_seconds``. Duplicates are harmless:
        the accounting agent applies a completion once, and clip-archive
        consumers de-duplicate by compaction id.
        """
        store = await service.store()
        async with service.relay_lock:
            if again and compaction_id is not None:
                rows = await store.outbox_rows(compaction_id)
            else:
                rows = await store.pending_outbox(compaction_id=compaction_id, limit=500)
            for row in rows:
                topic = by_logical[row.topic]
                fut = await topic.send(key=row.key.encode(), value=row.payload.encode(), force=True)
                await fut
                metrics.outbox_published.labels(row.topic).inc()
            await store.mark_published([row.id for row in rows])
        return len(rows)

    async def complete_without_compaction(command: CompactionCommand, reason: str) -> None:
        metrics.compactions_noop.labels(reason).inc()
        noop = CompactionCompleted(
            compaction_id=command.compaction_id,
            conversation_id=command.conversation_id,
            generation=command.generation,
            status="noop",
            messages_compressed=0,
            rows_removed=0,
            rows_added=0,
            tokens_removed=0,
            tokens_added=0,
            completed_at=now_utc(),
        )
        fut = await control_topic.send(
            key=command.conversation_id.encode(), value=noop.model_dump_json().encode(), force=True
        )
        await fut
        log.info(
            "compaction %s of %s: nothing to do (%s)",
            command.compaction_id,
            command.conversation_id,
            reason,
        )

    async def compact(command: CompactionCommand) -> None:
        store = await service.store()
        compactor = await service.compactor()
        conversation_id = command.conversation_id
        if await store.compaction_applied(command.compaction_id):
            metrics.compactions_noop.labels("replayed").inc()
            await relay(command.compaction_id, again=True)
            return
        total = await store.conversation_token_total(conversation_id)
        if not over_budget(total, service.budget):
            await complete_without_compaction(command, "under_budget")
            return
        history = await store.load_history(conversation_id, up_to_seq=command.up_to_seq)
        metrics.compactions_started.inc()
        metrics.in_flight.inc()
        try:
            result = await compactor.compress(
                history,
                conversation_id,
                compaction_id=command.compaction_id,
                outbox=outbox_for(command, history),
            )
        finally:
            metrics.in_flight.dec()
        metrics.llm_tokens.labels("input").inc(result.llm_input_tokens)
        metrics.llm_tokens.labels("output").inc(result.llm_output_tokens)
        if result.failed:
            reason = (result.reason or "unknown").split(":", 1)[0]
            metrics.compactions_failed.labels(reason).inc()
            log.warning(
                "compaction %s of %s failed, history unchanged; reconciliation will retry: %s",
                command.compaction_id,
                conversation_id,
                result.reason,
            )
            return
        if result.already_applied:
            metrics.compactions_noop.labels("replayed").inc()
            await relay(command.compaction_id, again=True)
            return
        if result.messages_compressed == 0:
            await complete_without_compaction(command, "nothing_to_compress")
            return
        await relay(command.compaction_id)
        metrics.compactions_succeeded.inc()
        metrics.compaction_latency.observe(
            max(0.0, (now_utc() - command.issued_at).total_seconds())
        )

    async def ack(token: tuple[faust.StreamT[bytes], faust.EventT[bytes]]) -> None:
        stream, event = token
        await stream.ack(event)

    scheduler: CompactionScheduler[tuple[faust.StreamT[bytes], faust.EventT[bytes]]] = (
        CompactionScheduler(ack, max_concurrent=settings.service.max_concurrent_compactions)
    )
    app.compaction_scheduler = scheduler  # type: ignore[attr-defined]

    @app.agent(commands_topic, concurrency=1)
    async def processor(stream: faust.StreamT[bytes]) -> None:
        """Hands commands to the scheduler; acks come from it, in offset order."""
        manual: faust.StreamT[bytes] = stream.noack()  # type: ignore[attr-defined]
        async for event in manual.events():
            message = event.message
            work = None
            conversation_id = None
            try:
                key = decode_key(event)
                command = CompactionCommand.model_validate_json(bytes(event.value or b""))
                check_key(key, command.conversation_id)
            except ValidationError as error:
                await dead_letter(
                    event, InvalidRecord(describe_validation_error(error), "invalid_event")
                )
            except InvalidRecord as error:
                await dead_letter(event, error)
            else:
                conversation_id = command.conversation_id

                async def work(command: CompactionCommand = command) -> None:
                    await compact(command)

            await scheduler.submit(
                partition=message.tp,
                offset=message.offset,
                token=(manual, event),
                conversation_id=conversation_id,
                work=work,
            )

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        scheduler.revoke(set(revoked))

    source_topics = {names.messages, names.control, names.commands}

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]
    async def rewind_uncommitted(sender: faust.App, **kwargs: Any) -> None:
        """Re-read partitions that have no committed offset from their beginning.

        Records fetched while a rebalance suspends the flow are discarded by
        Faust, which then relies on seeking back to the committed offset to
        read them again; a partition with no committed offset yet (nothing
        processed on it so far) is not sought at all, so its first records
        were silently lost: a message never stored, a command never run.
        This runs after table recovery, before the flow resumes. Records
        read twice are harmless: every write is idempotent.
        """
        consumer = app.consumer
        if not consumer.assignment():
            return
        try:
            committed = await consumer.seek_to_committed()  # type: ignore[attr-defined]
            uncommitted = [
                tp for tp, offset in committed.items() if tp.topic in source_topics and not offset
            ]
            if not uncommitted:
                return
            earliest = await consumer.earliest_offsets(*uncommitted)
            await consumer.seek_wait({tp: earliest.get(tp) or 0 for tp in uncommitted})
        except Exception:  # a rebalance is not the moment to crash the worker
            log.exception("could not rewind partitions without a committed offset")
            return
        log.info(
            "partitions with no committed offset read from the start: %s",
            sorted(f"{tp.topic}:{tp.partition}" for tp in uncommitted),
        )

    # -- timers ------------------------------------------------------------

    @app.timer(interval=settings.service.reconcile_interval_seconds)  # type: ignore[untyped-decorator]
    async def reconcile() -> None:
        """Nudge conversations whose command got lost or whose compaction failed.

        Only a request is sent: the accounting agent owns the table and decides.
        """
        now = time.time()
        timeout = settings.service.command_timeout_seconds
        for scanned, (conversation_id, raw) in enumerate(list(conversations.items())):
            if scanned % 500 == 499:
                # A large table must not freeze the agents and views sharing
                # this event loop (1.3 s at 100 000 RocksDB entries otherwise).
                await asyncio.sleep(0)
            if raw is None:
                continue
            outstanding_since = raw.get("outstanding_since")
            if raw.get("outstanding"):
                due = outstanding_since is None or now - outstanding_since >= timeout
            else:
                due = not raw.get("stalled") and over_budget(
                    raw.get("token_total", 0), service.budget
                )
            last = service.last_reconcile_request.get(conversation_id, 0.0)
            if not due or now - last < settings.service.reconcile_interval_seconds:
                continue
            service.last_reconcile_request[conversation_id] = now
            request = ReconcileRequest(conversation_id=conversation_id, requested_at=now_utc())
            fut = await control_topic.send(
                key=conversation_id.encode(), value=request.model_dump_json().encode(), force=True
            )
            await fut

    @app.timer(interval=settings.service.outbox_relay_interval_seconds)  # type: ignore[untyped-decorator]
    async def relay_outbox() -> None:
        """Rows a crash left unpublished between commit and publish."""
        try:
            published = await relay()
        except Exception as error:  # the database may be briefly away; try next tick
            log.warning("outbox relay failed: %s", error)
            return
        if published:
            log.info("relayed %d outbox rows", published)

    @app.timer(interval=5.0)  # type: ignore[untyped-decorator]
    async def measure_lag() -> None:
        consumer = app.consumer
        # Faust keeps the last offset read per partition privately; there is
        # no public accessor.
        read_offsets = getattr(consumer, "_read_offset", {})
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            if highwater is None:
                continue
            read = read_offsets.get(tp)
            lag = highwater - (read + 1 if read is not None else 0)
            metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, lag))

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_resources(sender: faust.App, **kwargs: Any) -> None:
        await scheduler.drain()
        await service.close()

    from streams.web import register_views

    register_views(app, service, conversations)
    _ = (
        accounting,
        processor,
        reconcile,
        relay_outbox,
        measure_lag,
        close_resources,
        on_revoked,
        rewind_uncommitted,
    )
    return app


def run_worker(settings: Settings, *, loglevel: str = "info") -> int:
    """Create the topics, then run one worker until SIGTERM/SIGINT."""
    from streams.admin import ensure_topics

    app = build_app(settings)
    Path(settings.service.data_dir).mkdir(parents=True, exist_ok=True)
    service: Service = app.service_context  # type: ignore[attr-defined]
    bootstrap = ",".join(f"{url.host}:{url.port}" for url in app.conf.broker)
    asyncio.run(
        ensure_topics(
            bootstrap,
            service.names,
            partitions=settings.kafka.partitions,
            replication_factor=settings.kafka.replication_factor,
        )
    )
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
    return 0
