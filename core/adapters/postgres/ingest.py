"""Storing a group of incoming messages in one call: the accounting hot path.

One message at a time would cost five round trips per message (a transaction,
the conversation's advisory lock, the erase mark, the tenant, the insert); at
the rate a worker reads a topic that is the bottleneck. A group goes in with
the same guarantees in one call of ``compactor_ingest`` (migration 0018),
whatever its size: it locks every conversation of the group (sorted, so two
ingests cannot deadlock; ``apply_compaction`` takes one of them), reads the
erase marks of those that were erased, records new conversations' tenants and
every conversation's watermark, inserts and returns the arrival numbers. Alone,
that one statement is its own transaction.

A group that touches an erased conversation gets the marks back and nothing is
written; it is then stored in a transaction of its own: the marks read again
under the locks, each message an erase covers is ``erased``, nothing of it
written (``core.domain.erasure``), and the rest stored by a second call.

A message that a compaction already summarised and deleted must not come back
when it is delivered again (Kafka redelivers after a crash, a producer
retries, a transcript is replayed): it would sit in the history next to the
summary that covers it and be compacted twice. Archived batches keep their
source message ids, so they are the record of what was compacted; the check
runs under the conversation's advisory lock, the one ``apply_compaction``
holds while it deletes, so a redelivery racing a compaction sees either the
row or its batch.

``save_free`` takes only the locks no one holds (migration 0019): a group's
messages of conversations a compaction is writing are left for a second call
that waits, so the rest, a platform's waited-for turn among them, never wait
behind another conversation's compaction.

With ``single_conversation_transactions`` the group is split into one call per
conversation, run side by side on the pool's connections, for a deployment
that distributes the schema by conversation (docs/scaling.md).
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
from core.ports.storage import FreeSaved, IncomingMessage, IngestStore, SaveOutcome

_INGEST_SQL = """
SELECT conversation_id, id, seq, legacy, epoch, offsets, cutoff
  FROM compactor_ingest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                        $17)
"""


def _tool_calls_text(incoming: IncomingMessage) -> str | None:
    """The same as text: ``unnest`` takes a ``text[]``, cast to jsonb in SQL."""
    calls = tool_calls_json(incoming.message.tool_calls)
    return None if calls is None else json.dumps(calls, separators=(",", ":"))


def _conversations(batch: Sequence[IncomingMessage]) -> list[str]:
    """The group's conversation keys, each once, in order of first appearance."""
    return list(dict.fromkeys(incoming.message.conversation_id for incoming in batch))


@port_errors_on_methods
class PostgresIngest:
    """``per_conversation``: one transaction per conversation of a group
    (``[postgres].single_conversation_transactions``)."""

    def __init__(self, pool: asyncpg.Pool, *, per_conversation: bool = False) -> None:
        self._pool = pool
        self._per_conversation = per_conversation

    async def save_free(self, batch: Sequence[IncomingMessage]) -> FreeSaved:
        """The messages of ``batch`` whose conversations no compaction holds, stored
        without waiting; the others' positions left. A group touching an erased
        conversation is stored whole, waiting, as by ``save_messages``."""
        _check_tokens(batch)
        if not batch or self._per_conversation:
            return FreeSaved(dict(enumerate(await self.save_messages(batch))))
        group = list(enumerate(batch))
        async with self._pool.acquire() as conn:
            rows = await _call(conn, batch, check_marks=True, wait=False)
            if any(row["legacy"] is not None for row in rows):  # an erased conversation
                async with conn.transaction():
                    return FreeSaved(await _save_past_erasures(conn, group))
        held = {row["conversation_id"] for row in rows if row["id"] is None}
        free = [
            (position, incoming)
            for position, incoming in group
            if incoming.message.conversation_id not in held
        ]
        left = tuple(
            position for position, incoming in group if incoming.message.conversation_id in held
        )
        return FreeSaved(_outcomes(free, [row for row in rows if row["id"] is not None]), left)

    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """The outcome of every message of ``batch``, in its order."""
        _check_tokens(batch)
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
        async with self._pool.acquire() as conn:
            rows = await _call(conn, [incoming for _, incoming in group], check_marks=True)
            if not any(row["id"] is None for row in rows):  # no erased conversation
                return _outcomes(group, rows)
            async with conn.transaction():  # the marks again, under the locks
                return await _save_past_erasures(conn, group)


