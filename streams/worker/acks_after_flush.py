"""Acks held until the table entries their events changed are written.

The token table is written behind (``streams.worker.tally_table``); an event
acked before its entry reached the changelog could be committed past, and a
kill -9 then would leave the changelog a message short of PostgreSQL.
"""

from __future__ import annotations

import asyncio
from typing import Any


class AcksAfterFlush:
    """Acks a group's events once the table entries they changed are flushed.

    The table is written behind (``TallyTable.flush_in_steps``), and Faust commits an
    acked offset within a second: acked at once, a kill -9 between the commit
    and the flush left the changelog a message short of PostgreSQL, for good
    if the conversation got no further message (the new owner restores the
    entry and never reads that message again). Held until the flush, the
    events are read again after a kill, found stored, and the entry resynced.
    Faust flushes its producer (changelog records included) before it commits.
    """

    def __init__(self, table: Any) -> None:
        self._table = table
        self._pending: list[tuple[Any, Any]] = []
        self._revoked: set[int] = set()  # since the running flush began
        self._flushing = asyncio.Lock()

    def hold(self, stream: Any, events: list[Any], skip: set[int]) -> None:
        """Events of partitions in ``skip`` (revoked meanwhile) are never acked."""
        self._pending.extend((stream, e) for e in events if e.message.partition not in skip)

    async def settle(self, *, force: bool = False) -> int:
        """Flush if due (or ``force``), then ack what the flush made durable: the
        events held when it began, but those of partitions revoked meanwhile."""
        async with self._flushing:
            if not (force or self._table.flush_due()):
                return 0
            pending, self._pending = self._pending, []
            self._revoked = set()
            await self._table.flush_in_steps()
            acked = [(s, e) for s, e in pending if e.message.partition not in self._revoked]
            for stream, event in acked:
                await stream.ack(event)
            return len(acked)

    def drop(self, partitions: set[int]) -> None:
        """Revoked: their new owner reads these events again."""
        self._pending = [(s, e) for s, e in self._pending if e.message.partition not in partitions]
        self._revoked |= partitions

    def __len__(self) -> int:
        return len(self._pending)
