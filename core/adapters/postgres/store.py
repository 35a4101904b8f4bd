"""PostgreSQL adapter for every storage port (``WorkerStore``).

Everything one compaction writes happens in one transaction, keyed by
``compaction_id`` so a redelivered command is a no-op, and serialised per
conversation by an advisory lock so two compactions of one conversation
cannot interleave. Embeddings are computed before that transaction opens: a
slow or failing embedding service must neither hold locks nor fail a
compaction, it only costs the vector half of search for those batches.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
from pgvector.asyncpg import register_vector

from core.adapters.postgres import ingest as pg_ingest
from core.adapters.postgres import memory as pg_memory
from core.adapters.postgres.memory import RRF_K
from core.adapters.postgres.migrate import migrate
from core.domain.compaction import (
    AppliedStats,
    CompactionPlan,
    OutboxFactory,
    OutboxRecord,
    StoredBatch,
    SummaryBatch,
)
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.tokens import estimate_message_tokens
from core.ports.embedding import Embedder
from core.ports.storage import (
    ApplyResult,
    ExpandedBatch,
    HistoryConflictError,
    IncomingMessage,
    MemorySearchResult,
    OutboxRow,
    QueryMode,
    SaveOutcome,
    SearchSources,
    StoreTotals,
    TenantConflictError,
    WorkerStore,
)

if TYPE_CHECKING:
    from core.adapters.postgres.migrate import AnyConnection

log = logging.getLogger(__name__)

__all__ = ["RRF_K", "PostgresStore", "configure_connection", "keep_session"]

MAX_LIMIT = 100

# Class id for the two-int advisory lock space ("ccmp"); the object id is
# hashtext(conversation_id). Kept apart from the migration lock's bigint key.
CONVERSATION_LOCK_CLASS = int.from_bytes(b"ccmp", "big")

# pgvector's limit for the ``vector`` type.
_MAX_VECTOR_DIMS = 16_000

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

# The conversation's tenant: the existing row's, or the claimed one when this
# message is the first (the insert and the read see one snapshot, so exactly
# one of the two selects returns a row).
_CLAIM_TENANT_SQL = """
WITH claimed AS (
    INSERT INTO conversations (conversation_id, tenant_id) VALUES ($1, $2)
    ON CONFLICT (conversation_id) DO NOTHING
    RETURNING tenant_id
)
SELECT tenant_id FROM claimed
UNION ALL
SELECT tenant_id FROM conversations WHERE conversation_id = $1
LIMIT 1
"""

# Archived raw turns removed per conversation and per call of expire_raw_turns.
EXPIRE_BATCH = 1000

_BATCH_COLUMNS = """
    id, label, conversation_id, content, depth, start_time, end_time, message_count,
    source_message_ids, compaction_id, superseded_by, covered_days
"""


def _dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def configure_connection(conn: asyncpg.Connection) -> None:
    """Per-connection codecs: jsonb as Python objects, ``vector`` as pgvector's type.

    Pass as ``init=`` to any pool handed to ``PostgresStore``; the ``vector``
    type must exist (run ``migrate`` first).
    """
    await conn.set_type_codec(
        "jsonb", encoder=_dump_json, decoder=json.loads, schema="pg_catalog", format="text"
    )
    await register_vector(conn)


async def keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does.

    asyncpg's default reset runs ``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`` after every pooled call, one more round trip each
    (half of all round trips for one-statement calls). The store leaves no
    session state to reset: its advisory locks are transaction-scoped, it
    declares no cursors outside transactions, never LISTENs and never SETs.
    asyncpg still rolls back a transaction left open before calling this.
    Pass as ``reset=`` to any pool handed to ``PostgresStore``.
    """
    del conn


