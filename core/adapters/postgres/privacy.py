"""Tenants and erasure (``PostgresPrivacy``): a conversation erased, and a
conversation without a tenant moved into one.

A conversation is (tenant, id) and its key says so (``core.domain.tenancy``),
so a message never changes a conversation's tenant: a message naming a tenant
names that tenant's conversation. Conversations stored before tenants existed
are conversations without one (migration 0010); when their producers start
naming a tenant, an operator moves each history into it (``compactor tenants
assign``), re-keyed in one transaction, so the next message continues it
instead of starting anew.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.adapters.postgres.errors import port_errors_on_methods
from core.domain.erasure import merged_offsets
from core.domain.tenancy import conversation_key
from core.ports.storage import EraseOutcome, Erasure, PrivacyStore, TenantConflictError

# Every table holding a conversation's rows, children first; erase_conversation
# empties them (tests/integration/test_tenants_and_erase.py checks this list,
# with KEPT_TABLES, against every table with a conversation_id column).
ERASED_TABLES = (
    "outbox",
    "compaction_rejections",
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

# Every table re-keyed with the conversation: its rows, and the erase mark and
# audit that make an earlier erase hold and answer for it. (legacy_erasures is
# keyed by the bare id and covers every tenant already.)
MOVED_TABLES = (*ERASED_TABLES, "erasures", "erase_audit")

_HAS_ROWS_SQL = """
SELECT EXISTS (SELECT 1 FROM messages WHERE conversation_id = $1)
    OR EXISTS (SELECT 1 FROM archival_memory WHERE conversation_id = $1)
    OR EXISTS (SELECT 1 FROM archived_messages WHERE conversation_id = $1)
"""

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

_KEEP_USAGE_SQL = """
INSERT INTO usage_aggregates (tenant_id, day, source, compactions, llm_calls, input_tokens,
                              output_tokens, cache_read_tokens, cache_write_tokens,
                              budget_tokens, cost_usd, fallback_compactions)
SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date, 'erased', count(*), sum(llm_calls),
       sum(input_tokens), sum(output_tokens), sum(cache_read_tokens), sum(cache_write_tokens),
       coalesce(sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens)
                FILTER (WHERE summarizer IS NOT NULL AND summarizer <> 'extractive'), 0),
       coalesce(sum(cost_usd), 0), count(*) FILTER (WHERE budget_fallback)
  FROM compactions
 WHERE conversation_id = $1
 GROUP BY 1, 2
"""

_AUDIT_SQL = """
INSERT INTO erase_audit (request_id, conversation_id, requester, reason, requested_at,
                         erased_at, epoch, counts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)
"""


def _jsonb(value: Any) -> Any:
    """The pool's connections decode jsonb (``configure_connection``); a bare one does not."""
    return json.loads(value) if isinstance(value, str) else value


@port_errors_on_methods
class PostgresPrivacy:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def erase_conversation(self, conversation_id: str, erasure: Erasure) -> EraseOutcome:
        """Delete the conversation from every table in ``ERASED_TABLES`` and record the
        erase (``erasures``: its mark and epoch; ``erase_audit``), in one transaction
        under its advisory lock (a compaction racing it either committed before,
        and is erased too, or finds its messages gone and writes nothing; an
        ingest racing it either committed before, and is erased, or reads the
        mark after it).

        A request id applied before (a redelivered request) deletes again but
        neither raises the epoch nor audits twice; it answers the first
        application's counts, so a retried ``EraseCompleted`` says what was erased."""
        async with self._pool.acquire() as conn, conn.transaction():
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

    async def move_to_tenant(self, conversation_id: str, tenant_id: str) -> bool:
        """Under both keys' locks (sorted), so no message is being stored for either
        meanwhile."""
        source = conversation_key(None, conversation_id)
        target = conversation_key(tenant_id, conversation_id)
        async with self._pool.acquire() as conn, conn.transaction():
            for key in sorted((source, target)):
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2))", CONVERSATION_LOCK_CLASS, key
                )
            moving = await conn.fetchval(_HAS_ROWS_SQL, source)
            there = await conn.fetchval(_HAS_ROWS_SQL, target)
            if not moving:
                if there:
                    return False  # moved before
                raise TenantConflictError(
                    f"no conversation {conversation_id[:80]!r} without a tenant to move"
                )
            if there:
                raise TenantConflictError(
                    f"tenant {tenant_id!r} has a conversation {conversation_id[:80]!r} already; "
                    "two histories are never merged (erase one of them first)"
                )
            await _rekey(conn, source, target, tenant_id)
        return True


async def _delete_rows(conn: asyncpg.Connection, conversation_id: str) -> dict[str, int]:
    """Empty every table of ``ERASED_TABLES`` of the conversation: rows removed per table.
    Its compactions' usage is kept first, summed by tenant and day without the
    conversation (``usage_aggregates``, migration 0014): an erase neither refunds
    the tenant's LLM budget of the day nor removes its usage history. A repeated
    erase finds no compactions left, so it adds nothing."""
    await conn.execute(_KEEP_USAGE_SQL, conversation_id)
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


async def _rekey(conn: asyncpg.Connection, source: str, target: str, tenant_id: str) -> None:
    """Every row of ``source`` re-keyed to ``target``, its erase marks merged."""
    await _merge_erase_marks(conn, source, target)
    await conn.execute("DELETE FROM conversations WHERE conversation_id = $1", target)
    for table in MOVED_TABLES:
        await conn.execute(
            f"UPDATE {table} SET conversation_id = $2 WHERE conversation_id = $1", source, target
        )
    await conn.execute(
        "UPDATE conversations SET tenant_id = $2 WHERE conversation_id = $1", target, tenant_id
    )
    await conn.execute(
        "UPDATE outbox SET key = $1 WHERE conversation_id = $1 AND topic = 'clip_archives'",
        target,
    )


# The tenant's key was erased before (no rows left, its mark kept): one mark
# for the moved conversation that covers what either covered, counting both's
# erases (so its compaction ids repeat neither's).
_MERGE_MARKS_SQL = """
WITH source AS (DELETE FROM erasures WHERE conversation_id = $1 RETURNING *)
UPDATE erasures AS t
   SET epoch = t.epoch + s.epoch,
       offsets = (SELECT coalesce(jsonb_object_agg(p, greatest_offset), '{}'::jsonb)
                    FROM (SELECT p, max(o::bigint) AS greatest_offset
                            FROM (SELECT * FROM jsonb_each_text(t.offsets)
                                  UNION ALL
                                  SELECT * FROM jsonb_each_text(s.offsets)) AS both_marks(p, o)
                           GROUP BY p) AS merged),
       cutoff = greatest(t.cutoff, s.cutoff),
       erased_at = greatest(t.erased_at, s.erased_at)
  FROM source AS s
 WHERE t.conversation_id = $2
"""


async def _merge_erase_marks(conn: asyncpg.Connection, source: str, target: str) -> None:
    if await conn.fetchval("SELECT 1 FROM erasures WHERE conversation_id = $1", target):
        await conn.execute(_MERGE_MARKS_SQL, source, target)


if TYPE_CHECKING:

    def _implements(privacy: PostgresPrivacy) -> PrivacyStore:
        """Never called: makes mypy prove the class implements its port."""
        return privacy
