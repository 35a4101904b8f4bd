"""Writing a Faust table entry from outside the event that changed it.

Faust decides which changelog partition (and, with RocksDB, which
per-partition database) a table write goes to from the *current event*, a
task-local context variable its stream sets while an agent handles an event.
A flush of coalesced entries (``streams.worker.tally_table``) writes entries
of many partitions at once, after their events, so it sets that variable
itself: to the newest event seen of the entry's partition. The messages and
control topics are co-partitioned with the table, so an event of either topic
names the right partition.

This uses ``faust.streams._current_event``, a private name of faust-streaming
0.15 (as ``streams.kafka.faust_patches`` does for other internals); the unit
test in tests/unit/kafka/test_table_context.py fails if it moves.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from faust import streams as faust_streams


class TableContexts:
    def __init__(self) -> None:
        self._latest: dict[int, Any] = {}

    def seen(self, event: Any) -> None:
        """Remember ``event`` as its partition's newest (called for every event)."""
        self._latest[event.message.partition] = event

    def forget(self, partitions: set[int]) -> None:
        for partition in partitions:
            self._latest.pop(partition, None)

    def __call__(self, partition: int | None) -> Any:
        """A context in which Faust writes to ``partition``; ``LookupError`` when no
        event of it has been seen here."""
        if partition is None:
            raise LookupError("a table entry without a partition")
        event = self._latest.get(partition)
        if event is None:
            raise LookupError(f"no event of partition {partition} seen yet")
        return acting_as(event)


@contextmanager
def acting_as(event: Any) -> Iterator[None]:
    variable = faust_streams._current_event
    token = variable.set(weakref.ref(event))
    try:
        yield
    finally:
        variable.reset(token)