class PostgresStore:
    """Every storage port over one asyncpg pool.

    With an ``embedder``, batches are embedded on archive and ``memory_read``
    fuses vector and full-text ranks; without one, search is full-text only.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder | None = None,
        *,
        candidates_per_half: int = 50,
        raw_retention_days: int = 0,
        single_conversation_transactions: bool = False,
    ) -> None:
        if candidates_per_half < 1:
            raise ValueError("candidates_per_half must be >= 1")
        if raw_retention_days < 0:
            raise ValueError("raw_retention_days must be >= 0 (0 keeps raw turns forever)")
        self._pool = pool
        self._embedder = embedder
        self._candidates_per_half = candidates_per_half
        self._raw_retention_days = raw_retention_days
        self._single_conversation_transactions = single_conversation_transactions

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        embedder: Embedder | None = None,
        min_size: int = 1,
        max_size: int = 10,
        run_migrations: bool = True,
        raw_retention_days: int = 0,
        single_conversation_transactions: bool = False,
    ) -> PostgresStore:
        """A store with its own pool, migrating the database first by default.

        Migrations run on a separate connection before the pool exists, since
        the pool's connections register the ``vector`` codec, which needs the
        extension the first migration creates.
        """
        if run_migrations:
            await migrate(dsn)
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=configure_connection,
            reset=keep_session,
        )
        return cls(
            pool,
            embedder,
            raw_retention_days=raw_retention_days,
            single_conversation_transactions=single_conversation_transactions,
        )

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    async def close(self) -> None:
        await self._pool.close()

    # -- MessageStore --------------------------------------------------------

    async def save_message(
        self, message: ConversationMessage, token_estimate: int, *, tenant_id: str | None = None
    ) -> bool:
        """Insert once: ``False`` when the id is stored, or was and has been compacted.

        A message that a compaction already summarised and deleted must not
        come back when it is delivered again (Kafka redelivers after a crash,
        a producer retries, a transcript is replayed): it would sit in the
        history next to the summary that covers it and be compacted twice.
        Archived batches keep their source message ids, so they are the
        record of what was compacted. The check runs under the conversation's
        advisory lock, the one ``apply_compaction`` holds while it deletes,
        so a redelivery racing a compaction sees either the row or its batch.

        The first message of a conversation fixes its tenant; one claiming
        another raises ``TenantConflictError`` and nothing is written.
        """
        if token_estimate < 0:
            raise ValueError("token_estimate must be >= 0")
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                CONVERSATION_LOCK_CLASS,
                message.conversation_id,
            )
            owner = await conn.fetchrow(_CLAIM_TENANT_SQL, message.conversation_id, tenant_id)
            if owner is None or owner["tenant_id"] != tenant_id:
                raise TenantConflictError(
                    f"conversation {message.conversation_id[:80]!r} belongs to another tenant "
                    f"than the one message {message.id[:80]!r} claims ({tenant_id!r})"
                )
            inserted = await conn.fetchval(
                """
                INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                                      tool_call_id, created_at, token_estimate)
                SELECT $1::text, $2::text, $3::text, $4::text, $5::jsonb, $6::text,
                       $7::timestamptz, $8::integer
                 WHERE NOT EXISTS (
                       SELECT 1 FROM archival_memory
                        WHERE conversation_id = $2 AND source_message_ids @> ARRAY[$1::text])
                ON CONFLICT (conversation_id, id) DO NOTHING
                RETURNING id
                """,
                message.id,
                message.conversation_id,
                message.role,
                message.content,
                pg_ingest.tool_calls_json(message.tool_calls),
                message.tool_call_id,
                message.created_at,
                token_estimate,
            )
        return inserted is not None

    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """Same rules as ``save_message``, a group at a time (``core.adapters.postgres.ingest``)."""
        return await pg_ingest.save_group(
            self._pool,
            batch,
            lock_class=CONVERSATION_LOCK_CLASS,
            per_conversation=self._single_conversation_transactions,
        )

    async def load_history(
        self,
        conversation_id: str,
        *,
        as_of: datetime | None = None,
        up_to_seq: int | None = None,
    ) -> list[ConversationMessage]:
        if as_of is not None and as_of.utcoffset() is None:
            # asyncpg would read a naive cutoff as UTC; a local-time caller would silently lose
            # or gain messages.
            raise ValueError("as_of must be timezone-aware")
        rows = await self._pool.fetch(
            """
            SELECT id, conversation_id, role, content, tool_calls, tool_call_id, created_at
              FROM messages
             WHERE conversation_id = $1
               AND (kind = 'clip_archive' OR (
                    ($2::timestamptz IS NULL OR created_at <= $2)
                    AND ($3::bigint IS NULL OR seq <= $3)))
             ORDER BY (kind = 'clip_archive') DESC, created_at, id
            """,
            conversation_id,
            as_of,
            up_to_seq,
        )
        return [_row_to_message(row) for row in rows]

    async def last_seq(self, conversation_id: str) -> int | None:
        """The arrival number of the conversation's newest message, if any."""
        value = await self._pool.fetchval(
            "SELECT max(seq) FROM messages WHERE conversation_id = $1", conversation_id
        )
        return None if value is None else int(value)

    async def compaction_applied(self, compaction_id: str) -> bool:
        found = await self._pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM compactions WHERE compaction_id = $1)", compaction_id
        )
        return bool(found)

    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> tuple[bool, int, list[ConversationMessage]]:
        """``compaction_applied``, ``conversation_token_total`` and ``load_history``
        (up to ``up_to_seq``) in one round trip, from one snapshot.

        What the processor asks before every compaction; as three queries they
        were three round trips, each paid in CPU by the worker and PostgreSQL.
        """
        rows = await self._pool.fetch(
            """
            SELECT f.applied, f.total, m.id, m.conversation_id, m.role, m.content,
                   m.tool_calls, m.tool_call_id, m.created_at
              FROM (SELECT EXISTS (SELECT 1 FROM compactions
                                    WHERE conversation_id = $2 AND compaction_id = $1)
                               AS applied,
                           (SELECT coalesce(sum(token_estimate), 0) FROM messages
                             WHERE conversation_id = $2) AS total) AS f
              LEFT JOIN LATERAL (
                    SELECT * FROM messages
                     WHERE conversation_id = $2
                       AND (kind = 'clip_archive' OR $3::bigint IS NULL OR seq <= $3)
                   ) AS m ON true
             ORDER BY (m.kind = 'clip_archive') DESC, m.created_at, m.id
            """,
            compaction_id,
            conversation_id,
            up_to_seq,
        )
        first = rows[0]
        history = [_row_to_message(row) for row in rows if row["id"] is not None]
        return bool(first["applied"]), int(first["total"]), history

    async def apply_compaction(
        self, plan: CompactionPlan, outbox: OutboxFactory | None = None
    ) -> ApplyResult:
        _check_plan(plan)
        # The insert into ``compactions`` below decides whether this is a replay.
        # Callers ask ``compaction_applied`` before planning (it saves the LLM
        # calls), so asking again here only pays off when it also saves an
        # embedding round trip.
        embeds = self._embedder is not None and bool(plan.new_batches)
        if embeds and await self.compaction_applied(plan.compaction_id):
            return ApplyResult(outcome="already_applied")
        vectors, model = await self._embed_batches(plan.new_batches)
        turn_vectors = await self._embed_turns(plan) if self._embedder is not None else {}

        # Every round trip here is paid by every compaction: steps that can share
        # a statement do (the lock and the record; the clip-archive and the
        # outbox), and a step with nothing to do sends nothing.
        async with self._pool.acquire() as conn, conn.transaction():
            if not await _lock_and_record(conn, plan):
                return ApplyResult(outcome="already_applied")
            await _supersede(conn, plan)
            await _insert_batches(conn, plan.new_batches, vectors, model)
            await _place_resummarised(conn, plan)
            removed = await _archive_compacted(conn, plan)
            await _store_turn_vectors(conn, plan.conversation_id, turn_vectors, model)
            stats = AppliedStats(
                tokens_removed=removed, tokens_added=estimate_message_tokens(plan.clip_archive)
            )
            records = list(outbox(plan, stats)) if outbox is not None else []
            await _insert_clip_archive(conn, plan, records)
        return ApplyResult(outcome="applied", stats=stats)

    # -- Outbox ----------------------------------------------------------------

    async def pending_outbox(
        self, *, compaction_id: str | None = None, limit: int = 100
    ) -> list[OutboxRow]:
        """Unpublished outbox rows, oldest first (optionally of one compaction)."""
        rows = await self._pool.fetch(
            """
            SELECT id, compaction_id, topic, key, payload FROM outbox
             WHERE published_at IS NULL AND ($1::text IS NULL OR compaction_id = $1)
             ORDER BY id LIMIT $2
            """,
            compaction_id,
            limit,
        )
        return [OutboxRow(**dict(row)) for row in rows]

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        """Every outbox row of one compaction, published or not, in order.

        For publishing a compaction's events again: when its command comes
        back after the compaction was applied, the completion published the
        first time may never have reached its consumer.
        """
        rows = await self._pool.fetch(
            """
            SELECT id, compaction_id, topic, key, payload FROM outbox
             WHERE compaction_id = $1
             ORDER BY id
            """,
            compaction_id,
        )
        return [OutboxRow(**dict(row)) for row in rows]

    async def mark_published(self, ids: Sequence[int]) -> None:
        """Mark rows published; a row published before keeps its first time."""
        if ids:
            await self._pool.execute(
                "UPDATE outbox SET published_at = now() "
                "WHERE id = ANY($1::bigint[]) AND published_at IS NULL",
                list(ids),
            )

    async def mark_compaction_published(self, compaction_id: str) -> None:
        """Mark every row of one compaction published (a row published before
        keeps its first time): for a relay that sent the records the compaction
        built, so it never read their ids back. One compaction's rows are one
        conversation's."""
        await self._pool.execute(
            "UPDATE outbox SET published_at = now() "
            "WHERE compaction_id = $1 AND published_at IS NULL",
            compaction_id,
        )

    # -- MemoryStore ---------------------------------------------------------

    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        rows = await self._pool.fetch(
            f"""
            SELECT {_BATCH_COLUMNS}
              FROM archival_memory
             WHERE conversation_id = $1 AND superseded_by IS NULL
             ORDER BY coalesce(archive_order, seq), seq
            """,
            conversation_id,
        )
        return [_row_to_batch(row) for row in rows]

    async def memory_read(
        self,
        query: str,
        conversation_id: str | None = None,
        limit: int = 5,
        *,
        sources: SearchSources = "both",
        mode: QueryMode = "plain",
        tenant_id: str | None = None,
    ) -> MemorySearchResult:
        """Batches ranked by summary and raw turns (see ``core.adapters.postgres.memory``)."""
        text = query.strip()
        if not text:
            raise ValueError("memory_read needs a non-empty query")
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"memory_read limit must be between 1 and {MAX_LIMIT}, got {limit}")
        per_half = max(self._candidates_per_half, limit)
        websearch = mode == "websearch"
        query_vector = await self._embed_query(text)
        summaries: dict[str, pg_memory.Ranked] = {}
        turns: dict[str, pg_memory.Ranked] = {}
        if sources != "raw":
            text_rows = await self._pool.fetch(
                pg_memory.SUMMARY_TEXT_SQL, text, conversation_id, per_half, websearch, tenant_id
            )
            vector_rows = await self._vector_rows(
                pg_memory.SUMMARY_VECTOR_SQL, query_vector, conversation_id, per_half, tenant_id
            )
            summaries = pg_memory.fuse(text_rows, vector_rows, "id")
        if sources != "summaries":
            text_rows = await self._pool.fetch(
                pg_memory.RAW_TEXT_SQL, text, conversation_id, per_half, websearch, tenant_id
            )
            vector_rows = await self._vector_rows(
                pg_memory.RAW_VECTOR_SQL, query_vector, conversation_id, per_half, tenant_id
            )
            turns = pg_memory.fuse(text_rows, vector_rows, "id")
        missing = pg_memory.missing_batch_ids(summaries, turns)
        batch_rows = await self._pool.fetch(pg_memory.BATCHES_BY_ID_SQL, missing) if missing else []
        hits = pg_memory.hits(summaries, turns, batch_rows, text, limit)
        return MemorySearchResult(
            hits=tuple(hits),
            mode="hybrid" if query_vector is not None else "full_text",
            sources=sources,
            query_mode=mode,
        )

    async def _vector_rows(
        self,
        sql: str,
        vector: list[float] | None,
        conversation_id: str | None,
        limit: int,
        tenant_id: str | None,
    ) -> list[Any]:
        if vector is None or self._embedder is None:
            return []
        rows = await self._pool.fetch(
            sql, vector, self._embedder.model, len(vector), conversation_id, limit, tenant_id
        )
        return pg_memory.usable(rows)

    async def expand_batch(self, conversation_id: str, batch_id: str) -> ExpandedBatch | None:
        """The batch with every archived raw turn it covers, in conversation order."""
        row = await self._pool.fetchrow(
            f"SELECT {_BATCH_COLUMNS} FROM archival_memory WHERE conversation_id = $1 AND id = $2",
            conversation_id,
            batch_id,
        )
        if row is None:
            return None
        batch = _row_to_batch(row)
        turns = await self._pool.fetch(
            """
            SELECT id, conversation_id, role, content, tool_calls, tool_call_id, created_at
              FROM archived_messages
             WHERE conversation_id = $1 AND id = ANY($2::text[])
             ORDER BY created_at, id
            """,
            conversation_id,
            list(batch.batch.source_message_ids),
        )
        return ExpandedBatch(
            batch=batch,
            turns=tuple(_row_to_message(t) for t in turns),
            turns_missing=len(set(batch.batch.source_message_ids)) - len(turns),
        )

    async def expire_raw_turns(self) -> int:
        """Remove raw turns archived more than ``raw_retention_days`` ago.

        One index range scan names the conversations with expired turns (at
        most 100 per call), then one transaction per conversation removes at
        most ``EXPIRE_BATCH`` of its rows: each call is bounded, and a timer
        calling it every few minutes catches up with any backlog.
        """
        if self._raw_retention_days == 0:
            return 0
        cutoff = datetime.now().astimezone() - timedelta(days=self._raw_retention_days)
        removed = 0
        try:
            conversations = await self._pool.fetch(
                "SELECT DISTINCT conversation_id FROM archived_messages "
                "WHERE archived_at < $1 LIMIT 100",
                cutoff,
            )
            for row in conversations:
                removed += await self._expire_conversation(row["conversation_id"], cutoff)
        except (asyncpg.PostgresError, OSError) as error:
            log.warning("removing expired raw turns failed, next pass retries: %s", error)
        if removed:
            log.info("removed %d raw turns archived before %s", removed, cutoff.isoformat())
        return removed

    async def _expire_conversation(self, conversation_id: str, cutoff: datetime) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """
                DELETE FROM archived_messages
                 WHERE conversation_id = $1 AND id IN (
                       SELECT id FROM archived_messages
                        WHERE conversation_id = $1 AND archived_at < $2 LIMIT $3)
                RETURNING id
                """,
                conversation_id,
                cutoff,
                EXPIRE_BATCH,
            )
        return len(rows)

    # -- PrivacyStore ----------------------------------------------------------

    async def conversation_tenant(self, conversation_id: str) -> str | None:
        value = await self._pool.fetchval(
            "SELECT tenant_id FROM conversations WHERE conversation_id = $1", conversation_id
        )
        return None if value is None else str(value)

    async def erase_conversation(self, conversation_id: str) -> dict[str, int]:
        """Delete the conversation from every table in ``ERASED_TABLES``, in one
        transaction under its advisory lock (a compaction racing it either
        committed before, and is erased too, or finds its messages gone and
        writes nothing)."""
        removed: dict[str, int] = {}
        async with self._pool.acquire() as conn, conn.transaction():
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

    # -- for the service -----------------------------------------------------

    async def conversation_token_total(self, conversation_id: str) -> int:
        """Estimated tokens of the conversation as the model would now see it."""
        total = await self._pool.fetchval(
            "SELECT coalesce(sum(token_estimate), 0) FROM messages WHERE conversation_id = $1",
            conversation_id,
        )
        return int(total)

    async def conversation_totals(self, conversation_id: str) -> tuple[int, int]:
        """(estimated tokens, rows) of the conversation, in one round trip."""
        row = await self._pool.fetchrow(
            "SELECT coalesce(sum(token_estimate), 0) AS tokens, count(*) AS rows "
            "FROM messages WHERE conversation_id = $1",
            conversation_id,
        )
        assert row is not None
        return int(row["tokens"]), int(row["rows"])

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        return await pg_ingest.totals_of(self._pool, conversation_ids)

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        """Conversations whose estimate exceeds ``threshold``, largest first.

        Strictly greater, as ``core.domain.budget.over_budget`` decides.
        """
        rows = await self._pool.fetch(
            """
            SELECT conversation_id, sum(token_estimate) AS total
              FROM messages
             GROUP BY conversation_id
            HAVING sum(token_estimate) > $1
             ORDER BY total DESC, conversation_id
            """,
            threshold,
        )
        return [(str(row["conversation_id"]), int(row["total"])) for row in rows]

    # -- embeddings ----------------------------------------------------------

    async def _embed_batches(
        self, batches: Sequence[StoredBatch]
    ) -> tuple[list[list[float]] | None, str | None]:
        if self._embedder is None or not batches:
            return None, None
        texts = [b.batch.content for b in batches]
        try:
            vectors = await self._embedder.embed(texts)
            _check_vectors(vectors, len(texts))
        except Exception as error:
            # Archiving matters more than the vector index: these rows stay
            # findable by full text.
            log.warning(
                "embedding %d batches with %s failed, storing them without embeddings: %s",
                len(texts),
                self._embedder.model,
                error,
            )
            return None, None
        return vectors, self._embedder.model

    async def _embed_turns(self, plan: CompactionPlan) -> dict[str, list[float]]:
        """Vectors of the raw turns the plan archives (read before its transaction).

        A failure only costs those turns the vector half of search.
        """
        assert self._embedder is not None
        rows = await self._pool.fetch(
            "SELECT id, content FROM messages "
            "WHERE conversation_id = $1 AND id = ANY($2::text[]) AND kind = 'message' "
            "ORDER BY id",
            plan.conversation_id,
            list(plan.deleted_message_ids),
        )
        if not rows:
            return {}
        try:
            vectors = await self._embedder.embed([row["content"] for row in rows])
            _check_vectors(vectors, len(rows))
        except Exception as error:
            log.warning(
                "embedding %d archived turns failed, storing them without: %s", len(rows), error
            )
            return {}
        return {row["id"]: vector for row, vector in zip(rows, vectors, strict=True)}

    async def _embed_query(self, text: str) -> list[float] | None:
        if self._embedder is None:
            return None
        try:
            vectors = await self._embedder.embed([text])
            _check_vectors(vectors, 1)
        except Exception as error:
            log.warning("embedding a memory_read query failed, searching full text only: %s", error)
            return None
        return vectors[0]


