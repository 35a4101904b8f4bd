"""Tenants set by an operator: conversations stored before tenants existed.

Migration 0005 added the ``conversations`` table; a conversation stored before
it has messages (or archived batches) and no row. Such a conversation is never
claimed by a message (``ingest._CLAIM_SQL`` refuses a claim, ``tenant_unassigned``):
its whole history would go to whichever tenant the next message names. An
operator lists them and assigns each its tenant, or none, here
(``compactor tenants``).
"""

from __future__ import annotations

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.ports.storage import TenantConflictError

# The conversation's tenant after the assignment: the row inserted now, or the
# existing one (same snapshot: exactly one of the two selects returns a row).
_ASSIGN_SQL = """
WITH assigned AS (
    INSERT INTO conversations (conversation_id, tenant_id) VALUES ($1, $2::text)
    ON CONFLICT (conversation_id) DO NOTHING
    RETURNING tenant_id
)
SELECT tenant_id, true AS assigned FROM assigned
UNION ALL
SELECT tenant_id, false AS assigned FROM conversations WHERE conversation_id = $1
LIMIT 1
"""

_UNASSIGNED_SQL = """
SELECT conversation_id FROM (
    SELECT DISTINCT conversation_id FROM messages
    UNION
    SELECT DISTINCT conversation_id FROM archival_memory
) AS stored
 WHERE NOT EXISTS (SELECT 1 FROM conversations AS c
                    WHERE c.conversation_id = stored.conversation_id)
 ORDER BY conversation_id
 LIMIT $1
"""


async def assign_tenant(pool: asyncpg.Pool, conversation_id: str, tenant_id: str | None) -> bool:
    """``PostgresStore.assign_tenant``: under the conversation's lock, so no message
    is being stored for it meanwhile."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            CONVERSATION_LOCK_CLASS,
            conversation_id,
        )
        row = await conn.fetchrow(_ASSIGN_SQL, conversation_id, tenant_id)
        assert row is not None
        if row["tenant_id"] != tenant_id:
            raise TenantConflictError(
                f"conversation {conversation_id[:80]!r} already belongs to "
                f"{row['tenant_id']!r}; a conversation never changes tenant"
            )
        return bool(row["assigned"])


async def unassigned_conversations(pool: asyncpg.Pool, limit: int) -> list[str]:
    rows = await pool.fetch(_UNASSIGNED_SQL, limit)
    return [str(row["conversation_id"]) for row in rows]
