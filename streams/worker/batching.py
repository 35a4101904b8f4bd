"""Group a Faust stream's events by what is already waiting: no timer, no added latency.

A group is whatever the stream's queue holds when the agent comes back for
more, up to ``max_events``: one event when traffic is light (so a lone message
is accounted at once), large groups under a backlog (so the per-group costs,
one PostgreSQL statement and one table write per conversation, are shared).
Faust's ``take_events`` would wait up to its ``within`` for a full group
instead, and hands the group over outside the event's task context, where
table writes are refused. A group's events are acked once the table entries
they changed are flushed (``streams.worker.tally_table.AcksAfterFlush``).

``ready(n)`` takes up to ``n`` more waiting events at once after each one the
stream gives (``streams.kafka.stream_take.ready_events`` for a Faust stream):
Faust's stream iterator spends an event-loop turn before every event, so a
group collected one at a time stayed small (docs/performance.md section 10).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any


def _none_ready(_: int) -> list[Any]:
    return []


async def in_groups(
    stream: Any,
    max_events: int,
    seen: Callable[[Any], None] = lambda _: None,
    ready: Callable[[int], list[Any]] = _none_ready,
) -> AsyncIterator[list[Any]]:
    """Lists of events, in order; ``seen`` is called for each as it arrives."""
    queue = getattr(stream.channel, "queue", None)
    group: list[Any] = []
    async for event in stream.events():
        for taken in (event, *ready(max_events - len(group) - 1)):
            seen(taken)
            group.append(taken)
        if len(group) >= max_events or queue is None or queue.empty():
            yield group
            group = []
