"""Acks wait for the table flush that wrote their entries; a flush yields to the
event loop every ``step`` entries, and stays correct
when the table changes (or a partition is revoked) between two steps."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.domain.tally import ConversationTally
from streams.worker.acks_after_flush import AcksAfterFlush
from streams.worker.tally_table import TallyTable

pytestmark = pytest.mark.unit


class _Event:
    def __init__(self, partition: int) -> None:
        self.message = type("M", (), {"partition": partition})()


class _Stream:
    def __init__(self) -> None:
        self.acked: list[_Event] = []

    async def ack(self, event: _Event) -> None:
        self.acked.append(event)


def _tally(n: int, tokens: int = 5) -> ConversationTally:
    return ConversationTally(conversation_id=f"c{n}", token_total=tokens)


def _filled(entries: int, partitions: int = 4) -> tuple[TallyTable, dict[str, Any]]:
    raw: dict[str, Any] = {}
    table = TallyTable(raw)
    for n in range(entries):
        table.put(_tally(n), partition=n % partitions)
    return table, raw


async def _flush_counting_loop_turns(table: TallyTable) -> tuple[int, int]:
    """(entries written, turns another task got) over one ``flush_in_steps(250)``."""
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    ticker = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns
    written = await table.flush_in_steps(step=250)
    ticker.cancel()
    return written, turns - before


async def test_a_flush_of_ten_thousand_entries_lets_the_event_loop_run_between_steps() -> None:
    """Written in one go, 10,000 entries would hold the loop ~0.7 s."""
    table, raw = _filled(10_000)
    written, turns = await _flush_counting_loop_turns(table)
    assert written == 10_000 and len(raw) == 10_000 and table.dirty == 0
    assert turns >= 10_000 // 250 - 1  # the loop ran between every two steps


async def test_a_flush_of_fewer_entries_than_a_step_runs_in_one_go() -> None:
    """Whatever partitions they are in: a small flush costs no extra loop turns."""
    table, raw = _filled(249, partitions=6)
    written, turns = await _flush_counting_loop_turns(table)
    assert written == 249 == len(raw)
    assert turns == 0


async def test_steps_write_what_one_flush_writes() -> None:
    stepped, stepped_raw = _filled(1_003)
    whole, whole_raw = _filled(1_003)
    assert await stepped.flush_in_steps(step=7) == whole.flush(force=True) == 1_003
    assert stepped_raw == whole_raw


async def test_an_entry_changed_or_forgotten_between_steps() -> None:
    table, raw = _filled(8, partitions=2)  # partition 0: c0 c2 c4 c6; 1: c1 c3 c5 c7
    first_step: set[str] = set()

    async def meanwhile() -> None:
        first_step.update(raw)  # first run at the flush's first yield: one step written
        for key in first_step:  # changed again after they were written
            n = int(key[1:])
            table.put(_tally(n, tokens=9), partition=n % 2)
        table.flush_partitions({1})  # a revocation writes its partition first...
        table.forget({1})  # ...then forgets it

    task = asyncio.create_task(meanwhile())
    written = await table.flush_in_steps(step=2)
    await task
    assert len(first_step) == 2 and set(raw) == {f"c{n}" for n in range(8)}
    even = {k for k in first_step if int(k[1:]) % 2 == 0}
    assert written == 2 + 4 - len(even)  # partition 1's rest was written by the revocation
    assert all(raw[k]["token_total"] == (9 if k in first_step - even else 5) for k in raw)
    assert table.dirty == len(even)  # the change waits for the next flush
    assert table.flush(force=True) == len(even)
    assert all(raw[k]["token_total"] == 9 for k in first_step)


async def test_acks_wait_for_the_whole_flush_and_skip_partitions_revoked_meanwhile() -> None:
    table, raw = _filled(600, partitions=2)
    acks, stream = AcksAfterFlush(table), _Stream()
    kept, revoked = _Event(0), _Event(1)
    acks.hold(stream, [kept, revoked], skip=set())
    later = _Event(0)

    async def meanwhile() -> None:
        await asyncio.sleep(0)
        assert stream.acked == []  # nothing acked before every entry is written
        acks.hold(stream, [later], skip=set())  # held during the flush: not this one's
        table.flush_partitions({1})
        table.forget({1})
        acks.drop({1})

    task = asyncio.create_task(meanwhile())
    assert await acks.settle(force=True) == 1
    await task
    assert stream.acked == [kept] and len(raw) == 600 and len(acks) == 1
    assert await acks.settle(force=True) == 1 and stream.acked == [kept, later]


async def test_a_settle_begun_during_another_keeps_its_revocations() -> None:
    table, _ = _filled(600, partitions=2)
    acks, stream = AcksAfterFlush(table), _Stream()
    revoked = _Event(1)
    acks.hold(stream, [revoked], skip=set())

    async def meanwhile() -> None:
        await asyncio.sleep(0)
        table.flush_partitions({1})
        table.forget({1})
        acks.drop({1})
        await acks.settle(force=True)  # waits for the first: one flush at a time

    task = asyncio.create_task(meanwhile())
    assert await acks.settle(force=True) == 0
    await task
    assert stream.acked == []


async def test_events_are_acked_only_once_their_table_entries_are_flushed() -> None:
    now = [0.0]
    raw: dict[str, Any] = {}
    table = TallyTable(raw, flush_seconds=1.0, clock=lambda: now[0])
    acks, stream = AcksAfterFlush(table), _Stream()
    first, second, revoked = _Event(0), _Event(1), _Event(2)
    table.put(ConversationTally(conversation_id="c", token_total=5), partition=0)
    acks.hold(stream, [first, second, revoked], skip={2})
    assert await acks.settle() == 0 and stream.acked == [] and raw == {}  # not due yet
    acks.drop({1})  # partition 1 revoked meanwhile: read again by its next owner
    now[0] = 1.0
    assert await acks.settle() == 1
    assert stream.acked == [first] and raw["c"]["token_total"] == 5  # flushed, then acked
    assert len(acks) == 0
