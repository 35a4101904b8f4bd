"""Storing a group of incoming messages in a few statements: the accounting hot path.

``save_message`` costs five round trips per message (a transaction, the
conversation's advisory lock, the tenant claim, the insert); at the rate a
worker reads a topic that is the bottleneck. A group goes in with the same
rules and the same guarantees in one transaction of five statements, whatever
its size: lock every conversation of the group (sorted, so two ingests cannot
deadlock; ``apply_compaction`` takes one of them), read the erase marks of
those that were erased (a message an erase covers is ``erased``, nothing of it
written, its conversation not claimed: ``core.domain.erasure``), claim
tenants, insert with ``unnest`` and read the arrival numbers back.

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

from core.domain.erasure import EraseMark
from core.domain.messages import ToolCall
from core.ports.storage import IncomingMessage, SaveOutcome

_LOCK_SQL = """
SELECT pg_advisory_xact_lock($1, h)
  FROM (SELECT DISTINCT hashtext(c) AS h FROM unnest($2::text[]) AS c ORDER BY 1) AS keys
"""

# The erase marks of the group's conversations (read under their locks, so an
# erase cannot commit between this read and the insert).
_MARKS_SQL = """
SELECT conversation_id, epoch, offsets, cutoff
  FROM erasures WHERE conversation_id = ANY($1::text[])
"""

# The conversations' owners: claimed now by this group, or from before. A
# conversation stored before tenants existed (data, no conversations row) is
# not claimed: it comes back ``unassigned`` (an operator assigns its tenant).
_CLAIM_SQL = """
WITH wanted AS (
    SELECT * FROM unnest($1::text[], $2::text[]) AS w(conversation_id, tenant_id)
), legacy AS (
    SELECT w.conversation_id FROM wanted AS w
     WHERE NOT EXISTS (SELECT 1 FROM conversations AS c
                        WHERE c.conversation_id = w.conversation_id)
       AND (EXISTS (SELECT 1 FROM messages AS m WHERE m.conversation_id = w.conversation_id)
            OR EXISTS (SELECT 1 FROM archival_memory AS a
                        WHERE a.conversation_id = w.conversation_id))
), claimed AS (
    INSERT INTO conversations (conversation_id, tenant_id)
    SELECT conversation_id, tenant_id FROM wanted
     WHERE conversation_id NOT IN (SELECT conversation_id FROM legacy)
    ON CONFLICT (conversation_id) DO NOTHING
    RETURNING conversation_id, tenant_id
)
SELECT conversation_id, tenant_id, false AS unassigned FROM claimed
UNION ALL
SELECT c.conversation_id, c.tenant_id, false AS unassigned
  FROM conversations AS c JOIN wanted USING (conversation_id)
UNION ALL
SELECT conversation_id, NULL AS tenant_id, true AS unassigned FROM legacy
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


def _mark_of(row: Any) -> EraseMark:
    offsets = row["offsets"]
    if isinstance(offsets, str):  # a connection without the jsonb codec
        offsets = json.loads(offsets)
    return EraseMark(
        cutoff=row["cutoff"],
        offsets={int(p): int(o) for p, o in (offsets or {}).items()},
        epoch=int(row["epoch"]),
    )


async def erase_marks(conn: Any, conversation_ids: Sequence[str]) -> dict[str, EraseMark]:
    """The erase marks of those of ``conversation_ids`` that were ever erased."""
    rows = await conn.fetch(_MARKS_SQL, list(conversation_ids))
    return {row["conversation_id"]: _mark_of(row) for row in rows}


def covered(marks: dict[str, EraseMark], incoming: IncomingMessage) -> bool:
    mark = marks.get(incoming.message.conversation_id)
    return mark is not None and mark.covers(
        incoming.partition, incoming.offset, incoming.message.created_at
    )


async def _save_in_transaction(
    conn: Any, group: Sequence[tuple[int, IncomingMessage]], lock_class: int
) -> dict[int, SaveOutcome]:
    conversations = list(_first_claims([incoming for _, incoming in group]))
    await conn.execute(_LOCK_SQL, lock_class, conversations)
    marks = await erase_marks(conn, conversations)
    outcomes: dict[int, SaveOutcome] = {}
    live: list[tuple[int, IncomingMessage]] = []
    for position, incoming in group:
        if covered(marks, incoming):
            outcomes[position] = SaveOutcome("erased")
        else:
            live.append((position, incoming))
    claims = _first_claims([incoming for _, incoming in live])
    rows = await conn.fetch(_CLAIM_SQL, list(claims), list(claims.values())) if claims else []
    owners = {row["conversation_id"]: row["tenant_id"] for row in rows}
    unassigned = {row["conversation_id"] for row in rows if row["unassigned"]}
    admitted: list[tuple[int, IncomingMessage]] = []
    for position, incoming in live:
        if incoming.message.conversation_id in unassigned and incoming.tenant_id is not None:
            # Stored before tenants existed: a claim would adopt its whole history.
            # A message claiming no tenant is stored, and the conversation stays unassigned.
            outcomes[position] = SaveOutcome("tenant_unassigned")
        elif owners.get(incoming.message.conversation_id) != incoming.tenant_id:
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