# -- apply_compaction steps (inside the transaction) --------------------------


async def _lock_and_record(conn: AnyConnection, plan: CompactionPlan) -> bool:
    """Take the conversation's advisory lock, then record the compaction id; ``False``
    when it was recorded before (a replay: nothing more to write).

    One statement: the row to insert comes out of the lock call, so the lock is
    held before the insert. Later statements see whatever committed before it
    (each statement takes a fresh snapshot at read committed); the insert's own
    conflict check reads the index, not the snapshot.
    """
    recorded = await conn.fetchval(
        """
        INSERT INTO compactions (compaction_id, conversation_id, messages_compressed,
                                 batches_created, tokens_before, tokens_after)
        SELECT $1, $2, $3, $4, $5, $6
          FROM (SELECT pg_advisory_xact_lock($7, hashtext($2))) AS locked
        ON CONFLICT (conversation_id, compaction_id) DO NOTHING
        RETURNING compaction_id
        """,
        plan.compaction_id,
        plan.conversation_id,
        plan.messages_compressed,
        len(plan.new_batches),
        plan.tokens_estimate_before,
        plan.tokens_estimate_after,
        CONVERSATION_LOCK_CLASS,
    )
    return recorded is not None


async def _supersede(conn: AnyConnection, plan: CompactionPlan) -> None:
    if not plan.superseded:
        return
    existing = [old for old, _ in plan.superseded]
    replacing = [new for _, new in plan.superseded]
    rows = await conn.fetch(
        """
        UPDATE archival_memory AS m
           SET superseded_by = s.replacing
          FROM unnest($1::text[], $2::text[]) AS s(existing, replacing)
         WHERE m.id = s.existing
           AND m.conversation_id = $3
           AND m.superseded_by IS NULL
        RETURNING m.id
        """,
        existing,
        replacing,
        plan.conversation_id,
    )
    if len(rows) != len(existing):
        missing = sorted(set(existing) - {row["id"] for row in rows})
        raise HistoryConflictError(
            f"compaction {plan.compaction_id}: batches to supersede are gone or already "
            f"superseded: {_preview(missing)}"
        )


