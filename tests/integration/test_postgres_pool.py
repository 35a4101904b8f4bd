"""The store's pool skips asyncpg's reset query, and that leaves nothing behind.

Why: asyncpg's default reset (``pg_advisory_unlock_all(); CLOSE ALL;
UNLISTEN *; RESET ALL``) runs after every pooled call, doubling the round
trips of one-statement calls, which a compaction makes a dozen of. The store
can go without it only because it keeps no session state: its advisory locks
are transaction-scoped and asyncpg still rolls back a transaction left open.
These tests pin both halves on a real PostgreSQL.
"""

from __future__ import annotations

import asyncpg
import pytest

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.adapters.postgres.store import PostgresStore
from core.domain.compaction import CompactionPlan, StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage
from core.ports.storage import Applied
from tests.support.builders import T0, history
from tests.support.stores import saved

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_pooled_call_is_not_followed_by_a_reset(pg_database: str) -> None:
    store = await PostgresStore.connect(pg_database, min_size=1, max_size=1, run_migrations=False)
    try:
        # Session state survives release: only a reset query would clear it.
        await store.pool.execute("SET application_name = 'kept'")
        assert await store.pool.fetchval("SHOW application_name") == "kept"
    finally:
        await store.close()


async def test_an_open_transaction_is_still_rolled_back_on_release(pg_database: str) -> None:
    store = await PostgresStore.connect(pg_database, min_size=1, max_size=1, run_migrations=False)
    try:
        async with store.pool.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute("CREATE TABLE left_open (x int)")
        # The same (only) connection: the table was rolled back, not committed.
        assert await store.pool.fetchval("SELECT to_regclass('left_open')") is None
    finally:
        await store.close()


async def test_a_compaction_leaves_no_advisory_lock_on_its_connection(
    pg_database: str,
) -> None:
    """The conversation lock is transaction-scoped: once apply_compaction has
    committed, another session can take it at once."""
    store = await PostgresStore.connect(pg_database, min_size=1, max_size=1, run_migrations=False)
    other = await asyncpg.connect(pg_database)
    try:
        messages = history(3)
        for message in messages:
            await saved(store, message, 10)
        assert await store.compactions.apply_compaction(plan_over(messages[:2])) == Applied()
        taken = await other.fetchval(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            CONVERSATION_LOCK_CLASS,
            messages[0].conversation_id,
        )
        assert taken is True
    finally:
        await other.close()
        await store.close()


def plan_over(compressed: list[ConversationMessage]) -> CompactionPlan:
    conversation_id = compressed[0].conversation_id
    batch = StoredBatch(
        id="cmp-1:0",
        label="batch-0",
        conversation_id=conversation_id,
        batch=SummaryBatch(
            content="summary",
            depth=0,
            start_time=compressed[0].created_at,
            end_time=compressed[-1].created_at,
            message_count=len(compressed),
            source_message_ids=tuple(m.id for m in compressed),
        ),
        compaction_id="cmp-1",
    )
    return CompactionPlan(
        compaction_id="cmp-1",
        conversation_id=conversation_id,
        new_batches=(batch,),
        superseded=(),
        deleted_message_ids=tuple(m.id for m in compressed),
        clip_archive=ConversationMessage(
            id="clip-archive-cmp-1",
            conversation_id=conversation_id,
            role="system",
            content="[Context Summary]",
            created_at=T0,
        ),
        messages_compressed=len(compressed),
        tokens_estimate_before=30,
        tokens_estimate_after=15,
    )
