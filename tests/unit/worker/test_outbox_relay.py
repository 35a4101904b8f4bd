"""The outbox relay under load: what it sends at once, and what it marks together.

Why: a burst of compactions finishing together used to queue behind one lock
shared by every compaction, each publishing its records one after the other
and awaiting each ack (34-184 ms commit+relay in docs/performance.md). And a
mark must touch one compaction's rows only, so every write transaction stays
inside one conversation (docs/scaling.md).

The publisher here holds every send until the expected number of sends are in
flight together: a relay that sent them one at a time would never get there,
and the test fails at its (generous) deadline instead of passing. Within one
compaction the clip-archive goes first and its completion once the broker has
it (issue 29: an erased summary must not follow the erase's second tombstone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from core.ports.storage import OutboxRecord, OutboxRow
from streams.metrics import Metrics
from streams.worker.outbox import OutboxRelay

pytestmark = pytest.mark.unit

DEADLINE = 10.0


class OutboxOnly:
    """The outbox methods of the store port, recording every read and mark;
    ``young`` rows were written less than the grace ago."""

    def __init__(self, rows: Sequence[OutboxRow]) -> None:
        self.rows = list(rows)
        self.published: set[int] = set()
        self.young: set[int] = set()
        self.marks: list[list[int]] = []
        self.reads = 0
        self.compaction_marks: list[str] = []
        self.asked_age: list[float] = []

    async def pending_outbox(
        self, *, older_than_seconds: float = 0.0, limit: int = 100
    ) -> list[OutboxRow]:
        self.reads += 1
        self.asked_age.append(older_than_seconds)
        rows = [r for r in self.rows if r.id not in self.published | self.young]
        return rows[:limit]

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        return [
            r.model_copy(update={"published": r.id in self.published})
            for r in self.rows
            if r.compaction_id == compaction_id
        ]

    async def mark_published(self, ids: Sequence[int]) -> None:
        self.marks.append(list(ids))
        self.published.update(ids)

    async def mark_compaction_published(self, compaction_id: str) -> None:
        self.compaction_marks.append(compaction_id)
        self.published.update(r.id for r in self.rows if r.compaction_id == compaction_id)


class GatePublisher:
    """Holds every send until ``together`` sends are in flight at once."""

    def __init__(self, together: int) -> None:
        self.together = together
        self.started: list[tuple[str, bytes | None]] = []
        self._all_in = asyncio.Event()

    async def publish(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Any = None
    ) -> None:
        self.started.append((topic, value))
        if len(self.started) >= self.together:
            self._all_in.set()
        await self._all_in.wait()


def rows(compaction_id: str, first_id: int) -> list[OutboxRow]:
    key = f"conv-{compaction_id}"
    return [
        OutboxRow(id=first_id, compaction_id=compaction_id, topic="clip_archives", key=key,
                  payload=f"{compaction_id}-clip"),
        OutboxRow(id=first_id + 1, compaction_id=compaction_id, topic="control", key=key,
                  payload=f"{compaction_id}-done"),
    ]  # fmt: skip


GRACE = 30.0


class OutboxPorts:
    """The relay's one port (``streams.worker.outbox.OutboxPorts``): nothing else."""

    def __init__(self, outbox: OutboxOnly) -> None:
        self.outbox = outbox


def relay_over(store: OutboxOnly, publisher: GatePublisher) -> OutboxRelay:
    return OutboxRelay(OutboxPorts(store), publisher, Metrics(), grace_seconds=GRACE)


def records_of(committed: Sequence[OutboxRow]) -> list[OutboxRecord]:
    return [OutboxRecord(topic=r.topic, key=r.key, payload=r.payload) for r in committed]


async def test_a_compactions_completion_goes_once_its_clip_archive_is_acknowledged() -> None:
    """Issue 29: sent together, the completion could land first, and the erased
    conversation's second tombstone before the clip-archive (test_tenants_and_erase.py)."""
    store = OutboxOnly(rows("a", 1))
    publisher = GatePublisher(together=1)
    relay = relay_over(store, publisher)
    await asyncio.wait_for(relay.send("a", records_of(store.rows)), DEADLINE)
    assert [topic for topic, _ in publisher.started] == ["clip_archives", "control"]
    assert store.compaction_marks == ["a"]


async def test_compactions_relay_side_by_side_not_behind_one_lock() -> None:
    """Both clip-archives in flight at once (then both completions)."""
    store = OutboxOnly([*rows("a", 1), *rows("b", 3)])
    publisher = GatePublisher(together=2)
    relay = relay_over(store, publisher)
    await asyncio.wait_for(
        asyncio.gather(
            relay.send("a", records_of(store.rows[:2])), relay.send("b", records_of(store.rows[2:]))
        ),
        DEADLINE,
    )
    assert sorted(store.compaction_marks) == ["a", "b"]  # one mark per compaction
    assert store.published == {1, 2, 3, 4}


async def test_a_timer_pass_marks_each_compaction_on_its_own_and_leaves_young_rows() -> None:
    store = OutboxOnly([*rows("a", 1), *rows("b", 3), *rows("c", 5)])
    store.young = {3, 4}  # committed within the grace: its processor is sending them
    publisher = GatePublisher(together=1)
    relay = relay_over(store, publisher)
    await asyncio.wait_for(relay.tick(), DEADLINE)
    assert store.asked_age == [GRACE]
    assert store.marks == [[1, 2], [5, 6]]
    assert [value for _, value in publisher.started] == [
        b"a-clip",
        b"a-done",
        b"c-clip",
        b"c-done",
    ]
    store.young = set()  # the grace is over: the processor crashed before relaying
    await asyncio.wait_for(relay.tick(), DEADLINE)
    assert store.marks[-1] == [3, 4]
    assert store.published == {1, 2, 3, 4, 5, 6}


async def test_relaying_again_sends_the_completion_and_only_an_unpublished_clip_archive() -> None:
    """A replayed compaction re-sends its completion (it may not have been applied)
    but not a clip-archive the broker already acknowledged: consumers have it."""
    store = OutboxOnly(rows("a", 1))
    store.published = {1, 2}
    publisher = GatePublisher(together=1)
    relay = relay_over(store, publisher)
    assert await asyncio.wait_for(relay.republish("a"), DEADLINE) == 1
    assert publisher.started == [("control", b"a-done")]
    assert await asyncio.wait_for(relay.drain(), DEADLINE) == 0
    store.published = set()  # a crash between commit and publish: both go out
    publisher = GatePublisher(together=1)
    relay = relay_over(store, publisher)
    assert await asyncio.wait_for(relay.republish("a"), DEADLINE) == 2
    assert [topic for topic, _ in publisher.started] == ["clip_archives", "control"]


async def test_the_records_a_compaction_built_are_sent_without_reading_them_back() -> None:
    committed = rows("a", 1)
    store = OutboxOnly(committed)
    publisher = GatePublisher(together=1)
    relay = relay_over(store, publisher)
    await asyncio.wait_for(relay.send("a", records_of(committed)), DEADLINE)
    assert [value for _, value in publisher.started] == [b"a-clip", b"a-done"]
    assert (store.reads, store.compaction_marks, store.published) == (0, ["a"], {1, 2})
