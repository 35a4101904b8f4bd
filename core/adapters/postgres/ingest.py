"""Storing a group of incoming messages in a few statements: the accounting hot path.

``save_message`` costs five round trips per message (a transaction, the
conversation's advisory lock, the tenant claim, the insert); at the rate a
worker reads a topic that is the bottleneck. A group goes in with the same
rules and the same guarantees in one transaction of four statements, whatever
its size: lock every conversation of the group (sorted, so two ingests cannot
deadlock; ``apply_compaction`` takes one of them), claim tenants, insert with
``unnest`` and read the arrival numbers back.

With ``single_conversation_transactions`` the group is split into one such
transaction per conversation, run side by side on the pool's connections,
for a deployment that distributes the schema by conversation
(docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from core.domain.messages import ToolCall
from core.ports.storage import IncomingMessage, SaveOutcome

_LOCK_SQL = """
SELECT pg_advisory_xact_lock($1, h)
  FROM (SELECT DISTINCT hashtext(c) AS h FROM unnest($2::text[]) AS c ORDER BY 1) AS keys
"""

# The conversations' owners: claimed now by this group, or from before.
_CLAIM_SQL = """
WITH wanted AS (
    SELECT * FROM unnest($1::text[], $2::text[]) AS w(conversation_id, tenant_id)
), claimed AS (
    INSERT INTO conversations (conversation_id, tenant_id)
    SELECT conversation_id, tenant_id FROM wanted
    ON CONFLICT (conversation_id) DO NOTHING
    RETURNING conversation_id, tenant_id
)
SELECT conversation_id, tenant_id FROM claimed
UNION ALL
SELECT c.conversation_id, c.tenant_id
  FROM conversations AS c JOIN wanted USING (conversation_id)
"""

# A message an archived batch already covers was compacted and deleted: a
# redelivery must not bring it back (see PostgresStore.save_message).
_INSERT_SQL = """
INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                      tool_call_id, created_at, token_estimate)
SELECT r.id, r.conversation_id, r.role, r.content, r.tool_calls::jsonb,
       r.tool_call_id, r.created_at, r.token_estimate
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
              $7::timestamptz[], $8::integer[], $9::integer[])
       AS r(id, conversation_id, role, content, tool_calls, tool_call_id,
            created_at, token_estimate, ord)
 WHERE NOT EXISTS (
       SELECT 1 FROM archival_memory AS a
        WHERE a.conversation_id = r.conversation_id AND a.source_message_ids @> ARRAY[r.id])
 ORDER BY r.ord
ON CONFLICT (conversation_id, id) DO NOTHING
RETURNING conversation_id, id, seq
"""


def tool_calls_json(tool_calls: tuple[ToolCall, ...] | None) -> list[dict[str, Any]] | None:
    """A message's tool calls as the ``tool_calls`` jsonb column holds them."""
    if tool_calls is None:
        return None
    return [call.model_dump(mode="json") for call in tool_calls]


def _tool_calls_text(incoming: IncomingMessage) -> str | None:
    """The same as text: ``unnest`` takes a ``text[]``, cast to jsonb in SQL."""
    calls = tool_calls_json(incoming.message.tool_calls)
    return None if calls is None else json.dumps(calls, separators=(",", ":"))


def _first_claims(batch: Sequence[IncomingMessage]) -> dict[str, str | None]:
    """Each conversation's tenant as the group's first message for it claims it."""
    claims: dict[str, str | None] = {}
    for incoming in batch:
        claims.setdefault(incoming.message.conversation_id, incoming.tenant_id)
    return claims


async def save_group(
    pool: asyncpg.Pool,
    batch: Sequence[IncomingMessage],
    *,
    lock_class: int,
    per_conversation: bool,
) -> list[SaveOutcome]:
    """The outcome of every message of ``batch``, in its order. ``lock_class`` is the
    advisory-lock class every writer of a conversation's history takes."""
    for incoming in batch:
        if incoming.tokens < 0:
            raise ValueError("token counts must be >= 0")
    if not batch:
        return []
    outcomes: dict[int, SaveOutcome] = {}
    if not per_conversation:
        async with pool.acquire() as conn, conn.transaction():
            outcomes.update(await _save_in_transaction(conn, list(enumerate(batch)), lock_class))
    else:
        # One transaction per conversation, side by side on the pool's connections:
        # one after the other they cost 18x the single transaction (docs/scaling.md).
        # Each locks one conversation, so they cannot deadlock one another.
        async def one(group: list[tuple[int, IncomingMessage]]) -> dict[int, SaveOutcome]:
            async with pool.acquire() as conn, conn.transaction():
                return await _save_in_transaction(conn, group, lock_class)

        results = await asyncio.gather(
            *(one(group) for group in _by_conversation(batch)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result  # the others committed: every write is idempotent, so a retry is safe
            outcomes.update(result)
    return [outcomes[position] for position in range(len(batch))]


def _by_conversation(batch: Sequence[IncomingMessage]) -> list[list[tuple[int, IncomingMessage]]]:
    groups: dict[str, list[tuple[int, IncomingMessage]]] = {}
    for position, incoming in enumerate(batch):
        groups.setdefault(incoming.message.conversation_id, []).append((position, incoming))
    return list(groups.values())


async def _save_in_transaction(
    conn: Any, group: Sequence[tuple[int, IncomingMessage]], lock_class: int
) -> dict[int, SaveOutcome]:
    messages = [incoming for _, incoming in group]
    claims = _first_claims(messages)
    await conn.execute(_LOCK_SQL, lock_class, list(claims))
    owners = {
        row["conversation_id"]: row["tenant_id"]
        for row in await conn.fetch(_CLAIM_SQL, list(claims), list(claims.values()))
    }
    outcomes: dict[int, SaveOutcome] = {}
    admitted: list[tuple[int, IncomingMessage]] = []
    for position, incoming in group:
        if owners.get(incoming.message.conversation_id) != incoming.tenant_id:
            outcomes[position] = SaveOutcome("tenant_conflict")
        else:
            admitted.append((position, incoming))
    seqs = await _insert(conn, admitted)
    for position, incoming in admitted:
        key = (incoming.message.conversation_id, incoming.message.id)
        seq = seqs.pop(key, None)  # a repeated id: its first copy only
        outcomes[position] = (
            SaveOutcome("duplicate") if seq is None else SaveOutcome("inserted", seq)
        )
    return outcomes


async def _insert(
    conn: Any, admitted: Sequence[tuple[int, IncomingMessage]]
) -> dict[tuple[str, str], int]:
    """{(conversation id, message id): arrival number} of the rows inserted."""
    if not admitted:
        return {}
    rows = [incoming for _, incoming in admitted]
    inserted = await conn.fetch(
        _INSERT_SQL,
        [r.message.id for r in rows],
        [r.message.conversation_id for r in rows],
        [r.message.role for r in rows],
        [r.message.content for r in rows],
        [_tool_calls_text(r) for r in rows],
        [r.message.tool_call_id for r in rows],
        [r.message.created_at for r in rows],
        [r.tokens for r in rows],
        list(range(len(rows))),
    )
    return {(row["conversation_id"], row["id"]): int(row["seq"]) for row in inserted}
