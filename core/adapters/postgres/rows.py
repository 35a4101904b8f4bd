"""Rows of ``messages``, ``archived_messages`` and ``archival_memory`` as domain
objects (``memory_read``'s candidate rows as the ranking's), and domain objects
as the rows and columns a statement writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from core.domain.compaction import CompactionPlan, StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.ranking import Found, Row, Summary, Turn
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
        pinned=bool(row.get("pinned") or False),
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


def tool_calls_json(tool_calls: tuple[ToolCall, ...] | None) -> list[dict[str, Any]] | None:
    """A message's tool calls as the ``tool_calls`` jsonb column holds them."""
    if tool_calls is None:
        return None
    return [call.model_dump(mode="json") for call in tool_calls]


def batch_rows(plan: CompactionPlan) -> list[tuple[Any, ...]]:
    """The plan's new batches as ``archival_memory`` rows, with their vectors when
    the plan carries them (``CompactionPlan.embeddings``)."""
    embeddings = plan.embeddings
    vectors = None if embeddings is None else embeddings.batches
    model = None if embeddings is None else embeddings.model
    return [
        _batch_row(stored, None if vectors is None else vectors[index], model)
        for index, stored in enumerate(plan.new_batches)
    ]


def _batch_row(stored: StoredBatch, vector: Any, model: str | None) -> tuple[Any, ...]:
    batch = stored.batch
    columns = (stored.id, stored.label, stored.conversation_id, batch.content, batch.depth)
    return (
        *columns,
        batch.start_time,
        batch.end_time,
        batch.message_count,
        list(batch.source_message_ids),
        stored.compaction_id,
        stored.superseded_by,
        vector,
        model if vector is not None else None,
        list(batch.days) or None,
        specifics_json(batch.specifics),
        specifics_json(batch.ledger),
    )


def turn_of(row: Any) -> Turn:
    """An ``archived_messages`` row of a raw-turn list."""
    return Turn(
        conversation_id=row["conversation_id"],
        id=row["id"],
        seq=int(row["seq"]),
        batch_id=row["batch_id"],
        role=row["role"],
        content=row["content"],
        created_at=row["created_at"],
        chars=int(row["content_chars"]),
        digest=row["digest"],
    )


def summary_of(row: Any) -> Summary:
    """An ``archival_memory`` row (``memory_statements.HIT_COLUMNS``)."""
    return Summary(
        conversation_id=row["conversation_id"],
        id=row["id"],
        seq=int(row["seq"]),
        label=row["label"],
        content=row["content"],
        depth=row["depth"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        message_count=row["message_count"],
        superseded=row["superseded"],
    )


def found_in(
    rows: Sequence[Any], score_column: str, row_of: Callable[[Any], Row]
) -> list[Found[Row]]:
    """A list's rows, best first, with that list's score and the lexemes they hold."""
    return [
        Found(row_of(row), float(row[score_column]), tuple(row.get("matched") or ()))
        for row in rows
    ]