async def _insert_batches(
    conn: AnyConnection,
    batches: Sequence[StoredBatch],
    vectors: list[list[float]] | None,
    model: str | None,
) -> None:
    if not batches:
        return
    await conn.executemany(
        """
        INSERT INTO archival_memory (id, label, conversation_id, content, depth, start_time,
                                     end_time, message_count, source_message_ids,
                                     compaction_id, superseded_by, embedding, embedding_model,
                                     covered_days)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
        ON CONFLICT (conversation_id, id) DO NOTHING
        """,
        [
            (
                stored.id,
                stored.label,
                stored.conversation_id,
                stored.batch.content,
                stored.batch.depth,
                stored.batch.start_time,
                stored.batch.end_time,
                stored.batch.message_count,
                list(stored.batch.source_message_ids),
                stored.compaction_id,
                stored.superseded_by,
                vectors[index] if vectors is not None else None,
                model if vectors is not None else None,
                list(stored.batch.days) or None,
            )
            for index, stored in enumerate(batches)
        ],
    )


async def _place_resummarised(conn: AnyConnection, plan: CompactionPlan) -> None:
    """A re-summarised batch takes the clip-archive slot of the earliest batch it folds in.

    Creation order alone would put it after the newer batches it was written
    alongside, while it covers the oldest history. Only a plan that re-summarised
    (some batch gets a ``superseded_by``) has one; the others skip the round trip.
    """
    if not plan.superseded and all(b.superseded_by is None for b in plan.new_batches):
        return
    await conn.execute(
        """
        UPDATE archival_memory AS m
           SET archive_order = s.first_slot
          FROM (SELECT superseded_by AS id, min(coalesce(archive_order, seq)) AS first_slot
                  FROM archival_memory
                 WHERE conversation_id = $1 AND superseded_by = ANY($2::text[])
                 GROUP BY superseded_by) AS s
         WHERE m.id = s.id AND m.conversation_id = $1
        """,
        plan.conversation_id,
        [stored.id for stored in plan.new_batches],
    )


