"""Storing a group of incoming messages in a few statements: the accounting hot path.

One message at a time would cost five round trips per message (a transaction,
the conversation's advisory lock, the erase mark, the tenant, the insert); at
the rate a worker reads a topic that is the bottleneck. A group goes in with the
same guarantees in one transaction of five statements, whatever its size: lock
every conversation of the group (sorted, so two ingests cannot deadlock;
``apply_compaction`` takes one of them), read the erase marks of those that were
erased (a message an erase covers is ``erased``, nothing of it written:
``core.domain.erasure``), record new conversations' tenants and every
conversation's watermark, insert with
``unnest`` and read the arrival numbers back.

A message that a compaction already summarised and deleted must not come back
when it is delivered again (Kafka redelivers after a crash, a producer
retries, a transcript is replayed): it would sit in the history next to the
summary that covers it and be compacted twice. Archived batches keep their
source message ids, so they are the record of what was compacted; the check
runs under the conversation's advisory lock, the one ``apply_compaction``
holds while it deletes, so a redelivery racing a compaction sees either the
row or its batch.

With ``single_conversation_transactions`` the group is split into one such
transaction per conversation, run side by side on the pool's connections,
for a deployment that distributes the schema by conversation
(docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.rows import tool_calls_json
from core.domain.erasure import EraseMark
from core.domain.tenancy import conversation_id_of, tenant_of
from core.ports.storage import IncomingMessage, IngestStore, SaveOutcome

_LOCK_SQL = """
SELECT pg_advisory_xact_lock($1, h)
  FROM (SELECT DISTINCT hashtext(c) AS h FROM unnest($2::text[]) AS c ORDER BY 1) AS keys
"""

# The erase marks of the group's conversations (read under their locks, so an
# erase cannot commit between this read and the insert), and the legacy marks
# of their producers' ids: an erase applied before conversation keys named
# their tenant (migration 0010) is kept by the bare id, its tenant unknown, so
# it covers that id under any tenant. That drops no message the old rules
# would have stored: then an id belonged to one tenant at a time, and another
# tenant's messages for it were dead-lettered.
_MARKS_SQL = """
SELECT conversation_id, epoch, offsets, cutoff, false AS legacy
  FROM erasures WHERE conversation_id = ANY($1::text[])
UNION ALL
SELECT conversation_id, 0 AS epoch, offsets, cutoff, true AS legacy
  FROM legacy_erasures WHERE conversation_id = ANY($2::text[])
"""

# Record each new conversation's tenant (the one its key names), which the
# row-level security of reads goes by, and every conversation's watermark: the
# newest record of the group processed for it (migration 0013), never moved
# back. A conversation key names its tenant (core.domain.tenancy), so there is
# nothing to claim or contest: two tenants using one id have two keys.
_RECORD_CONVERSATIONS_SQL = """
INSERT INTO conversations (conversation_id, tenant_id, last_message_id,
                           source_partition, source_offset)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[])
ON CONFLICT (conversation_id) DO UPDATE
   SET last_message_id = EXCLUDED.last_message_id,
       source_partition = EXCLUDED.source_partition,
       source_offset = EXCLUDED.source_offset
 WHERE EXCLUDED.source_offset IS NOT NULL
   AND (conversations.source_offset IS NULL
        OR conversations.source_partition IS DISTINCT FROM EXCLUDED.source_partition
        OR EXCLUDED.source_offset > conversations.source_offset)
"""

# A message an archived batch already covers was compacted and deleted: a
# redelivery must not bring it back (see the module's docstring).
_INSERT_SQL = """
INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                      tool_call_id, created_at, token_estimate, pinned)
SELECT r.id, r.conversation_id, r.role, r.content, r.tool_calls::jsonb,
       r.tool_call_id, r.created_at, r.token_estimate, r.pinned
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
              $7::timestamptz[], $8::integer[], $9::integer[], $10::boolean[])
       AS r(id, conversation_id, role, content, tool_calls, tool_call_id,
            created_at, token_estimate, ord, pinned)
 WHERE NOT EXISTS (
       SELECT 1 FROM archival_memory AS a
        WHERE a.conversation_id = r.conversation_id AND a.source_message_ids @> ARRAY[r.id])
 ORDER BY r.ord
ON CONFLICT (conversation_id, id) DO NOTHING
RETURNING conversation_id, id, seq
"""


def _tool_calls_text(incoming: IncomingMessage) -> str | None:
    """The same as text: ``unnest`` takes a ``text[]``, cast to jsonb in SQL."""
    calls = tool_calls_json(incoming.message.tool_calls)
    return None if calls is None else json.dumps(calls, separators=(",", ":"))


def _conversations(batch: Sequence[IncomingMessage]) -> list[str]:
    """The group's conversation keys, each once, in order of first appearance."""
    return list(dict.fromkeys(incoming.message.conversation_id for incoming in batch))


