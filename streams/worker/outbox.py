"""The relay that publishes the events a compaction wrote to the outbox.

They are built before the compaction is written
(``streams.worker.compaction_events``), written to the outbox in its own
transaction, then relayed to Kafka: a crash between commit and publish loses
nothing, because a replayed command republishes them and the relay timer
publishes whatever is left unpublished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from core.ports.publisher import Publisher
from core.ports.storage import (
    OutboxRecord,
    OutboxRow,
    OutboxStore,
)
from streams.metrics import Metrics

log = logging.getLogger("compactor.worker")


class OutboxPorts(Protocol):
    """What the relay uses of the runtime (``streams.worker.runtime``)."""

    @property
    def outbox(self) -> OutboxStore: ...


class OutboxRelay:
    """Publishes committed outbox rows and marks them published, one job per method.

    Each compaction's rows are relayed on their own: sent together, their acks
    awaited together, then marked in one statement that touches that
    compaction's (so one conversation's) rows only. Nothing is shared between
    compactions, so a burst of compactions finishing together relays in
    parallel rather than queueing behind one lock; only timer passes are
    serialised, among themselves.

    ``grace_seconds``: how old an unpublished row must be before the timer
    sends it (``drain``). The processor sends a compaction's rows itself right
    after the commit and marks them; the grace keeps the timer off those
    rows while that send may still be under way, so it does not send them a
    second time. The worker sets it to ``[service].command_timeout_seconds``:
    the service's own bound on how long a compaction may take before it
    counts as lost (reconciliation re-sends its command then, and the replay
    republishes). A send still waiting that long after its commit is one the
    producer is holding through a broker outage (Faust lets it wait up to its
    ``producer_request_timeout``, 20 minutes, far too long to leave a crash's
    rows behind); a copy sent meanwhile is a duplicate, which consumers drop
    by ``compaction_id`` (delivery is at least once).
    """

    def __init__(
        self,
        runtime: OutboxPorts,
        publisher: Publisher,
        metrics: Metrics,
        *,
        grace_seconds: float,
    ) -> None:
        self._runtime = runtime
        self._publisher = publisher
        self._metrics = metrics
        self._grace_seconds = grace_seconds
        self._timer = asyncio.Lock()

    async def send(self, compaction_id: str, records: Sequence[OutboxRecord]) -> None:
        """Publish the records a compaction just committed (its processor kept
        them, so nothing is read back: one round trip fewer before the
        clip-archive is out), then mark its rows published."""
        await self._send(records)
        await self._runtime.outbox.mark_compaction_published(compaction_id)

    async def republish(self, compaction_id: str) -> int:
        """A command came back for an applied compaction (redelivered after a
        crash, or re-sent by reconciliation because no completion was applied).

        Its completion is sent again whether or not it was published: it may
        not have been applied (a rebalance, an entry rebuilt meanwhile), and
        without it the table would wait for it forever, re-sending the command
        every ``command_timeout_seconds``; the accounting agent applies a
        completion once. Its clip-archive is sent only if it was never
        published: once the broker has acknowledged it, consumers have it, and
        every copy is work and noise for each of them (a kill soak published
        54 % more clip-archives than compactions when they were all re-sent).
        """
        store = self._runtime.outbox
        rows = [
            row
            for row in await store.outbox_rows(compaction_id)
            if not row.published or row.topic == "control"
        ]
        return await self._publish(store, rows)

    async def drain(self) -> int:
        """The timer's pass: rows older than the grace, left unpublished by a crash
        or a failed send between commit and publish."""
        store = self._runtime.outbox
        async with self._timer:
            rows = await store.pending_outbox(older_than_seconds=self._grace_seconds, limit=500)
            published = 0
            for group in _by_compaction(rows):
                published += await self._publish(store, group)
            return published

    async def _publish(self, store: OutboxStore, rows: Sequence[OutboxRow]) -> int:
        """One compaction's rows: every send in flight at once, then one mark."""
        if not rows:
            return 0
        await self._send(rows)
        await store.mark_published([row.id for row in rows])
        return len(rows)

    async def _send(self, records: Sequence[OutboxRow | OutboxRecord]) -> None:
        """The records, in two waves: the clip-archive (every record not on the
        control topic) acknowledged before the completion is sent. A completion
        is what makes an erased conversation's worker send its clip-archive
        tombstone again (``Eraser.tombstone_again``); sent together, the
        completion could land first and the clip-archive after that tombstone,
        an erased summary the topic's latest value for the key. Each wave's
        records are in flight at once; returns when the broker has them all."""
        first = [r for r in records if r.topic != "control"]
        then = [r for r in records if r.topic == "control"]
        for wave in (first, then):
            await asyncio.gather(
                *(
                    self._publisher.publish(r.topic, r.key.encode(), r.payload.encode())
                    for r in wave
                )
            )
        for r in records:
            self._metrics.outbox_published.labels(r.topic).inc()

    async def tick(self) -> None:
        """The timer: ``drain``, a failure logged and left for the next tick."""
        try:
            published = await self.drain()
        except Exception as error:  # the database may be briefly away; try next tick
            log.warning("outbox relay failed: %s", error)
            return
        if published:
            log.info("relayed %d outbox rows", published)


def _by_compaction(rows: Sequence[OutboxRow]) -> list[list[OutboxRow]]:
    """``rows`` grouped by compaction, in order."""
    groups: dict[str, list[OutboxRow]] = {}
    for row in rows:
        groups.setdefault(row.compaction_id, []).append(row)
    return list(groups.values())
