"""A cheap strategy's replacements (``CompactionPlan.replaced``), inside the
compaction's transaction: each message's stored row archived whole as a raw
turn (no batch: ``memory_read`` finds it; a later compaction that summarises
the placeholder links it to its batch), then its content and token count
replaced in place (same id, same ``seq``, its ``tool_call_id`` kept).

Archived with ``ON CONFLICT DO NOTHING``: a turn archived once keeps its first,
full content. A replayed compaction never gets here (its id is recorded).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from core.domain.compaction import CompactionPlan
from core.ports.storage import HistoryConflictError

if TYPE_CHECKING:
    from core.adapters.postgres.migrate import AnyConnection

_REPLACE = """
WITH old AS (
    SELECT m.conversation_id, m.id, m.role, m.content, m.tool_calls, m.tool_call_id,
           m.created_at, m.token_estimate, m.seq, r.new_content, r.new_tokens
      FROM messages AS m
      JOIN unnest($3::text[], $4::text[], $5::int[]) AS r(id, new_content, new_tokens)
        ON r.id = m.id
     WHERE m.conversation_id = $1 AND m.kind = 'message'
), archived AS (
    INSERT INTO archived_messages (conversation_id, id, batch_id, compaction_id, role, content,
                                   tool_calls, tool_call_id, created_at, token_estimate, seq)
    SELECT conversation_id, id, NULL, $2, role, content, tool_calls, tool_call_id, created_at,
           token_estimate, seq
      FROM old
    ON CONFLICT (conversation_id, id) DO NOTHING
), updated AS (
    UPDATE messages AS m
       SET content = old.new_content, token_estimate = old.new_tokens
      FROM old
     WHERE m.conversation_id = $1 AND m.id = old.id
)
SELECT id, token_estimate, new_tokens FROM old
"""


async def replace_in_place(conn: AnyConnection, plan: CompactionPlan) -> tuple[int, int]:
    """The replacements written; the stored token counts they remove and add. A
    message no longer live aborts the compaction (``HistoryConflictError``)."""
    replaced = plan.replaced
    if not replaced:
        return 0, 0
    rows = await conn.fetch(
        _REPLACE,
        plan.conversation_id,
        plan.compaction_id,
        [r.id for r in replaced],
        [r.content for r in replaced],
        [r.tokens for r in replaced],
    )
    if len(rows) != len(replaced):
        missing = sorted({r.id for r in replaced} - {row["id"] for row in rows})
        raise HistoryConflictError(
            f"compaction {plan.compaction_id}: message(s) it replaces are no longer live "
            f"in conversation {plan.conversation_id}: {missing[:5]}"
        )
    removed = sum(int(row["token_estimate"]) for row in rows)
    return removed, sum(int(row["new_tokens"]) for row in rows)


def strategies_json(plan: CompactionPlan) -> str | None:
    """The ``compactions.strategies`` value (migration 0015): None when none ran."""
    if not plan.strategies:
        return None
    return json.dumps([s.model_dump() for s in plan.strategies])
