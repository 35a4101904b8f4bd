"""The store's own token counts, which the worker's token table caches (``PostgresTallies``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres.errors import port_errors_on_methods
from core.ports.storage import StoreTotals, TallySource

_TOTALS_SQL = """
SELECT i.conversation_id, coalesce(m.tokens, 0) AS tokens, coalesce(m.rows, 0) AS rows,
       m.last_seq, coalesce(e.epoch, 0) AS epoch
  FROM unnest($1::text[]) AS i(conversation_id)
  LEFT JOIN (SELECT conversation_id, sum(token_estimate) AS tokens, count(*) AS rows,
                    max(seq) AS last_seq
               FROM messages
              WHERE conversation_id = ANY($1::text[])
              GROUP BY conversation_id) AS m USING (conversation_id)
  LEFT JOIN erasures AS e USING (conversation_id)
"""


@port_errors_on_methods
class PostgresTallies:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def last_seq(self, conversation_id: str) -> int | None:
        """The arrival number of the conversation's newest message, if any."""
        value = await self._pool.fetchval(
            "SELECT max(seq) FROM messages WHERE conversation_id = $1", conversation_id
        )
        return None if value is None else int(value)

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        ids = list(dict.fromkeys(conversation_ids))
        found = {
            row["conversation_id"]: StoreTotals(
                int(row["tokens"]),
                int(row["rows"]),
                None if row["last_seq"] is None else int(row["last_seq"]),
                int(row["epoch"]),
            )
            for row in await self._pool.fetch(_TOTALS_SQL, ids)
        }
        return {
            conversation_id: found.get(conversation_id, StoreTotals()) for conversation_id in ids
        }

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


if TYPE_CHECKING:

    def _implements(tallies: PostgresTallies) -> TallySource:
        """Never called: makes mypy prove the class implements its port."""
        return tallies
