"""Rows of ``messages``, ``archived_messages`` and ``archival_memory`` as domain objects."""

from __future__ import annotations

from typing import Any

from core.domain.compaction import StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.specifics import Specific

BATCH_COLUMNS = """
    id, label, conversation_id, content, depth, start_time, end_time, message_count,
    source_message_ids, compaction_id, superseded_by, covered_days, specifics, ledger
"""


def row_to_message(row: Any) -> ConversationMessage:
    """A ``messages`` (or ``archived_messages``) row; a ``kind = 'clip_archive'`` row
    is marked as the service's own clip-archive, which no text can fake."""
    raw_calls = row["tool_calls"]
    message = ConversationMessage(
        id=row["id"],
        conversation_id=row["conversation_id"],
        role=row["role"],
        content=row["content"],
        tool_calls=None
        if raw_calls is None
        else tuple(ToolCall.model_validate(call) for call in raw_calls),
        tool_call_id=row["tool_call_id"],
        created_at=row["created_at"],
    )
    kind = row.get("kind")
    return message.as_clip_archive() if kind == "clip_archive" else message


def row_to_batch(row: Any) -> StoredBatch:
    return StoredBatch(
        id=row["id"],
        label=row["label"],
        conversation_id=row["conversation_id"],
        batch=SummaryBatch(
            content=row["content"],
            depth=row["depth"],
            start_time=row["start_time"],
            end_time=row["end_time"],
            message_count=row["message_count"],
            source_message_ids=tuple(row["source_message_ids"]),
            days=tuple(row["covered_days"] or ()),
            specifics=_specifics(row["specifics"]),
            ledger=_specifics(row["ledger"]),
        ),
        compaction_id=row["compaction_id"],
        superseded_by=row["superseded_by"],
    )


def _specifics(value: Any) -> tuple[Specific, ...]:
    return tuple(Specific.model_validate(item) for item in value or ())


def specifics_json(specifics: tuple[Specific, ...]) -> list[dict[str, Any]] | None:
    """A batch's specifics as its jsonb column holds them (None: none)."""
    return [s.model_dump(mode="json") for s in specifics] or None
