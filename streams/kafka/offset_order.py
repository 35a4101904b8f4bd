"""Hand the messages agent each partition's records in offset order, from where
the partition starts.

Records can go missing between Faust's fetch loop and the agent (the first
records of a fresh partition, after a rebalance; where is not found:
docs/reliability.md). The commit-time guard reads them again
(``gap_reread``), but too late for their order: a conversation's later turns
stored and compacted before its first ones can archive a tool result whose
call is stored after it.

So the agent checks each event against the next offset it expects of its
partition: at the first event of a generation, where the partition starts
(``gap_reread.first_offset``), then one past the last event admitted. A jump
over more than one offset (one is a transaction's marker) is a hole: that
event and every later one of the partition are set aside, neither handled nor
acked, and the fetch loop reads the hole again (``gap_reread.reread``: it
delivers nothing more of the partition until it has sought back). Events of
the partition already queued when the hole is found are set aside when they
come; one still on its way is set aside while the re-read is pending (taken
after it is over, it is admitted, ahead of the hole's records: a delivery in
flight at the instant the hole is found). The partition is admitted again
from the first event inside the hole, or once the re-read is over without
one: what the second read skips holds no records (it is not read a third
time). Duplicates (offsets already admitted) pass: every write is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from streams.kafka import gap_reread

log = logging.getLogger("compactor.worker")


@dataclass
class _Hole:
    """Offsets ``start`` to ``end`` (excluded) missing; ``queued``: ids of the
    partition's events that were waiting in the queue when it was found."""

    start: int
    end: int
    queued: set[int] = field(default_factory=set)


class OffsetOrder:
    """Filters the agent's groups (module doc); one per agent, like its stream."""

    def __init__(self, consumer: Callable[[], Any], queue: Any) -> None:
        self._consumer = consumer
        self._queue = queue
        self._generation: int | None = None
        self._next: dict[Any, int] = {}
        self._holes: dict[Any, _Hole] = {}

    async def in_order(self, groups: AsyncIterator[list[Any]]) -> AsyncIterator[list[Any]]:
        """``groups`` with what is out of order set aside (empty groups dropped)."""
        async for group in groups:
            admitted = self.admit(group)
            if admitted:
                yield admitted

    def admit(self, group: list[Any]) -> list[Any]:
        """The events of ``group`` to handle now, in order."""
        return [event for event in group if self._admits(event.message, id(event))]

    def _admits(self, message: Any, event_id: int) -> bool:
        generation = message.generation_id
        if self._generation is None or generation > self._generation:
            self._generation = generation  # sought to the committed offsets: start over
            self._next.clear()
            self._holes.clear()
        elif generation < self._generation:
            return True  # from before the rebalance: its acks are dropped anyway
        tp, offset = message.tp, message.offset
        hole = self._holes.get(tp)
        if hole is not None:
            if event_id in hole.queued:
                hole.queued.discard(event_id)
                return False
            if offset >= hole.end and gap_reread.reread_pending(self._consumer(), tp):
                return False
            del self._holes[tp]  # the second read decides: what it skips is no record
            self._next[tp] = max(self._next.get(tp, 0), offset + 1)
            return True
        expected = self._next.get(tp)
        if expected is None:
            expected = gap_reread.first_offset(self._consumer(), tp)
        if expected is not None and offset - expected > 1:
            self._set_aside(tp, expected, offset)
            return False
        self._next[tp] = max(expected or 0, offset + 1)
        return True

    def _set_aside(self, tp: Any, start: int, end: int) -> None:
        gap_reread.reread(self._consumer(), tp, start, end)
        waiting = list(getattr(self._queue, "_queue", ()))
        queued = {id(event) for event in waiting if event.message.tp == tp}
        self._holes[tp] = _Hole(start, end, queued)
        log.warning(
            "offsets %d..%d of %s:%d never reached the agent: reading them again "
            "before offset %d",
            start, end - 1, tp.topic, tp.partition, end,
        )  # fmt: skip
