"""Work a migration leaves to be done after its transaction, in short batches.

Migration 0011 keeps BM25 figures of the archived turns (triggers on
``archived_messages``). As first written it added a stored generated
``word_count`` (a rewrite of the table) and counted the turns archived before
it in its own transaction, under an exclusive lock on ``archived_messages``:
about 19 s per 100,000 turns during which every compaction waited. It now
adds a plain column and lists the conversations to count
(``archived_stats_backfill``); ``migrate`` fills their turns' word counts
and counts them here, a batch of conversations per transaction.

A batch takes ``archived_messages`` in SHARE mode: readers go on, writers
(compactions, the retention timer, an erase, a previous release's worker)
wait for that one batch only. Under it no turn of the batch's conversations
is added or removed, so the figures are recounted from the turns themselves,
replacing whatever the triggers counted meanwhile: a crash between batches
loses nothing and the next ``migrate`` resumes with the conversations left.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeAlias

import asyncpg

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    AnyConnection: TypeAlias = asyncpg.Connection | PoolConnectionProxy

log = logging.getLogger(__name__)

#: Turns counted per batch (one conversation at least, whatever its size):
#: a fraction of a second of writers waiting (docs/operations.md, "Upgrading").
BACKFILL_BATCH_TURNS = 500

_NEXT_BATCH = """
SELECT conversation_id FROM (
    SELECT conversation_id,
           sum(turns) OVER (ORDER BY conversation_id) - turns AS before
      FROM archived_stats_backfill
) AS queued
 WHERE before < $1
 ORDER BY conversation_id
"""

_LIST_CONVERSATIONS = """
WITH listed AS (
    INSERT INTO archived_stats_backfill (conversation_id, turns)
    SELECT conversation_id, count(*) FROM archived_messages
     WHERE EXISTS (SELECT 1 FROM archived_stats_backfill WHERE conversation_id = '')
     GROUP BY conversation_id
    ON CONFLICT (conversation_id) DO NOTHING
)
DELETE FROM archived_stats_backfill WHERE conversation_id = ''
"""

_RECOUNT = """
WITH batch AS (SELECT unnest($1::text[]) AS conversation_id),
gone_turns AS (
    DELETE FROM archived_turn_stats WHERE conversation_id IN (SELECT conversation_id FROM batch)
),
gone_terms AS (
    DELETE FROM archived_term_stats WHERE conversation_id IN (SELECT conversation_id FROM batch)
),
done AS (
    DELETE FROM archived_stats_backfill WHERE conversation_id IN (SELECT conversation_id FROM batch)
)
SELECT 1
"""

_WORD_COUNTS = """
UPDATE archived_messages SET word_count = regexp_count(content, '\\w+')
 WHERE conversation_id = ANY($1::text[]) AND word_count IS NULL
"""

_COUNT_TURNS = """
INSERT INTO archived_turn_stats (conversation_id, turns, words)
SELECT conversation_id, count(*), coalesce(sum(word_count), 0)
  FROM archived_messages WHERE conversation_id = ANY($1::text[])
 GROUP BY conversation_id
"""

_COUNT_TERMS = """
INSERT INTO archived_term_stats (conversation_id, lexeme, turns)
SELECT a.conversation_id, u.lexeme, count(*)
  FROM archived_messages AS a, unnest(a.content_tsv) AS u
 WHERE a.conversation_id = ANY($1::text[])
 GROUP BY a.conversation_id, u.lexeme
"""


async def finish_backfills(conn: AnyConnection, batch_turns: int = BACKFILL_BATCH_TURNS) -> int:
    """Count the queued conversations' archived turns; the number counted.

    Called by ``migrate`` after the migrations (under its advisory lock), on
    every run: nothing to do costs one catalog lookup.
    """
    if not await conn.fetchval("SELECT to_regclass('archived_stats_backfill') IS NOT NULL"):
        return 0
    # Listed once (while the row '' says not yet), without a lock: readers and
    # writers go on; a conversation whose turns all came after the triggers may
    # be listed too, and its recount is the same.
    await conn.execute(_LIST_CONVERSATIONS)
    counted = 0
    while batch := await _count_one_batch(conn, batch_turns):
        counted += batch
    await conn.execute("DROP TABLE archived_stats_backfill")
    if counted:
        log.info("migration 0011: counted the BM25 figures of %d conversations", counted)
    return counted


async def _count_one_batch(conn: AnyConnection, batch_turns: int) -> int:
    """Recount one batch of queued conversations; how many (0: the queue is empty)."""
    async with conn.transaction():
        # Before choosing the batch: once the lock is held, no writer can
        # change the turns of what is chosen.
        await conn.execute("LOCK TABLE archived_messages IN SHARE MODE")
        rows = await conn.fetch(_NEXT_BATCH, batch_turns)
        batch = [str(row["conversation_id"]) for row in rows]
        if not batch:
            return 0
        await conn.execute(_WORD_COUNTS, batch)
        await conn.execute(_RECOUNT, batch)
        await conn.execute(_COUNT_TURNS, batch)
        await conn.execute(_COUNT_TERMS, batch)
    return len(batch)
