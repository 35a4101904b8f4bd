"""Archived batches and raw turns (``PostgresArchive``): the clip-archive's batches,
one batch expanded, the compaction log, retention. A read with a ``ReadScope``
runs as the scope (``connection.read_as``)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS, read_as
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.rows import BATCH_COLUMNS, row_to_batch, row_to_message
from core.domain.compaction import StoredBatch
from core.domain.strategies import StrategyFreed
from core.domain.usage import LlmUsage
from core.ports.storage import (
    Archive,
    CompactedBatch,
    CompactionRecord,
    ExpandedBatch,
    MessageKey,
    ReadScope,
)

if TYPE_CHECKING:
    from core.adapters.postgres.connection import Queryable

log = logging.getLogger(__name__)

# Archived raw turns removed per conversation and per call of expire_raw_turns.
EXPIRE_BATCH = 1000


@port_errors_on_methods
class PostgresArchive:
    """``raw_retention_days``: how long archived raw turns are kept (0: forever);
    ``reads``: the pool a caller's reads (with a scope) take."""

    def __init__(
        self, pool: asyncpg.Pool, *, raw_retention_days: int = 0, reads: asyncpg.Pool | None = None
    ) -> None:
        if raw_retention_days < 0:
            raise ValueError("raw_retention_days must be >= 0 (0 keeps raw turns forever)")
        self._pool = pool
        self._reads = pool if reads is None else reads
        self._raw_retention_days = raw_retention_days

    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        rows = await self._pool.fetch(
            f"""
            SELECT {BATCH_COLUMNS}
              FROM archival_memory
             WHERE conversation_id = $1 AND superseded_by IS NULL
             ORDER BY coalesce(archive_order, seq), seq
            """,
            conversation_id,
        )
        return [row_to_batch(row) for row in rows]

    async def expand_batch(
        self,
        conversation_id: str,
        batch_id: str,
        *,
        scope: ReadScope | None = None,
        after: MessageKey | None = None,
        limit: int | None = None,
    ) -> ExpandedBatch | None:
        async with read_as(self._pool if scope is None else self._reads, scope) as conn:
            return await _expand_batch(conn, conversation_id, batch_id, after=after, limit=limit)

    async def compaction_log(
        self, conversation_id: str, *, scope: ReadScope | None = None
    ) -> list[CompactionRecord]:
        async with read_as(self._pool if scope is None else self._reads, scope) as conn:
            return await _compaction_log(conn, conversation_id)

    async def expire_raw_turns(self) -> int:
        return await _expire_raw_turns(self._pool, self._raw_retention_days)


_BATCH_TURNS_SQL = """
SELECT id, conversation_id, role, content, tool_calls, tool_call_id, created_at,
       token_estimate
  FROM archived_messages
 WHERE conversation_id = $1 AND id = ANY($2::text[])
   AND ($3::timestamptz IS NULL OR (created_at, id) > ($3, $4::text))
 ORDER BY created_at, id
 LIMIT $5::bigint
"""


async def _expand_batch(
    pool: Queryable,
    conversation_id: str,
    batch_id: str,
    *,
    after: MessageKey | None = None,
    limit: int | None = None,
) -> ExpandedBatch | None:
    """The batch with every archived raw turn it covers, in conversation order;
    with ``after`` / ``limit`` one page of them (keyset over (created_at, id))."""
    row = await pool.fetchrow(
        f"SELECT {BATCH_COLUMNS} FROM archival_memory WHERE conversation_id = $1 AND id = $2",
        conversation_id,
        batch_id,
    )
    if row is None:
        return None
    batch = row_to_batch(row)
    ids = list(batch.batch.source_message_ids)
    turns = await pool.fetch(
        _BATCH_TURNS_SQL,
        conversation_id,
        ids,
        None if after is None else after.created_at,
        None if after is None else after.id,
        limit,
    )
    whole = after is None and limit is None
    archived = len(turns) if whole else await _archived_count(pool, conversation_id, ids)
    return ExpandedBatch(
        batch=batch,
        turns=tuple(row_to_message(t) for t in turns),
        turns_missing=len(set(ids)) - archived,
        turn_tokens={t["id"]: int(t["token_estimate"]) for t in turns},
    )


async def _archived_count(pool: Queryable, conversation_id: str, ids: list[str]) -> int:
    """How many of the batch's turns are still archived (a page holds only some)."""
    count = await pool.fetchval(
        "SELECT count(*) FROM archived_messages WHERE conversation_id = $1 "
        "AND id = ANY($2::text[])",
        conversation_id,
        ids,
    )
    return int(count)


