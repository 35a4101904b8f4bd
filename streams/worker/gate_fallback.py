"""A compaction the gate refused (``core.domain.gate``): counted, logged, published
as a ``CompactionRejected`` on the clip-archives topic, and the conversation
falls back to a cheaper safe summariser instead of asking the LLM again.

The event is published (and acked by the broker) before the command is acked;
a redelivered command refuses the same plan again and publishes it again,
so consumers de-duplicate by ``compaction_id`` and ``summarizer``.
"""

from __future__ import annotations

import logging
from datetime import datetime

from core.domain.compaction import CompactionPlan
from core.domain.gate import EXTRACTIVE, Rejected
from core.ports.publisher import Publisher
from streams.events import CompactionCommand, CompactionRejected
from streams.metrics import Metrics

log = logging.getLogger("compactor.worker")


def next_safe_strategy(plan: CompactionPlan, action: str) -> str | None:
    """What a refused plan falls back to: the extractive summariser, once; None
    when the extractive summariser wrote it (nothing cheaper is left) or for an
    operator's recompact or restore (the operator asked for that plan).

    The hook for cheaper strategies (issue 28: ``clear_tool_results``,
    ``offload_oversized``, from ``core/compaction/strategies``): return the first of
    them that applies before falling back to the extractive summariser."""
    if action != "compact" or plan.usage.summarizer == EXTRACTIVE:
        return None
    return EXTRACTIVE


class GateRejections:
    """Reports a refusal: the metric, the log line, the event."""

    def __init__(self, publisher: Publisher, metrics: Metrics) -> None:
        self._publisher = publisher
        self._metrics = metrics

    async def report(
        self,
        command: CompactionCommand,
        plan: CompactionPlan,
        verdict: Rejected,
        fallback: str | None,
        now: datetime,
    ) -> None:
        summarizer = plan.usage.summarizer
        self._metrics.compactions_rejected.labels(verdict.reason, summarizer).inc()
        then = f"falling back to {fallback}" if fallback else "no fallback left, command fails"
        log.warning(
            "compaction %s of %s rejected by the gate (%s: %s), history unchanged; %s",
            command.compaction_id, command.conversation_key, verdict.reason, verdict.detail,
            then,
            extra={"conversation_id": command.conversation_key,
                   "compaction_id": command.compaction_id},
        )  # fmt: skip
        event = CompactionRejected(
            compaction_id=command.compaction_id,
            conversation_id=command.conversation_id,
            tenant_id=command.tenant_id,
            summarizer=summarizer,
            reason=verdict.reason,
            detail=verdict.detail,
            fallback=fallback,
            rejected_at=now,
        )
        key = rejection_key(command.conversation_key)
        await self._publisher.publish("clip_archives", key, event.model_dump_json().encode())


def rejection_key(conversation_key: str) -> bytes:
    """The record key of a conversation's ``CompactionRejected``: not its clip-archive
    events' key, so log compaction never lets a rejection replace the latest
    clip-archive event; NUL never occurs in a conversation key (``Text``), so it
    is no other conversation's key either."""
    return f"{conversation_key}\x00rejected".encode()


def pinned_over_budget(conversation_key: str, pinned: int, budget: int, metrics: Metrics) -> bool:
    """Pinned messages alone over the budget: no compaction can bring the history
    under it (they are never compressed). Said, not dropped: a metric and a log
    line naming the conversation; the compaction still compresses what it may,
    and an operator's recompact is answered 409 (``streams.http.redo``)."""
    if pinned <= budget:
        return False
    metrics.pinned_over_budget.inc()
    log.warning(
        "conversation %s: its pinned messages alone (%d tokens) exceed the budget (%d); "
        "unpin some (compactor unpin) or raise the budget",
        conversation_key, pinned, budget,
        extra={"conversation_id": conversation_key},
    )  # fmt: skip
    return True
