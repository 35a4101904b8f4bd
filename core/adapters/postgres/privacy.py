"""Tenants and erasure."""

from __future__ import annotations

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS

# Every table holding a conversation's rows, children first; erase_conversation
# empties them (tests/integration/test_erase.py checks this list against every
# table with a conversation_id column).
ERASED_TABLES = (
    "outbox",
    "compactions",
    "archived_messages",
    "archival_memory",
    "messages",
    "conversations",
)


async def conversation_tenant(pool: asyncpg.Pool, conversation_id: str) -> str | None:
    value = await pool.fetchval(
        "SELECT tenant_id FROM conversations WHERE conversation_id = $1", conversation_id
    )
    return None if value is None else str(value)


async def erase_conversation(pool: asyncpg.Pool, conversation_id: str) -> dict[str, int]:
    """Delete the conversation from every table in ``ERASED_TABLES``, in one
    transaction under its advisory lock (a compaction racing it either
    committed before, and is erased too, or finds its messages gone and
    writes nothing)."""
    removed: dict[str, int] = {}
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            CONVERSATION_LOCK_CLASS,
            conversation_id,
        )
        for table in ERASED_TABLES:
            status = await conn.execute(
                f"DELETE FROM {table} WHERE conversation_id = $1", conversation_id
            )
            removed[table] = int(status.rsplit(" ", 1)[-1])
    return removed
