"""Migration 0011's figures of the turns archived before it, counted in batches.

``core/adapters/postgres/migrate_backfill.py`` counts them after 0011's
transaction, while writers go on: what they write meanwhile, and a backfill
interrupted and resumed, must leave the same figures as a rebuild.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from core.adapters.postgres.migrate import load_migrations, migrate
from core.adapters.postgres.migrate_backfill import (
    _LIST_CONVERSATIONS,
    _count_one_batch,
    finish_backfills,
)
from devtools.migration_lock import TURNS_PER_CONVERSATION, fill_archived_turns
from tests.chaos.test_upgrade import bm25_figures_off

pytestmark = [pytest.mark.integration]

_ADD = """
INSERT INTO archived_messages (conversation_id, id, batch_id, compaction_id, role, content,
                               created_at, token_estimate, seq)
VALUES ($1, $2, NULL, 'later', 'user', $3, now(), 8, 1000)
"""


@pytest.fixture
async def before_0011(pg_empty_database: str) -> AsyncIterator[asyncpg.Connection]:
    """A database as the previous release left it, 4 conversations archived,
    then 0011's own transaction: the backfill still to do."""
    await migrate(pg_empty_database, stop_before="0011")
    await fill_archived_turns(pg_empty_database, 4 * TURNS_PER_CONVERSATION)
    conn = await asyncpg.connect(pg_empty_database)
    (sql,) = [m.sql for m in load_migrations() if m.version == "0011"]
    async with conn.transaction():
        await conn.execute(sql)
    try:
        yield conn
    finally:
        await conn.close()


async def terms_off(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            """
            WITH rebuilt AS (
                SELECT a.conversation_id, u.lexeme, count(*) AS turns
                  FROM archived_messages AS a, unnest(a.content_tsv) AS u
                 GROUP BY a.conversation_id, u.lexeme
            )
            SELECT count(*) FROM rebuilt
              FULL JOIN archived_term_stats AS kept USING (conversation_id, lexeme)
             WHERE kept.turns IS DISTINCT FROM rebuilt.turns
            """
        )
    )


async def test_writes_before_and_during_the_backfill_end_in_a_rebuilds_figures(
    before_0011: asyncpg.Connection,
) -> None:
    conn = before_0011
    # 0011's transaction lists nothing (listing reads every turn): the row '' only.
    assert await conn.fetchval(
        "SELECT array_agg(conversation_id) FROM archived_stats_backfill"
    ) == [""]
    first, second = "fill-0-0", "fill-1-0"
    # Before the listing: a compaction archives a turn into an old conversation,
    # an erase (or the retention timer) removes all of another's, more than the
    # triggers counted, and a new conversation is archived (listed too, recounted).
    await conn.execute(_ADD, first, "new-1", "a turn archived during the upgrade")
    await conn.execute(_ADD, second, "new-2", "counted by the trigger alone")
    await conn.execute("DELETE FROM archived_messages WHERE conversation_id = $1", second)
    await conn.execute(_ADD, "late", "new-3", "a conversation begun after the triggers")
    # Interrupted after the listing and one batch (a crash), resumed by the next migrate.
    await conn.execute(_LIST_CONVERSATIONS)
    assert await _count_one_batch(conn, TURNS_PER_CONVERSATION) == 1
    await conn.execute(_ADD, first, "new-4", "after its batch: the trigger counts it")
    assert await finish_backfills(conn, TURNS_PER_CONVERSATION) == 3  # fill-2, fill-3, late
    assert await conn.fetchval("SELECT to_regclass('archived_stats_backfill')") is None
    assert (
        await conn.fetchval("SELECT count(*) FROM archived_messages WHERE word_count IS NULL") == 0
    )
    assert (await bm25_figures_off(conn), await terms_off(conn)) == (0, 0)
    assert await finish_backfills(conn) == 0  # nothing left: one catalog lookup


async def test_a_new_database_keeps_no_backfill_queue(pg_database: str) -> None:
    conn = await asyncpg.connect(pg_database)
    try:
        assert await conn.fetchval("SELECT to_regclass('archived_stats_backfill')") is None
    finally:
        await conn.close()