def _turn_batches(plan: CompactionPlan) -> dict[str, str]:
    """Message id → the shallowest new batch that summarised it (depth 0 normally)."""
    owner: dict[str, str] = {}
    for stored in sorted(plan.new_batches, key=lambda b: b.batch.depth):
        for message_id in stored.batch.source_message_ids:
            owner.setdefault(message_id, stored.id)
    return owner


async def _archive_compacted(conn: AnyConnection, plan: CompactionPlan) -> int:
    """Move the compacted messages to ``archived_messages`` (raw turns, linked to
    their batch; a replaced clip-archive is dropped); the sum of their stored
    token counts."""
    wanted = set(plan.deleted_message_ids)
    if not wanted:
        return 0
    owner = _turn_batches(plan)
    rows = await conn.fetch(
        """
        WITH gone AS (
            DELETE FROM messages WHERE id = ANY($1::text[]) AND conversation_id = $2
            RETURNING *
        ), kept AS (
            INSERT INTO archived_messages (conversation_id, id, batch_id, compaction_id, role,
                                           content, tool_calls, tool_call_id, created_at,
                                           token_estimate, seq)
            SELECT g.conversation_id, g.id, b.batch_id, $3, g.role, g.content, g.tool_calls,
                   g.tool_call_id, g.created_at, g.token_estimate, g.seq
              FROM gone AS g
              LEFT JOIN unnest($4::text[], $5::text[]) AS b(message_id, batch_id)
                ON b.message_id = g.id
             WHERE g.kind = 'message'
            ON CONFLICT (conversation_id, id) DO NOTHING
        )
        SELECT id, token_estimate FROM gone
        """,
        list(wanted),
        plan.conversation_id,
        plan.compaction_id,
        list(owner),
        list(owner.values()),
    )
    if len(rows) != len(wanted):
        missing = sorted(wanted - {row["id"] for row in rows})
        raise HistoryConflictError(
            f"compaction {plan.compaction_id}: {len(missing)} message(s) it compacts are no "
            f"longer in conversation {plan.conversation_id}: {_preview(missing)}"
        )
    return sum(int(row["token_estimate"]) for row in rows)


