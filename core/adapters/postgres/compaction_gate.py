"""What ``apply_compaction`` checks inside its transaction, and the rejections it records.

``run_gate`` reads what the pure check (``core.domain.gate``) needs from the
transaction itself: the rows it just removed, and the tool turns left live;
a refusal raises ``Refused``, which rolls the transaction back.
``record_rejection`` then writes the refusal in a transaction of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.adapters.postgres.rows import row_to_message
from core.domain.compaction import CompactionPlan, StoredTokens
from core.domain.gate import (
    OFF_LOOP_CHARS,
    GateInput,
    Rejected,
    check_compaction,
    gate_applies,
    gate_cost,
)
from core.ports.storage import HistoryConflictError, RejectionRecord

if TYPE_CHECKING:
    from core.adapters.postgres.migrate import AnyConnection


class Refused(Exception):
    """The gate refused the plan: raised inside the transaction to roll it back."""

    def __init__(self, verdict: Rejected) -> None:
        super().__init__(verdict.detail)
        self.verdict = verdict


async def run_gate(conn: AnyConnection, plan: CompactionPlan, gone: Sequence[Any]) -> None:
    """The gate (``core.domain.gate``) on the rows just removed and the tool turns
    left live; off the event loop when the text is large."""
    if not gate_applies(plan):
        return
    compressed = [row_to_message(row) for row in gone]
    tools = any(m.tool_calls or m.tool_call_id for m in compressed)
    kept = await _live_tool_turns(conn, plan.conversation_id) if tools else []
    given = GateInput(plan, compressed, kept)
    if gate_cost(plan, compressed) > OFF_LOOP_CHARS:
        verdict = await asyncio.to_thread(check_compaction, given)
    else:
        verdict = check_compaction(given)
    if isinstance(verdict, Rejected):
        raise Refused(verdict)


async def _live_tool_turns(conn: AnyConnection, conversation_id: str) -> list[Any]:
    """The conversation's live tool calls and results (their text left out)."""
    rows = await conn.fetch(
        """
        SELECT id, conversation_id, role, '' AS content, tool_calls, tool_call_id,
               created_at, kind
          FROM messages
         WHERE conversation_id = $1 AND kind = 'message'
           AND (tool_calls IS NOT NULL OR tool_call_id IS NOT NULL)
        """,
        conversation_id,
    )
    return [row_to_message(row) for row in rows]


async def record_rejection(pool: asyncpg.Pool, plan: CompactionPlan, verdict: Rejected) -> None:
    """After the refused transaction rolled back: idempotent by (compaction,
    summariser), so a redelivered command records its rejection once."""
    await pool.execute(
        """
        INSERT INTO compaction_rejections (conversation_id, compaction_id, summarizer,
                                           reason, detail)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (conversation_id, compaction_id, summarizer) DO NOTHING
        """,
        plan.conversation_id,
        plan.compaction_id,
        plan.usage.summarizer,
        verdict.reason,
        verdict.detail,
    )


async def read_rejections(
    pool: asyncpg.Pool, conversation_id: str, limit: int
) -> list[RejectionRecord]:
    rows = await pool.fetch(
        """
        SELECT compaction_id, summarizer, reason, detail, rejected_at
          FROM compaction_rejections WHERE conversation_id = $1
         ORDER BY rejected_at DESC, compaction_id LIMIT $2
        """,
        conversation_id,
        limit,
    )
    return [RejectionRecord(**dict(row)) for row in rows]


def check_tokens(
    plan: CompactionPlan, announced: StoredTokens, removed: int, restored: int
) -> None:
    """The completion announces what the store's total moves by; it must be so."""
    found = StoredTokens(removed=removed, added=plan.clip_tokens + restored)
    if found != announced:
        raise HistoryConflictError(
            f"compaction {plan.compaction_id}: its rows carry {found} stored tokens, "
            f"its completion announces {announced}"
        )


async def set_pinned(
    pool: asyncpg.Pool, conversation_id: str, message_id: str, pinned: bool
) -> bool:
    """Under the conversation's lock, so it falls between two compactions' applies
    (one planned before it that compresses the message is refused by the gate)."""
    async with pool.acquire() as conn, conn.transaction():
        found = await conn.fetchval(
            """
            UPDATE messages SET pinned = $3
              FROM (SELECT pg_advisory_xact_lock($4, hashtext($1))) AS locked
             WHERE conversation_id = $1 AND id = $2 AND kind = 'message'
            RETURNING id
            """,
            conversation_id, message_id, pinned, CONVERSATION_LOCK_CLASS,
        )  # fmt: skip
    return found is not None


async def pinned_tokens(pool: asyncpg.Pool, conversation_id: str) -> int:
    total = await pool.fetchval(
        "SELECT coalesce(sum(token_estimate), 0) FROM messages "
        "WHERE conversation_id = $1 AND pinned",
        conversation_id,
    )
    return int(total)
