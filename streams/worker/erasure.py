"""Erase requests, and the clip-archive tombstones that make compacted copies forget.

An erase comes only from the erase-requests topic (co-partitioned with the
messages topic). Each step is idempotent: a retried or redelivered request
repeats them harmlessly (audited once, by its request id). What an erase
covers is ``core.domain.erasure``'s rule; this module does the I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from core.domain.erasure import merged_offsets
from core.ports.publisher import Publisher
from core.ports.storage import CompactionLedger, EraseOutcome, Erasure, PrivacyStore
from streams.events import CompactionCompleted, EraseCompleted, EraseRequest
from streams.metrics import Metrics
from streams.worker.records import Record, decode_erase
from streams.worker.tally_table import TallyTable

log = logging.getLogger("compactor.worker")


class ErasurePorts(Protocol):
    """What erasing uses of the runtime (``streams.worker.runtime``)."""

    @property
    def privacy(self) -> PrivacyStore: ...

    @property
    def compactions(self) -> CompactionLedger: ...


class ConsumedOffsets:
    """Messages partition → the highest offset this worker has stored or skipped: an
    erase marks at least this much, so what it deleted stays deleted."""

    def __init__(self) -> None:
        self._highest: dict[int, int] = {}

    def note(self, records: Sequence[Record]) -> None:
        for record in records:
            self._highest[record.partition] = max(
                self._highest.get(record.partition, -1), record.offset
            )

    def get(self, partition: int | None) -> int | None:
        return None if partition is None else self._highest.get(partition)


class Eraser:
    def __init__(
        self,
        *,
        runtime: ErasurePorts,
        table: TallyTable,
        publisher: Publisher,
        metrics: Metrics,
        consumed: ConsumedOffsets,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._runtime = runtime
        self._table = table
        self._publisher = publisher
        self._metrics = metrics
        self._consumed = consumed
        self._clock = clock

    async def erase_record(self, record: Record) -> set[str]:
        """An ``EraseRequest`` from the erase-requests topic (the only way to erase)."""
        await self.erase(decode_erase(record), partition=record.partition)
        return set()

    async def erase(self, request: EraseRequest, *, partition: int | None = None) -> EraseOutcome:
        """Every row in the store and the erase mark that keeps them erased (one
        transaction), the table entry (a changelog tombstone), a tombstone on the
        clip-archive topic so log-compacted copies forget it, then an
        ``EraseCompleted``.

        The mark covers the messages topic up to the request's end offsets and,
        on ``partition``, up to what this worker had consumed."""
        conversation_id = request.conversation_key
        outcome = await self._runtime.privacy.erase_conversation(
            conversation_id, self._erasure(request, partition)
        )
        self._table.delete(conversation_id, partition=partition)
        key = conversation_id.encode()
        await self._publisher.publish("clip_archives", key, None)
        completed = EraseCompleted(
            request_id=request.request_id,
            conversation_id=request.conversation_id,
            tenant_id=request.tenant_id,
            requester=request.requester,
            counts=outcome.removed,
            epoch=outcome.epoch,
            requested_at=request.requested_at,
            erased_at=outcome.erased_at,
        )
        await self._publisher.publish(
            "erase_completions", key, completed.model_dump_json().encode()
        )
        self._metrics.erasures.inc()
        _log_erased(request, outcome)
        return outcome

    def _erasure(self, request: EraseRequest, partition: int | None) -> Erasure:
        now = datetime.fromtimestamp(self._clock(), UTC)
        offsets = {p: end - 1 for p, end in request.messages_end_offsets.items()}
        consumed = self._consumed.get(partition)
        if partition is not None and consumed is not None:
            offsets = merged_offsets(offsets, {partition: consumed})
        return Erasure(
            request_id=request.request_id,
            requester=request.requester,
            reason=request.reason,
            requested_at=min(request.requested_at, now),  # never a cutoff in the future
            erased_at=now,
            offsets=offsets,
        )

    async def tombstone_again(self, completed: CompactionCompleted, epoch: int) -> None:
        """A compaction's completion for a conversation erased since (``epoch`` > 0,
        the compaction no longer recorded), whether nothing is live or a new message
        has started it again: the compaction committed before the erase, and its
        clip-archive may have reached the topic after the erase's tombstone, so the
        tombstone is sent again. The relay sends a clip-archive before its
        completion (``OutboxRelay._send``), so this one lands after it. Nothing is
        erased here: a completion on the control topic never erases."""
        if completed.status != "compacted" or epoch == 0:
            return
        if await self._runtime.compactions.compaction_applied(completed.compaction_id):
            return
        await self._publisher.publish("clip_archives", completed.conversation_key.encode(), None)
        log.info(
            "tombstone of erased conversation %s sent again (compaction %s completed late)",
            completed.conversation_key,
            completed.compaction_id,
            extra={
                "conversation_id": completed.conversation_key,
                "compaction_id": completed.compaction_id,
            },
        )


def _log_erased(request: EraseRequest, outcome: EraseOutcome) -> None:
    conversation_id = request.conversation_key
    log.info(
        "erased conversation %s (request %s by %s%s, epoch %d): %s",
        conversation_id,
        request.request_id,
        request.requester,
        ", again" if outcome.repeated else "",
        outcome.epoch,
        ", ".join(f"{table} {count}" for table, count in outcome.removed.items()),
        extra={"conversation_id": conversation_id},
    )