async def record_conversations(conn: Any, admitted: Sequence[IncomingMessage]) -> None:
    """A ``conversations`` row (key, the key's tenant) for each new conversation, and
    each conversation's newest record of ``admitted`` as its watermark."""
    newest: dict[str, IncomingMessage] = {}
    for incoming in admitted:  # in the topic's order: the last one is the newest
        newest[incoming.message.conversation_id] = incoming
    if newest:
        keys = list(newest)
        await conn.execute(
            _RECORD_CONVERSATIONS_SQL,
            keys,
            [tenant_of(key) for key in keys],
            [newest[key].message.id for key in keys],
            [newest[key].partition for key in keys],
            [newest[key].offset for key in keys],
        )


@port_errors_on_methods
class PostgresIngest:
    """``per_conversation``: one transaction per conversation of a group
    (``[postgres].single_conversation_transactions``)."""

    def __init__(self, pool: asyncpg.Pool, *, per_conversation: bool = False) -> None:
        self._pool = pool
        self._per_conversation = per_conversation

    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """The outcome of every message of ``batch``, in its order."""
        for incoming in batch:
            if incoming.tokens < 0:
                raise ValueError("token counts must be >= 0")
        if not batch:
            return []
        if not self._per_conversation:
            return _in_order(len(batch), [await self._save(list(enumerate(batch)))])
        # One transaction per conversation, side by side on the pool's connections:
        # one after the other they cost 18x the single transaction (docs/scaling.md).
        # Each locks one conversation, so they cannot deadlock one another.
        results = await asyncio.gather(
            *(self._save(group) for group in _by_conversation(batch)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result  # the others committed: every write is idempotent, so a retry is safe
        return _in_order(len(batch), [r for r in results if not isinstance(r, BaseException)])

    async def _save(self, group: list[tuple[int, IncomingMessage]]) -> dict[int, SaveOutcome]:
        async with self._pool.acquire() as conn, conn.transaction():
            return await _save_in_transaction(conn, group, CONVERSATION_LOCK_CLASS)


def _in_order(size: int, found: Sequence[dict[int, SaveOutcome]]) -> list[SaveOutcome]:
    outcomes = {position: outcome for part in found for position, outcome in part.items()}
    return [outcomes[position] for position in range(size)]


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


async def erase_marks(conn: Any, conversation_ids: Sequence[str]) -> dict[str, list[EraseMark]]:
    """The erase marks covering each of ``conversation_ids`` that was ever erased:
    its own, and a legacy mark of its producer's id (see ``_MARKS_SQL``)."""
    bare = {key: conversation_id_of(key) for key in conversation_ids}
    rows = await conn.fetch(_MARKS_SQL, list(conversation_ids), list(set(bare.values())))
    own = {row["conversation_id"]: _mark_of(row) for row in rows if not row["legacy"]}
    legacy = {row["conversation_id"]: _mark_of(row) for row in rows if row["legacy"]}
    marks: dict[str, list[EraseMark]] = {}
    for key in conversation_ids:
        found = [mark for mark in (own.get(key), legacy.get(bare[key])) if mark is not None]
        if found:
            marks[key] = found
    return marks


def covered(marks: dict[str, list[EraseMark]], incoming: IncomingMessage) -> bool:
    message = incoming.message
    return any(
        mark.covers(incoming.partition, incoming.offset, message.created_at)
        for mark in marks.get(message.conversation_id, ())
    )


async def _save_in_transaction(
    conn: Any, group: Sequence[tuple[int, IncomingMessage]], lock_class: int
) -> dict[int, SaveOutcome]:
    conversations = _conversations([incoming for _, incoming in group])
    await conn.execute(_LOCK_SQL, lock_class, conversations)
    marks = await erase_marks(conn, conversations)
    outcomes: dict[int, SaveOutcome] = {}
    admitted: list[tuple[int, IncomingMessage]] = []
    for position, incoming in group:
        if covered(marks, incoming):
            outcomes[position] = SaveOutcome("erased")
        else:
            admitted.append((position, incoming))
    await record_conversations(conn, [incoming for _, incoming in admitted])
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
        [r.message.pinned for r in rows],
    )
    return {(row["conversation_id"], row["id"]): int(row["seq"]) for row in inserted}


if TYPE_CHECKING:

    def _implements(ingest: PostgresIngest) -> IngestStore:
        """Never called: makes mypy prove the class implements its port."""
        return ingest
