"""Tenants and erasure."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.domain.erasure import merged_offsets
from core.ports.storage import EraseOutcome, Erasure

# Every table holding a conversation's rows, children first; erase_conversation
# empties them (tests/integration/test_tenants_and_erase.py checks this list,
# with KEPT_TABLES, against every table with a conversation_id column).
ERASED_TABLES = (
    "outbox",
    "compactions",
    # Before archived_messages, whose delete trigger would otherwise empty them
    # first (and the erase would report them as never there).
    "archived_term_stats",
    "archived_turn_stats",
    "archived_messages",
    "archival_memory",
    "messages",
    "conversations",
)

# Tables an erase writes rather than empties: they hold ids, offsets, times and
# counts, never content, and are what make an erase hold and answer for it.
KEPT_TABLES = ("erasures", "erase_audit", "legacy_erasures")

_MARK_SQL = """
INSERT INTO erasures AS e (conversation_id, epoch, offsets, cutoff, erased_at)
VALUES ($1, 1, $2::jsonb, $3, $4)
ON CONFLICT (conversation_id) DO UPDATE
   SET epoch = e.epoch + 1,
       offsets = $2::jsonb,
       cutoff = greatest(e.cutoff, excluded.cutoff),
       erased_at = excluded.erased_at
RETURNING epoch
"""

_AUDIT_SQL = """
INSERT INTO erase_audit (request_id, conversation_id, requester, reason, requested_at,
                         erased_at, epoch, counts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)
"""


def _jsonb(value: Any) -> Any:
    """The pool's connections decode jsonb (``configure_connection``); a bare one does not."""
    return json.loads(value) if isinstance(value, str) else value


async def erase_conversation(
    pool: asyncpg.Pool, conversation_id: str, erasure: Erasure
) -> EraseOutcome:
    """Delete the conversation from every table in ``ERASED_TABLES`` and record the
    erase (``erasures``: its mark and epoch; ``erase_audit``), in one transaction
    under its advisory lock (a compaction racing it either committed before,
    and is erased too, or finds its messages gone and writes nothing; an
    ingest racing it either committed before, and is erased, or reads the
    mark after it).

    A request id applied before (a redelivered request) deletes again but
    neither raises the epoch nor audits twice; it answers the first
    application's counts, so a retried ``EraseCompleted`` says what was erased."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            CONVERSATION_LOCK_CLASS,
            conversation_id,
        )
        removed = await _delete_rows(conn, conversation_id)
        applied_before = await _applied_before(conn, conversation_id, erasure.request_id)
        if applied_before is not None:
            return applied_before
        epoch = await _mark(conn, conversation_id, erasure)
        await conn.execute(
            _AUDIT_SQL,
            erasure.request_id,
            conversation_id,
            erasure.requester,
            erasure.reason,
            erasure.requested_at,
            erasure.erased_at,
            epoch,
            removed,
        )
    return EraseOutcome(removed, epoch, erasure.erased_at)


async def _delete_rows(conn: asyncpg.Connection, conversation_id: str) -> dict[str, int]:
    """Empty every table of ``ERASED_TABLES`` of the conversation: rows removed per table."""
    removed: dict[str, int] = {}
    for table in ERASED_TABLES:
        status = await conn.execute(
            f"DELETE FROM {table} WHERE conversation_id = $1", conversation_id
        )
        removed[table] = int(status.rsplit(" ", 1)[-1])
    return removed


async def _applied_before(
    conn: asyncpg.Connection, conversation_id: str, request_id: str
) -> EraseOutcome | None:
    """The first application's outcome, when this request was applied before."""
    before = await conn.fetchrow(
        "SELECT erased_at, epoch, counts FROM erase_audit "
        "WHERE request_id = $1 AND conversation_id = $2",
        request_id,
        conversation_id,
    )
    if before is None:
        return None
    counts = {str(k): int(v) for k, v in _jsonb(before["counts"]).items()}
    return EraseOutcome(counts, int(before["epoch"]), before["erased_at"], repeated=True)


async def _mark(conn: asyncpg.Connection, conversation_id: str, erasure: Erasure) -> int:
    """Raise the conversation's erase mark (offsets merged with the previous mark's):
    its new epoch."""
    previous = await conn.fetchval(
        "SELECT offsets FROM erasures WHERE conversation_id = $1", conversation_id
    )
    offsets = merged_offsets(_jsonb(previous) or {}, erasure.offsets)
    epoch = await conn.fetchval(
        _MARK_SQL,
        conversation_id,
        {str(p): o for p, o in offsets.items()},
        erasure.requested_at,
        erasure.erased_at,
    )
    return int(epoch)