async def _expire_raw_turns(pool: asyncpg.Pool, retention_days: int) -> int:
    """Remove raw turns archived more than ``retention_days`` ago.

    One index range scan names the conversations with expired turns (at
    most 100 per call), then one transaction per conversation removes at
    most ``EXPIRE_BATCH`` of its rows: each call is bounded, and a timer
    calling it every few minutes catches up with any backlog.
    """
    if retention_days == 0:
        return 0
    cutoff = datetime.now().astimezone() - timedelta(days=retention_days)
    removed = 0
    try:
        conversations = await pool.fetch(
            "SELECT DISTINCT conversation_id FROM archived_messages "
            "WHERE archived_at < $1 LIMIT 100",
            cutoff,
        )
        for row in conversations:
            removed += await _expire_conversation(pool, row["conversation_id"], cutoff)
    except (asyncpg.PostgresError, OSError) as error:
        log.warning("removing expired raw turns failed, next pass retries: %s", error)
    if removed:
        log.info("removed %d raw turns archived before %s", removed, cutoff.isoformat())
    return removed


async def _expire_conversation(pool: asyncpg.Pool, conversation_id: str, cutoff: datetime) -> int:
    """Under the conversation's advisory lock, like the compaction that archives
    turns (the triggers of migration 0011 take them out of the BM25 figures)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            CONVERSATION_LOCK_CLASS,
            conversation_id,
        )
        status = await conn.execute(
            """
            DELETE FROM archived_messages
             WHERE conversation_id = $1 AND id IN (
                   SELECT id FROM archived_messages
                    WHERE conversation_id = $1 AND archived_at < $2 LIMIT $3)
            """,
            conversation_id,
            cutoff,
            EXPIRE_BATCH,
        )
    return int(status.rsplit(" ", 1)[-1])


async def _compaction_log(pool: Queryable, conversation_id: str) -> list[CompactionRecord]:
    """The conversation's compactions, oldest first, each with the batches it archived
    (one query: the batches aggregated per compaction, in plan order)."""
    rows = await pool.fetch(
        """
        SELECT c.compaction_id, c.created_at, c.messages_compressed, c.batches_created,
               c.tokens_before, c.tokens_after, c.summarizer, c.model, c.llm_calls,
               c.input_tokens, c.output_tokens, c.cache_read_tokens, c.cache_write_tokens,
               c.cost_usd, c.budget_fallback, c.strategies,
               coalesce(jsonb_agg(jsonb_build_object(
                   'batch_id', a.id, 'label', a.label, 'depth', a.depth,
                   'start_time', a.start_time, 'end_time', a.end_time,
                   'message_count', a.message_count, 'superseded_by', a.superseded_by)
                 ORDER BY a.seq) FILTER (WHERE a.id IS NOT NULL), '[]'::jsonb) AS batches
          FROM compactions c
          LEFT JOIN archival_memory a
            ON a.conversation_id = c.conversation_id AND a.compaction_id = c.compaction_id
         WHERE c.conversation_id = $1
         GROUP BY c.conversation_id, c.compaction_id
         ORDER BY c.created_at, c.compaction_id
        """,
        conversation_id,
    )
    return [
        CompactionRecord(
            compaction_id=row["compaction_id"],
            created_at=row["created_at"],
            messages_compressed=row["messages_compressed"],
            batches_created=row["batches_created"],
            tokens_before=row["tokens_before"],
            tokens_after=row["tokens_after"],
            usage=_usage(row),
            batches=tuple(CompactedBatch.model_validate(b) for b in _json(row["batches"])),
            strategies=tuple(
                StrategyFreed.model_validate(s) for s in _json(row["strategies"] or "[]")
            ),
        )
        for row in rows
    ]


def _usage(row: asyncpg.Record) -> LlmUsage | None:
    """The compaction's LLM spend (None for a row from before migration 0012)."""
    if row["summarizer"] is None:
        return None
    return LlmUsage(
        summarizer=row["summarizer"],
        model=row["model"] or row["summarizer"],
        calls=row["llm_calls"],
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        cache_read_tokens=row["cache_read_tokens"],
        cache_write_tokens=row["cache_write_tokens"],
        cost_usd=row["cost_usd"],
        fallback=row["budget_fallback"],
    )


def _json(value: object) -> list[dict[str, object]]:
    """A jsonb column as asyncpg hands it over (text unless a codec is set)."""
    parsed = json.loads(value) if isinstance(value, str) else value
    return parsed if isinstance(parsed, list) else []


if TYPE_CHECKING:

    def _implements(archive: PostgresArchive) -> Archive:
        """Never called: makes mypy prove the class implements its port."""
        return archive
