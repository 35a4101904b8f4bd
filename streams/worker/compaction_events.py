"""The events a compaction publishes, built before it is written: its clip-archive
event and its ``CompactionCompleted`` (``completion``, the one builder of a
completion, for ``noop`` too), as the outbox records the store writes in the
compaction's transaction (``compaction_outbox``). Pure: the relay
(``streams.worker.outbox``) publishes them once committed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from core.domain.clip_archive import is_clip_archive
from core.domain.compaction import CompactionPlan, StoredTokens
from core.domain.messages import ConversationMessage
from core.ports.storage import CompactionInputs, CompactionOutbox, OutboxRecord
from streams.events import (
    BatchInfo,
    ClipArchiveEvent,
    CompactionCommand,
    CompactionCompleted,
    public_message,
)


def clip_archive_event(
    command: CompactionCommand,
    history: Sequence[ConversationMessage],
    plan: CompactionPlan,
    created: datetime,
) -> ClipArchiveEvent:
    deleted = set(plan.deleted_message_ids)
    clip = current_clip_archive(history, plan)
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
        strategies=plan.strategies,
        replaced_messages=replaced_messages(history, plan),
    )


def current_clip_archive(
    history: Sequence[ConversationMessage], plan: CompactionPlan
) -> ConversationMessage | None:
    """The plan's clip-archive; for the strategies alone, the one that stays."""
    if plan.clip_archive is None and plan.replaced:
        return next((m for m in history if is_clip_archive(m)), None)
    return plan.clip_archive


def replaced_messages(
    history: Sequence[ConversationMessage], plan: CompactionPlan
) -> tuple[ConversationMessage, ...]:
    """The kept messages a strategy replaced, as the model sees them now."""
    new = {r.id: r.content for r in plan.replaced}
    return tuple(
        public_message(m.model_copy(update={"content": new[m.id]})) for m in history if m.id in new
    )


def completion(
    command: CompactionCommand,
    completed_at: datetime,
    plan: CompactionPlan | None = None,
    tokens: StoredTokens | None = None,
) -> CompactionCompleted:
    """The ``CompactionCompleted`` for ``command``: ``compacted`` with the stored
    token counts ``plan`` removes and adds, or ``noop`` (no plan) with zeros."""
    if plan is None or tokens is None:
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
        tokens_removed=tokens.removed,
        tokens_added=tokens.added,
        completed_at=completed_at,
    )


def compaction_outbox(
    command: CompactionCommand,
    inputs: CompactionInputs,
    plan: CompactionPlan,
    created_at: datetime,
) -> CompactionOutbox:
    """What a compaction publishes once committed: its clip-archive event and its
    completion, built before the write. The completion carries the stored token
    counts the plan removes and adds (the store checks them as it writes), so
    the accounting agent's tally moves by exactly what was written."""
    tokens = StoredTokens.of(plan, inputs.stored_tokens)
    completed = completion(command, created_at, plan, tokens)
    clip_event = clip_archive_event(command, inputs.history, plan, created_at)
    # The clip-archives topic is log-compacted by conversation key (one latest
    # event per (tenant, id)); the control topic is co-partitioned with the
    # messages topic, so its key is the producer's id.
    records = (
        OutboxRecord(topic="clip_archives", key=plan.conversation_id, payload=clip_event.to_json()),
        OutboxRecord(
            topic="control", key=command.conversation_id, payload=completed.model_dump_json()
        ),
    )
    return CompactionOutbox(records, tokens)