async def _store_turn_vectors(
    conn: AnyConnection,
    conversation_id: str,
    vectors: dict[str, list[float]],
    model: str | None,
) -> None:
    if not vectors or model is None:
        return
    await conn.executemany(
        "UPDATE archived_messages SET embedding = $3, embedding_model = $4 "
        "WHERE conversation_id = $1 AND id = $2",
        [(conversation_id, message_id, v, model) for message_id, v in vectors.items()],
    )


async def _insert_clip_archive(
    conn: AnyConnection, plan: CompactionPlan, outbox: Sequence[OutboxRecord]
) -> None:
    """Insert the clip-archive and, in the same statement, the outbox rows (in order)."""
    clip = plan.clip_archive
    try:
        await conn.execute(
            """
            WITH clip AS (
                INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                                      tool_call_id, created_at, token_estimate, kind,
                                      compaction_id)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'clip_archive', $9)
            )
            INSERT INTO outbox (compaction_id, topic, key, payload, conversation_id)
            SELECT $9, o.topic, o.key, o.payload, $2
              FROM unnest($10::text[], $11::text[], $12::text[])
                   WITH ORDINALITY AS o(topic, key, payload, n)
             ORDER BY o.n
            """,
            clip.id,
            clip.conversation_id,
            clip.role,
            clip.content,
            pg_ingest.tool_calls_json(clip.tool_calls),
            clip.tool_call_id,
            clip.created_at,
            estimate_message_tokens(clip),
            plan.compaction_id,
            [r.topic for r in outbox],
            [r.key for r in outbox],
            [r.payload for r in outbox],
        )
    except asyncpg.UniqueViolationError as error:
        # Either another clip-archive exists that the plan did not know to
        # replace, or the id is taken: the plan was computed from stale history.
        raise HistoryConflictError(
            f"compaction {plan.compaction_id}: cannot insert clip-archive {clip.id}: "
            f"{error.detail or error}"
        ) from error


