"""Moving a conversation without a tenant into one (``compactor tenants assign``).

A conversation is (tenant, id) and its key says so (``core.domain.tenancy``),
so a message never changes a conversation's tenant: a message naming a tenant
names that tenant's conversation. Conversations stored before tenants existed
are conversations without one (migration 0010); when their producers start
naming a tenant, an operator moves each history into it, re-keyed in one
transaction, so the next message continues it instead of starting anew.
"""

from __future__ import annotations

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.adapters.postgres.privacy import ERASED_TABLES
from core.domain.tenancy import conversation_key
from core.ports.storage import TenantConflictError

# Every table re-keyed with the conversation: its rows, and the erase mark and
# audit that make an earlier erase hold and answer for it. (legacy_erasures is
# keyed by the bare id and covers every tenant already.)
MOVED_TABLES = (*ERASED_TABLES, "erasures", "erase_audit")

_HAS_ROWS_SQL = """
SELECT EXISTS (SELECT 1 FROM messages WHERE conversation_id = $1)
    OR EXISTS (SELECT 1 FROM archival_memory WHERE conversation_id = $1)
    OR EXISTS (SELECT 1 FROM archived_messages WHERE conversation_id = $1)
"""


async def move_to_tenant(pool: asyncpg.Pool, conversation_id: str, tenant_id: str) -> bool:
    """``PostgresStore.move_to_tenant``: under both keys' locks (sorted), so no
    message is being stored for either meanwhile."""
    source = conversation_key(None, conversation_id)
    target = conversation_key(tenant_id, conversation_id)
    async with pool.acquire() as conn, conn.transaction():
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
        await _merge_erase_marks(conn, source, target)
        await conn.execute("DELETE FROM conversations WHERE conversation_id = $1", target)
        for table in MOVED_TABLES:
            await conn.execute(
                f"UPDATE {table} SET conversation_id = $2 WHERE conversation_id = $1",
                source,
                target,
            )
        await conn.execute(
            "UPDATE conversations SET tenant_id = $2 WHERE conversation_id = $1", target, tenant_id
        )
        await conn.execute(
            "UPDATE outbox SET key = $1 WHERE conversation_id = $1 AND topic = 'clip_archives'",
            target,
        )
    return True


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
