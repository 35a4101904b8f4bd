"""A conversation's live history: the pages a reader reads, the inputs a compaction plans from.

``PostgresHistory`` implements ``core.ports.storage.History``. A read with a
``ReadScope`` (the HTTP views) runs in a READ ONLY transaction as
``compactor_reader`` with ``compactor.tenant`` set (``connection.read_as``),
so row-level security (migration 0009) shows it only the scope's rows; one
without (the worker, the CLI) runs on the pool as the tables' owner.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres.connection import read_as
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.rows import row_to_message
from core.domain.messages import ConversationMessage
from core.ports.storage import CompactionInputs, History, MessageKey, ReadScope

if TYPE_CHECKING:
    from core.adapters.postgres.connection import Queryable


async def _load_history(
    pool: Queryable,
    conversation_id: str,
    *,
    as_of: datetime | None = None,
    up_to_seq: int | None = None,
    after: MessageKey | None = None,
    limit: int | None = None,
) -> list[ConversationMessage]:
    if as_of is not None and as_of.utcoffset() is None:
        # asyncpg would read a naive cutoff as UTC; a local-time caller would silently lose
        # or gain messages.
        raise ValueError("as_of must be timezone-aware")
    # Keyset pagination over the history's order: (not a clip-archive, created_at,
    # id) ascending is "clip-archive first, then by time", and a page starts
    # strictly after ``after``'s key (LIMIT NULL is no limit).
    rows = await pool.fetch(
        """
        SELECT id, conversation_id, role, content, tool_calls, tool_call_id, created_at, kind,
               pinned
          FROM messages
         WHERE conversation_id = $1
           AND (kind = 'clip_archive' OR (
                ($2::timestamptz IS NULL OR created_at <= $2)
                AND ($3::bigint IS NULL OR seq <= $3)))
           AND ($4::boolean IS NULL
                OR ((kind <> 'clip_archive'), created_at, id) > ($4, $5::timestamptz, $6::text))
         ORDER BY (kind <> 'clip_archive'), created_at, id
         LIMIT $7::bigint
        """,
        conversation_id,
        as_of,
        up_to_seq,
        None if after is None else not after.clip_archive,
        None if after is None else after.created_at,
        None if after is None else after.id,
        limit,
    )
    return [row_to_message(row) for row in rows]


@port_errors_on_methods
class PostgresHistory:
    """``reads``: the pool a caller's reads (with a scope) take (``store.PostgresStore``)."""

    def __init__(self, pool: asyncpg.Pool, *, reads: asyncpg.Pool | None = None) -> None:
        self._pool = pool
        self._reads = pool if reads is None else reads

    async def load_history(
        self,
        conversation_id: str,
        *,
        as_of: datetime | None = None,
        up_to_seq: int | None = None,
        scope: ReadScope | None = None,
        after: MessageKey | None = None,
        limit: int | None = None,
    ) -> list[ConversationMessage]:
        async with read_as(self._pool if scope is None else self._reads, scope) as conn:
            return await _load_history(
                conn, conversation_id, as_of=as_of, up_to_seq=up_to_seq, after=after, limit=limit
            )

    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> CompactionInputs:
        """Whether the compaction is applied, the conversation's stored token total
        and its history (up to ``up_to_seq``, with each message's stored token
        count) in one round trip, from one snapshot.

        What the processor asks before every compaction; as three queries they
        were three round trips, each paid in CPU by the worker and PostgreSQL.
        """
        rows = await self._pool.fetch(
            """
            SELECT f.applied, f.total, m.id, m.conversation_id, m.role, m.content,
                   m.tool_calls, m.tool_call_id, m.created_at, m.kind, m.token_estimate,
                   m.pinned
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
        found = [row for row in rows if row["id"] is not None]
        return CompactionInputs(
            applied=bool(first["applied"]),
            total=int(first["total"]),
            history=[row_to_message(row) for row in found],
            stored_tokens={row["id"]: int(row["token_estimate"]) for row in found},
        )


if TYPE_CHECKING:

    def _implements(history: PostgresHistory) -> History:
        """Never called: makes mypy prove the class implements its port."""
        return history