def _check_tokens(batch: Sequence[IncomingMessage]) -> None:
    if any(incoming.tokens < 0 for incoming in batch):
        raise ValueError("token counts must be >= 0")


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


def _marks(rows: Sequence[Any], conversation_ids: Sequence[str]) -> dict[str, list[EraseMark]]:
    """The erase marks covering each of ``conversation_ids`` that was ever erased, from
    the rows ``compactor_ingest`` returned: its own, and a legacy mark of its
    producer's id (an erase applied before conversation keys named their tenant,
    migration 0010, kept by the bare id: it covers that id under any tenant; that
    drops no message the old rules would have stored, as then an id belonged to
    one tenant at a time)."""
    own = {row["conversation_id"]: _mark_of(row) for row in rows if row["legacy"] is False}
    legacy = {row["conversation_id"]: _mark_of(row) for row in rows if row["legacy"] is True}
    marks: dict[str, list[EraseMark]] = {}
    for key in conversation_ids:
        bare = conversation_id_of(key)
        found = [mark for mark in (own.get(key), legacy.get(bare)) if mark is not None]
        if found:
            marks[key] = found
    return marks


def covered(marks: dict[str, list[EraseMark]], incoming: IncomingMessage) -> bool:
    message = incoming.message
    return any(
        mark.covers(incoming.partition, incoming.offset, message.created_at)
        for mark in marks.get(message.conversation_id, ())
    )


async def _call(
    conn: Any, batch: Sequence[IncomingMessage], *, check_marks: bool, wait: bool = True
) -> list[Any]:
    """``compactor_ingest`` of ``batch``: the marks of its erased conversations
    (rows without an ``id``, with ``legacy`` set: nothing written), or the rows
    inserted, and without ``wait`` the conversations held by others (rows with
    neither an ``id`` nor ``legacy``: not written)."""
    keys = _conversations(batch)
    messages = [incoming.message for incoming in batch]
    return list(
        await conn.fetch(
            _INGEST_SQL,
            check_marks,
            CONVERSATION_LOCK_CLASS,
            keys,
            list({conversation_id_of(key) for key in keys}),
            [m.id for m in messages],
            [m.conversation_id for m in messages],
            [tenant_of(m.conversation_id) for m in messages],
            [m.role for m in messages],
            [m.content for m in messages],
            [_tool_calls_text(incoming) for incoming in batch],
            [m.tool_call_id for m in messages],
            [m.created_at for m in messages],
            [incoming.tokens for incoming in batch],
            [m.pinned for m in messages],
            [incoming.partition for incoming in batch],
            [incoming.offset for incoming in batch],
            wait,
        )
    )


def _outcomes(
    group: Sequence[tuple[int, IncomingMessage]], rows: Sequence[Any]
) -> dict[int, SaveOutcome]:
    """Each message's outcome from the rows inserted: a message without one was
    there already (a redelivery, or a repeated id: its first copy only)."""
    seqs = {(row["conversation_id"], row["id"]): int(row["seq"]) for row in rows}
    outcomes: dict[int, SaveOutcome] = {}
    for position, incoming in group:
        seq = seqs.pop((incoming.message.conversation_id, incoming.message.id), None)
        outcomes[position] = (
            SaveOutcome("duplicate") if seq is None else SaveOutcome("inserted", seq)
        )
    return outcomes


async def _save_past_erasures(
    conn: Any, group: Sequence[tuple[int, IncomingMessage]]
) -> dict[int, SaveOutcome]:
    """In a transaction: the group's locks and marks, then what no erase covers."""
    batch = [incoming for _, incoming in group]
    marks = _marks(await _call(conn, batch, check_marks=True), _conversations(batch))
    erased = {position for position, incoming in group if covered(marks, incoming)}
    admitted = [(position, incoming) for position, incoming in group if position not in erased]
    rows = (
        await _call(conn, [incoming for _, incoming in admitted], check_marks=False)
        if admitted
        else []
    )
    outcomes = _outcomes(admitted, rows)
    outcomes.update((position, SaveOutcome("erased")) for position in erased)
    return outcomes


if TYPE_CHECKING:

    def _implements(ingest: PostgresIngest) -> IngestStore:
        """Never called: makes mypy prove the class implements its port."""
        return ingest
