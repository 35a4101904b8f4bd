"""``PostgresCompactions``: everything one compaction writes, in one transaction.

Keyed by ``compaction_id`` so a redelivered command is a no-op, and
serialised per conversation by an advisory lock so two compactions of one
conversation cannot interleave. It writes what it is given: the plan (with
the vectors the core made, ``CompactionPlan.embeddings``) and the outbox
records the processor built before the write, and it checks that the rows it
removes and adds carry the stored token counts those records announce.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import asyncpg

from core.adapters.postgres.clip_archive_rows import insert_clip_archive
from core.adapters.postgres.compaction_gate import (
    Refused,
    check_tokens,
    pinned_tokens,
    read_rejections,
    record_rejection,
    run_gate,
    set_pinned,
)
from core.adapters.postgres.connection import CONVERSATION_LOCK_CLASS
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.replacements import replace_in_place, strategies_json
from core.adapters.postgres.rows import batch_rows
from core.domain.compaction import CompactionPlan
from core.domain.tenancy import tenant_of
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    ApplyOutcome,
    CompactionOutbox,
    Compactions,
    HistoryConflictError,
    RejectionRecord,
)

if TYPE_CHECKING:
    from core.adapters.postgres.migrate import AnyConnection


@port_errors_on_methods
class PostgresCompactions:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def apply_compaction(
        self, plan: CompactionPlan, outbox: CompactionOutbox | None = None
    ) -> ApplyOutcome:
        """The insert into ``compactions`` decides whether this is a replay (callers ask
        ``compaction_inputs`` first: it saves the LLM calls). The gate runs on the rows
        removed and kept; a refusal rolls it all back and is recorded after it."""
        plan.check_consistent()
        # Every round trip here is paid by every compaction: steps that can share
        # a statement do (the lock and the record; the clip-archive and the
        # outbox), and a step with nothing to do sends nothing.
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                if not await _lock_and_record(conn, plan):
                    return AlreadyApplied()
                await _supersede(conn, plan)
                await _insert_batches(conn, plan)
                await _place_resummarised(conn, plan)
                gone = await _archive_compacted(conn, plan)
                replaced_removed, replaced_added = await replace_in_place(conn, plan)
                await run_gate(conn, plan, gone)
                removed = sum(int(row["token_estimate"]) for row in gone) + replaced_removed
                restored = await _restore_turns(conn, plan) + replaced_added
                await _relink_archived_turns(conn, plan)
                await _store_turn_vectors(conn, plan)
                if outbox is not None:
                    check_tokens(plan, outbox.tokens, removed, restored)
                records = outbox.records if outbox is not None else ()
                await insert_clip_archive(conn, plan, records)
        except Refused as refused:
            await record_rejection(self._pool, plan, refused.verdict)
            return refused.verdict
        return Applied()

    async def rejections(self, conversation_id: str, limit: int = 50) -> list[RejectionRecord]:
        return await read_rejections(self._pool, conversation_id, limit)

    async def set_pinned(self, conversation_id: str, message_id: str, pinned: bool) -> bool:
        return await set_pinned(self._pool, conversation_id, message_id, pinned)

    async def pinned_tokens(self, conversation_id: str) -> int:
        return await pinned_tokens(self._pool, conversation_id)

    async def compaction_applied(self, compaction_id: str) -> bool:
        found = await self._pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM compactions WHERE compaction_id = $1)", compaction_id
        )
        return bool(found)


# -- apply steps (inside the transaction) ----------------------------------------


async def _lock_and_record(conn: AnyConnection, plan: CompactionPlan) -> bool:
    """Take the conversation's advisory lock, then record the compaction id; ``False``
    when it was recorded before (a replay: nothing more to write).

    One statement: the row to insert comes out of the lock call, so the lock is
    held before the insert. Later statements see whatever committed before it
    (each statement takes a fresh snapshot at read committed); the insert's own
    conflict check reads the index, not the snapshot. The row carries what the
    compaction's LLM calls cost (migration 0012), for usage and tenant budgets.
    """
    usage = plan.usage
    recorded = await conn.fetchval(
        """
        INSERT INTO compactions (compaction_id, conversation_id, messages_compressed,
                                 batches_created, tokens_before, tokens_after, tenant_id,
                                 summarizer, model, llm_calls, input_tokens, output_tokens,
                                 cache_read_tokens, cache_write_tokens, cost_usd,
                                 budget_fallback, strategies)
        SELECT $1, $2, $3, $4, $5, $6, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18::jsonb
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
        tenant_of(plan.conversation_id),
        usage.summarizer,
        usage.model,
        usage.calls,
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.cost_usd,
        usage.fallback,
        strategies_json(plan),
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