# -- helpers -------------------------------------------------------------------


def _check_plan(plan: CompactionPlan) -> None:
    """Reject plans that would write across conversations or collide with themselves."""
    conversation = plan.conversation_id
    foreign = [b.id for b in plan.new_batches if b.conversation_id != conversation]
    if foreign or plan.clip_archive.conversation_id != conversation:
        raise ValueError(
            f"compaction {plan.compaction_id} writes outside conversation {conversation}: "
            f"batches {foreign}, clip-archive in {plan.clip_archive.conversation_id}"
        )
    ids = [b.id for b in plan.new_batches]
    if len(set(ids)) != len(ids):
        raise ValueError(f"compaction {plan.compaction_id} has duplicate batch ids")
    existing = [old for old, _ in plan.superseded]
    if len(set(existing)) != len(existing):
        raise ValueError(f"compaction {plan.compaction_id} supersedes a batch twice")


def _check_vectors(vectors: list[list[float]], expected: int) -> None:
    if len(vectors) != expected:
        raise ValueError(f"embedder returned {len(vectors)} vectors for {expected} texts")
    dims = {len(v) for v in vectors}
    if len(dims) != 1:
        raise ValueError(f"embedder returned vectors of differing sizes {sorted(dims)}")
    (size,) = dims
    if not 1 <= size <= _MAX_VECTOR_DIMS:
        raise ValueError(f"embedding size {size} outside 1..{_MAX_VECTOR_DIMS}")
    if not all(math.isfinite(x) for v in vectors for x in v):
        raise ValueError("embedder returned a non-finite component")


