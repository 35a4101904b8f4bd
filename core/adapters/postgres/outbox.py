"""The transactional outbox: rows ``apply_compaction`` wrote, read and marked by the relay
(``PostgresOutbox``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres.errors import port_errors_on_methods
from core.ports.storage import OutboxRow, OutboxStore


@port_errors_on_methods
class PostgresOutbox:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def pending_outbox(
        self, *, older_than_seconds: float = 0.0, limit: int = 100
    ) -> list[OutboxRow]:
        """Unpublished outbox rows written at least ``older_than_seconds`` ago, oldest
        first. Aged by the database's clock, the one ``created_at`` was set by (the
        compaction's transaction start)."""
        rows = await self._pool.fetch(
            """
            SELECT id, compaction_id, topic, key, payload FROM outbox
             WHERE published_at IS NULL
               AND created_at <= now() - make_interval(secs => $1::double precision)
             ORDER BY id LIMIT $2
            """,
            older_than_seconds,
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
            SELECT id, compaction_id, topic, key, payload, published_at IS NOT NULL AS published
              FROM outbox
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


if TYPE_CHECKING:

    def _implements(outbox: PostgresOutbox) -> OutboxStore:
        """Never called: makes mypy prove the class implements its port."""
        return outbox