async def _insert_batches(conn: AnyConnection, plan: CompactionPlan) -> None:
    if not plan.new_batches:
        return
    await conn.executemany(
        """
        INSERT INTO archival_memory (id, label, conversation_id, content, depth, start_time,
                                     end_time, message_count, source_message_ids,
                                     compaction_id, superseded_by, embedding, embedding_model,
                                     covered_days, specifics, ledger)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
        ON CONFLICT (conversation_id, id) DO NOTHING
        """,
        batch_rows(plan),
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


async def _archive_compacted(conn: AnyConnection, plan: CompactionPlan) -> list[Any]:
    """Move the compacted messages to ``archived_messages`` (raw turns, linked to
    their batch; a replaced clip-archive is dropped), in one statement (its
    triggers count them into the BM25 figures, migration 0011); the rows
    removed (for the gate, and their stored token counts)."""
    wanted = set(plan.deleted_message_ids)
    if not wanted:
        return []
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
            ON CONFLICT (conversation_id, id) DO UPDATE SET batch_id = EXCLUDED.batch_id
                WHERE archived_messages.batch_id IS NULL
        )
        SELECT id, conversation_id, role, content, tool_calls, tool_call_id, created_at,
               kind, token_estimate, pinned
          FROM gone
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
    return list(rows)


async def _restore_turns(conn: AnyConnection, plan: CompactionPlan) -> int:
    """A restore: move its raw turns from ``archived_messages`` back into ``messages``
    with their arrival numbers; the sum of their token counts. A turn no longer
    archived (expired, restored meanwhile) aborts: ``HistoryConflictError``."""
    wanted = plan.restored_message_ids
    if not wanted:
        return 0
    rows = await conn.fetch(
        """
        WITH back AS (
            DELETE FROM archived_messages
             WHERE conversation_id = $1 AND id = ANY($2::text[])
            RETURNING *
        )
        INSERT INTO messages (id, conversation_id, role, content, tool_calls, tool_call_id,
                              created_at, token_estimate, seq)
        OVERRIDING SYSTEM VALUE
        SELECT id, conversation_id, role, content, tool_calls, tool_call_id, created_at,
               token_estimate, seq
          FROM back
        ON CONFLICT (conversation_id, id) DO NOTHING
        RETURNING id, token_estimate
        """,
        plan.conversation_id,
        list(wanted),
    )
    if len(rows) != len(set(wanted)):
        missing = sorted(set(wanted) - {row["id"] for row in rows})
        raise HistoryConflictError(
            f"compaction {plan.compaction_id}: {len(missing)} turn(s) to restore are no longer "
            f"archived in conversation {plan.conversation_id}: {_preview(missing)}"
        )
    return sum(int(row["token_estimate"]) for row in rows)


async def _relink_archived_turns(conn: AnyConnection, plan: CompactionPlan) -> None:
    """Raw turns archived by an earlier compaction that a new batch now summarises
    (a recompact; the turns of a restore that did not fit) point to that batch.
    An ordinary compaction's new batches summarise only turns it moves now, so it
    sends nothing."""
    moving = set(plan.deleted_message_ids)
    owner = {m: b for m, b in _turn_batches(plan).items() if m not in moving}
    if not owner:
        return
    await conn.execute(
        """
        UPDATE archived_messages AS a
           SET batch_id = o.batch_id
          FROM unnest($2::text[], $3::text[]) AS o(message_id, batch_id)
         WHERE a.conversation_id = $1 AND a.id = o.message_id
        """,
        plan.conversation_id,
        list(owner),
        list(owner.values()),
    )


async def _store_turn_vectors(conn: AnyConnection, plan: CompactionPlan) -> None:
    embeddings = plan.embeddings
    if embeddings is None or not embeddings.turns:
        return
    await conn.executemany(
        "UPDATE archived_messages SET embedding = $3, embedding_model = $4 "
        "WHERE conversation_id = $1 AND id = $2",
        [
            (plan.conversation_id, message_id, vector, embeddings.model)
            for message_id, vector in embeddings.turns.items()
        ],
    )


# -- helpers -------------------------------------------------------------------


def _preview(ids: Sequence[str], shown: int = 5) -> str:
    head = ", ".join(ids[:shown])
    return head if len(ids) <= shown else f"{head}, … ({len(ids) - shown} more)"


if TYPE_CHECKING:

    def _implements(compactions: PostgresCompactions) -> Compactions:
        """Never called: makes mypy prove the class implements its port."""
        return compactions