def _row_to_message(row: Any) -> ConversationMessage:
    raw_calls = row["tool_calls"]
    return ConversationMessage(
        id=row["id"],
        conversation_id=row["conversation_id"],
        role=row["role"],
        content=row["content"],
        tool_calls=None
        if raw_calls is None
        else tuple(ToolCall.model_validate(call) for call in raw_calls),
        tool_call_id=row["tool_call_id"],
        created_at=row["created_at"],
    )


def _row_to_batch(row: Any) -> StoredBatch:
    return StoredBatch(
        id=row["id"],
        label=row["label"],
        conversation_id=row["conversation_id"],
        batch=SummaryBatch(
            content=row["content"],
            depth=row["depth"],
            start_time=row["start_time"],
            end_time=row["end_time"],
            message_count=row["message_count"],
            source_message_ids=tuple(row["source_message_ids"]),
            days=tuple(row["covered_days"] or ()),
        ),
        compaction_id=row["compaction_id"],
        superseded_by=row["superseded_by"],
    )


def _preview(ids: Sequence[str], shown: int = 5) -> str:
    head = ", ".join(ids[:shown])
    return head if len(ids) <= shown else f"{head}, … ({len(ids) - shown} more)"


if TYPE_CHECKING:

    def _implements_ports(store: PostgresStore) -> WorkerStore:
        """Never called: makes mypy prove the store satisfies every port."""
        return store
