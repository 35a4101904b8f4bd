"""The events a compaction publishes, and the relay that publishes them.

They are written to the outbox in the compaction's own transaction, then
relayed to Kafka: a crash between commit and publish loses nothing, because
the relay timer publishes whatever is left unpublished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence, Set
from contextlib import contextmanager
from datetime import UTC, datetime

from core.domain.clip_archive import is_clip_archive
from core.domain.compaction import AppliedStats, CompactionPlan
from core.domain.messages import ConversationMessage
from core.ports.publisher import Publisher
from core.ports.storage import OutboxRecord, OutboxRow, OutboxStore
from streams.events import (
    BatchInfo,
    ClipArchiveEvent,
    CompactionCommand,
    CompactionCompleted,
    public_message,
)
from streams.metrics import Metrics
from streams.worker.runtime import Runtime

log = logging.getLogger("compactor.worker")


def clip_archive_event(
    command: CompactionCommand,
    history: Sequence[ConversationMessage],
    plan: CompactionPlan,
    created: datetime,
) -> ClipArchiveEvent:
    deleted = set(plan.deleted_message_ids)
    clip = plan.clip_archive
    return ClipArchiveEvent(
        compaction_id=plan.compaction_id,
        conversation_id=command.conversation_id,
        tenant_id=command.tenant_id,
        generation=command.generation,
        clip_archive=None if clip is None else public_message(clip),
        kept_message_ids=(
            *(m.id for m in history if m.id not in deleted),
            *plan.restored_message_ids,
        ),
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
                specifics=b.batch.ledger,
            )
            for b in plan.new_batches
        ),
        tokens_before=plan.tokens_estimate_before,
        tokens_after=plan.tokens_estimate_after,
        created_at=created,
        usage=plan.usage,
        action=command.action,
        request_id=command.request_id,
        restored_message_ids=plan.restored_message_ids,
        not_restored_message_ids=plan.not_restored_message_ids,
    )


def completion(
    command: CompactionCommand,
    completed_at: datetime,
    plan: CompactionPlan | None = None,
    stats: AppliedStats | None = None,
) -> CompactionCompleted:
    """The ``CompactionCompleted`` for ``command``: ``compacted`` with the counts a
    store measured applying ``plan``, or ``noop`` (no plan) with zeros."""
    if plan is None or stats is None:
        return CompactionCompleted(
            compaction_id=command.compaction_id,
            conversation_id=command.conversation_id,
            tenant_id=command.tenant_id,
            generation=command.generation,
            status="noop",
            messages_compressed=0,
            rows_removed=0,
            rows_added=0,
            tokens_removed=0,
            tokens_added=0,
            completed_at=completed_at,
        )
    return CompactionCompleted(
        compaction_id=plan.compaction_id,
        conversation_id=command.conversation_id,
        tenant_id=command.tenant_id,
        generation=command.generation,
        status="compacted",
        messages_compressed=plan.messages_compressed,
        rows_removed=len(plan.deleted_message_ids),
        rows_added=(plan.clip_archive is not None) + len(plan.restored_message_ids),
        tokens_removed=stats.tokens_removed,
        tokens_added=stats.tokens_added,
        completed_at=completed_at,
    )


class OutboxEvents:
    """What a committed compaction publishes: its clip-archive and its completion.

    ``build`` is the ``OutboxBuilder`` handed to ``apply_compaction``: the
    completion carries the token counts measured inside the transaction, so
    the accounting agent's tally moves by exactly what was written. The
    records it built stay in ``records``, so the relay sends them without
    reading them back.
    """

    def __init__(
        self,
        command: CompactionCommand,
        history: Sequence[ConversationMessage],
        plan: CompactionPlan,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._command = command
        self._history = history
        self._plan = plan
        self._clock = clock
        self.records: list[OutboxRecord] = []

    def build(self, stats: AppliedStats) -> list[OutboxRecord]:
        created = datetime.fromtimestamp(self._clock(), UTC)
        plan, command = self._plan, self._command
        completed = completion(command, created, plan, stats)
        clip_event = clip_archive_event(command, self._history, plan, created)
        # The clip-archives topic is log-compacted by conversation key (one latest
        # event per (tenant, id)); the control topic is co-partitioned with the
        # messages topic, so its key is the producer's id.
        self.records = [
            OutboxRecord(
                topic="clip_archives",
                key=plan.conversation_id,
                payload=clip_event.to_json(),
            ),
            OutboxRecord(
                topic="control", key=command.conversation_id, payload=completed.model_dump_json()
            ),
        ]
        return self.records


class OutboxRelay:
    """Publishes committed outbox rows and marks them published.

    Each compaction's rows are relayed on their own: sent together, their acks
    awaited together, then marked in one statement that touches that
    compaction's (so one conversation's) rows only. Nothing is shared between
    compactions, so a burst of compactions finishing together relays in
    parallel rather than queueing behind one lock; only timer passes are
    serialised, among themselves.
    """

    def __init__(self, runtime: Runtime, publisher: Publisher, metrics: Metrics) -> None:
        self._runtime = runtime
        self._publisher = publisher
        self._metrics = metrics
        self._timer = asyncio.Lock()
        self._claimed: set[str] = set()

    @contextmanager
    def claim(self, compaction_id: str) -> Iterator[None]:
        """The caller relays this compaction's rows itself: timer passes leave them.

        Without it a timer pass that runs between a compaction's commit and
        its own relay would publish the same records a second time.
        """
        self._claimed.add(compaction_id)
        try:
            yield
        finally:
            self._claimed.discard(compaction_id)

    async def relay(
        self,
        compaction_id: str | None = None,
        *,
        again: bool = False,
        records: Sequence[OutboxRecord] = (),
    ) -> int:
        """Publish unpublished outbox rows, then mark them (at least once).

        ``records``: what the compaction just committed wrote to the outbox (its
        processor kept them); they are sent without reading the rows back
        first, one round trip fewer before the clip-archive is out, then marked
        by compaction id.

        ``again``: a command came back for an applied compaction (redelivered
        after a crash, or re-sent by reconciliation because no completion was
        applied). Its completion is sent again whether or not it was published:
        it may not have been applied (a rebalance, an entry rebuilt meanwhile),
        and without it the table would wait for it forever, re-sending the
        command every ``command_timeout_seconds``; the accounting agent applies
        a completion once. Its clip-archive is sent only if it was never
        published: once the broker has acknowledged it, consumers have it, and
        every copy is work and noise for each of them (a kill soak published
        54 % more clip-archives than compactions when they were all re-sent).
        """
        store = self._runtime.store
        if compaction_id is None:
            async with self._timer:
                rows = await store.pending_outbox(limit=500)
                published = 0
                for group in _by_compaction(rows, skip=self._claimed):
                    published += await self._publish(store, group)
                return published
        if records and not again:
            await self._send(records)
            await store.mark_compaction_published(compaction_id)
            return len(records)
        if again:
            rows = [
                row
                for row in await store.outbox_rows(compaction_id)
                if not row.published or row.topic == "control"
            ]
        else:
            rows = await store.pending_outbox(compaction_id=compaction_id, limit=500)
        return await self._publish(store, rows)

    async def _publish(self, store: OutboxStore, rows: Sequence[OutboxRow]) -> int:
        """One compaction's rows: every send in flight at once, then one mark."""
        if not rows:
            return 0
        await self._send(rows)
        await store.mark_published([row.id for row in rows])
        return len(rows)

    async def _send(self, records: Sequence[OutboxRow | OutboxRecord]) -> None:
        """Every record in flight at once; returns when the broker has them all."""
        await asyncio.gather(
            *(self._publisher.publish(r.topic, r.key.encode(), r.payload.encode()) for r in records)
        )
        for r in records:
            self._metrics.outbox_published.labels(r.topic).inc()

    async def tick(self) -> None:
        """The timer's pass: rows a crash left unpublished between commit and publish."""
        try:
            published = await self.relay()
        except Exception as error:  # the database may be briefly away; try next tick
            log.warning("outbox relay failed: %s", error)
            return
        if published:
            log.info("relayed %d outbox rows", published)


def _by_compaction(rows: Sequence[OutboxRow], *, skip: Set[str]) -> list[list[OutboxRow]]:
    """``rows`` grouped by compaction, in order, leaving out those in ``skip``."""
    groups: dict[str, list[OutboxRow]] = {}
    for row in rows:
        if row.compaction_id not in skip:
            groups.setdefault(row.compaction_id, []).append(row)
    return list(groups.values())
