"""Group a Faust stream's events by what is already waiting: no timer, no added latency.

A group is whatever the stream's queue holds when the agent comes back for
more, up to ``max_events``: one event when traffic is light (so a lone message
is accounted at once), large groups under a backlog (so the per-group costs,
one PostgreSQL statement and one table write per conversation, are shared).
Faust's ``take_events`` would wait up to its ``within`` for a full group
instead, and hands the group over outside the event's task context, where
table writes are refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any


async def in_groups(
    stream: Any, max_events: int, seen: Callable[[Any], None] = lambda _: None
) -> AsyncIterator[list[Any]]:
    """Lists of events, in order; ``seen`` is called for each as it arrives."""
    queue = getattr(stream.channel, "queue", None)
    group: list[Any] = []
    async for event in stream.events():
        seen(event)
        group.append(event)
        if len(group) >= max_events or queue is None or queue.empty():
            yield group
            group = []


class AcksAfterFlush:
    """Acks a group's events once the table entries they changed are flushed.

    The table is written behind (``TallyTable.flush``), and Faust commits an
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

    def hold(self, stream: Any, events: list[Any], skip: set[int]) -> None:
        """Events of partitions in ``skip`` (revoked meanwhile) are never acked."""
        self._pending.extend((stream, e) for e in events if e.message.partition not in skip)

    async def settle(self, *, force: bool = False) -> int:
        """Flush if due (or ``force``), then ack what the flush made durable."""
        if not (force or self._table.flush_due()):
            return 0
        self._table.flush(force=True)
        pending, self._pending = self._pending, []
        for stream, event in pending:
            await stream.ack(event)
        return len(pending)

    def drop(self, partitions: set[int]) -> None:
        """Revoked: their new owner reads these events again."""
        self._pending = [(s, e) for s, e in self._pending if e.message.partition not in partitions]

    def __len__(self) -> int:
        return len(self._pending)
