"""Plans, messages and batches for the storage tests (the contract suite and the
PostgreSQL-only tests): one conversation ``CONV`` from ``T0``, a batch ``stored``
over some messages, a ``make_plan`` that archives them under a clip-archive."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from core.domain.compaction import CompactionPlan, StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.specifics import Specific, rank_specifics
from core.domain.tokens import estimate_message_tokens
from tests.support.stores import saved

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CONV = "conv-a"


def msg(
    index: int,
    content: str | None = None,
    *,
    conversation_id: str = CONV,
    role: str = "user",
    seconds: int | None = None,
    tool_calls: Sequence[ToolCall] | None = None,
    tool_call_id: str | None = None,
) -> ConversationMessage:
    return ConversationMessage.model_validate(
        {
            "id": f"{conversation_id}-m{index:03d}",
            "conversation_id": conversation_id,
            "role": role,
            "content": f"message {index}" if content is None else content,
            "tool_calls": tuple(tool_calls) if tool_calls else None,
            "tool_call_id": tool_call_id,
            "created_at": T0 + timedelta(seconds=index if seconds is None else seconds),
        }
    )


def stored(
    compaction_id: str,
    index: int | str,
    content: str,
    sources: Sequence[ConversationMessage] = (),
    *,
    conversation_id: str = CONV,
    depth: int = 0,
    start: int = 0,
    end: int = 10,
    superseded_by: str | None = None,
    specifics: Sequence[Specific] | None = None,
) -> StoredBatch:
    """``specifics``: the turns' own, ranked, unless given (``()``: a summary that
    forgot them, which the store's gate refuses)."""
    return StoredBatch(
        id=f"{compaction_id}:{index}",
        label=f"compaction-batch-{conversation_id}-{index}",
        conversation_id=conversation_id,
        batch=SummaryBatch(
            content=content,
            depth=depth,
            start_time=T0 + timedelta(seconds=start),
            end_time=T0 + timedelta(seconds=end),
            message_count=len(sources),
            source_message_ids=tuple(m.id for m in sources),
            # As every summary the pipeline makes: its turns' specifics remembered
            # (the store's gate refuses a summary of raw turns that loses them).
            specifics=tuple(rank_specifics(sources) if specifics is None else specifics),
        ),
        compaction_id=compaction_id,
        superseded_by=superseded_by,
    )


def clip(
    compaction_id: str, *, conversation_id: str = CONV, seconds: int = 0
) -> ConversationMessage:
    return ConversationMessage(
        id=f"clip-archive-{compaction_id}",
        conversation_id=conversation_id,
        role="system",
        content=f"[Context Summary — written by {compaction_id}]",
        created_at=T0 + timedelta(seconds=seconds),
    ).as_clip_archive()  # as the compactor makes it, and the store reads it back


def make_plan(
    compaction_id: str,
    batches: Sequence[StoredBatch],
    deleted: Sequence[str],
    *,
    conversation_id: str = CONV,
    superseded: Sequence[tuple[str, str]] = (),
) -> CompactionPlan:
    return CompactionPlan(
        compaction_id=compaction_id,
        conversation_id=conversation_id,
        new_batches=tuple(batches),
        superseded=tuple(superseded),
        deleted_message_ids=tuple(deleted),
        clip_archive=clip(compaction_id, conversation_id=conversation_id),
        messages_compressed=len(deleted),
        tokens_estimate_before=1000,
        tokens_estimate_after=100,
    )


async def save_all(store: Any, messages: Sequence[ConversationMessage]) -> None:
    for m in messages:
        assert await saved(store, m, estimate_message_tokens(m))
