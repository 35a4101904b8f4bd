"""The clip-archive row and the compaction's outbox rows, written in one statement.

Both are part of the apply's transaction (``core.adapters.postgres.compaction``):
the events a compaction publishes become durable with the history they describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres.rows import tool_calls_json
from core.domain.compaction import CompactionPlan
from core.ports.storage import HistoryConflictError, OutboxRecord

if TYPE_CHECKING:
    from core.adapters.postgres.migrate import AnyConnection


_OUTBOX_ROWS = """
    INSERT INTO outbox (compaction_id, topic, key, payload, conversation_id)
    SELECT {compaction}, o.topic, o.key, o.payload, {conversation}
      FROM unnest({topics}::text[], {keys}::text[], {payloads}::text[])
           WITH ORDINALITY AS o(topic, key, payload, n)
     ORDER BY o.n
"""


async def insert_clip_archive(
    conn: AnyConnection, plan: CompactionPlan, outbox: Sequence[OutboxRecord]
) -> None:
    """Insert the clip-archive and, in the same statement, the outbox rows (in order)."""
    clip = plan.clip_archive
    columns = ([r.topic for r in outbox], [r.key for r in outbox], [r.payload for r in outbox])
    if clip is None:  # a restore that left no batch live
        rows = _OUTBOX_ROWS.format(
            compaction="$1", conversation="$2", topics="$3", keys="$4", payloads="$5"
        )
        await conn.execute(rows, plan.compaction_id, plan.conversation_id, *columns)
        return
    rows = _OUTBOX_ROWS.format(
        compaction="$9", conversation="$2", topics="$10", keys="$11", payloads="$12"
    )
    try:
        await conn.execute(
            f"""
            WITH clip AS (
                INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                                      tool_call_id, created_at, token_estimate, kind,
                                      compaction_id)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'clip_archive', $9)
            )
            {rows}
            """,
            clip.id, clip.conversation_id, clip.role, clip.content,
            tool_calls_json(clip.tool_calls), clip.tool_call_id, clip.created_at,
            plan.clip_tokens, plan.compaction_id, *columns,
        )  # fmt: skip
    except asyncpg.UniqueViolationError as error:
        # Either another clip-archive exists that the plan did not know to
        # replace, or the id is taken: the plan was computed from stale history.
        raise HistoryConflictError(
            f"compaction {plan.compaction_id}: cannot insert clip-archive {clip.id}: "
            f"{error.detail or error}"
        ) from error
