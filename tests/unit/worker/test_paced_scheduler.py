"""The scheduler under the compaction pacer: a wave of commands starts at the
floor, grows as rounds pass with the turns on time, and a late group of
messages lowers the limit before the next compaction starts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from core.domain.pace import PaceRule
from streams.events import MessageEvent
from streams.worker.pacer import CompactionPacer
from streams.worker.scheduler import CompactionScheduler
from tests.support.builders import T0
from tests.unit.worker.harness import NAMES, harness

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _pacer(clock: Clock, *, floor: int, ceiling: int = 16) -> tuple[CompactionPacer, list[int]]:
    """A pacer with a 100 ms target on ``clock``, and the late groups it counted."""
    late: list[int] = []
    rule = PaceRule(floor=floor, ceiling=ceiling, target_seconds=0.1)
    return CompactionPacer(rule, clock=clock, on_late=lambda: late.append(1)), late


async def _acked(_: int) -> None:
    return None


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 (the compactions' own steps)
            await asyncio.sleep(0)


async def _wave(
    scheduler: CompactionScheduler[int], size: int
) -> tuple[list[asyncio.Event], list[int]]:
    """``size`` conversations' commands, each compaction held until its event is set."""
    gates = [asyncio.Event() for _ in range(size)]
    running = [0, 0]  # now, peak

    def work(gate: asyncio.Event) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            running[0] += 1
            running[1] = max(running[1], running[0])
            await gate.wait()
            running[0] -= 1

        return run

    for n, gate in enumerate(gates):
        await scheduler.submit(
            partition=0, offset=n, token=n, conversation_id=f"c{n}", work=work(gate)
        )
    return gates, running


async def _floor_wave() -> tuple[
    Clock, CompactionPacer, list[int], CompactionScheduler[int], list[asyncio.Event], list[int]
]:
    """A wave of 40 under a pacer with a floor of 2 (scheduler maximum 16), its
    first two compactions running."""
    clock = Clock()
    pacer, late = _pacer(clock, floor=2)
    scheduler: CompactionScheduler[int] = CompactionScheduler(
        _acked, max_concurrent=16, pacer=pacer
    )
    gates, running = await _wave(scheduler, 40)
    await _until(lambda: running[0] == 2)
    return clock, pacer, late, scheduler, gates, running


async def test_a_wave_starts_at_the_floor_and_grows_a_round_at_a_time() -> None:
    clock, pacer, _, scheduler, gates, running = await _floor_wave()
    for _ in range(20):
        await asyncio.sleep(0)
    assert running[1] == 2, "more than the floor started before a round passed"
    pacer.stored(published_at=clock.now - 0.01)  # a turn, on time
    clock.now += 1.0  # a round with the turns on time: the next finish doubles it
    gates[0].set()
    await _until(lambda: running[0] == 4)
    pacer.stored(published_at=clock.now - 0.01)
    clock.now += 1.0
    gates[1].set()
    await _until(lambda: running[0] == 8)
    for gate in gates:
        gate.set()
    await scheduler.drain()
    assert scheduler.stats.completed == 40


async def test_a_wave_with_no_turn_to_protect_takes_every_slot_after_a_round() -> None:
    """A burst's backlog of compactions, no message arriving: after one round at the
    floor the limit is what the wave wants, up to the ceiling."""
    clock, _, _, scheduler, gates, running = await _floor_wave()
    clock.now += 1.0
    gates[0].set()
    await _until(lambda: running[0] == 12)  # the scheduler's 16, three quarters per tenant
    for gate in gates:
        gate.set()
    await scheduler.drain()
    assert scheduler.stats.completed == 40


async def test_a_late_group_lowers_the_limit_before_the_next_compaction_starts() -> None:
    clock, pacer, late, scheduler, gates, running = await _floor_wave()
    for step, expected in enumerate((4, 8)):  # 2 -> 4 -> 8
        pacer.stored(published_at=clock.now - 0.01)  # the turns on time
        clock.now += 1.0
        gates[step].set()
        await _until(lambda expected=expected: running[0] == expected)
    pacer.stored(published_at=clock.now - 0.01)  # on time: the baseline
    pacer.stored(published_at=clock.now - 0.5)  # 0.49 s over it: late
    assert late == [1]
    assert pacer.current == 4
    for gate in gates[2:8]:  # six finish: none replaced while 4 or more run
        gate.set()
    await _until(lambda: scheduler.stats.completed == 8)
    for _ in range(20):
        await asyncio.sleep(0)
    assert running[0] == 4
    for gate in gates:
        gate.set()
    await scheduler.drain()


async def test_without_a_target_every_slot_is_used_at_once() -> None:
    """Every slot a tenant may hold: three quarters of them (``FairSlots``)."""
    pacer = CompactionPacer(PaceRule(floor=2, ceiling=16, target_seconds=0))
    scheduler: CompactionScheduler[int] = CompactionScheduler(
        _acked, max_concurrent=16, pacer=pacer
    )
    gates, running = await _wave(scheduler, 40)
    await _until(lambda: running[0] == 12)
    for gate in gates:
        gate.set()
    await scheduler.drain()


async def test_ingest_tells_the_pacer_when_each_group_was_published() -> None:
    """The worker's wiring (``build_components``): a group's newest record
    timestamp reaches the pacer once the group is stored."""
    h = harness(min_concurrent_compactions=2)
    now = time.time()
    for index, published in enumerate((now - 0.01, now - 3.0, None)):
        event = MessageEvent(
            message_id=f"m{index}", conversation_id="c1", role="user", content="hello",
            created_at=T0,
        )  # fmt: skip
        record = h.record(NAMES.messages, "c1", event.model_dump_json())
        await h.components.accounting.handle(replace(record, timestamp=published))
    assert len(h.store.messages) == 3
    assert h.components.metrics.turns_late._value.get() == 1


async def test_the_conversation_furthest_over_budget_is_compacted_first() -> None:
    """Paced at the floor in a wave, a burst's conversation (three times its
    budget) must not wait behind every conversation just over it."""
    clock = Clock()
    pacer, _ = _pacer(clock, floor=1)
    tokens = {f"c{n}": 4_100 for n in range(10)} | {"burst": 12_000}
    scheduler: CompactionScheduler[int] = CompactionScheduler(
        _acked, max_concurrent=16, pacer=pacer, urgency=lambda c: tokens[c]
    )
    started: list[str] = []
    first = asyncio.Event()

    def work(conversation: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            started.append(conversation)
            if conversation == "c0":
                await first.wait()

        return run

    for n, conversation in enumerate([*list(tokens)[:10], "burst"]):
        await scheduler.submit(
            partition=0, offset=n, token=n, conversation_id=conversation, work=work(conversation)
        )
    await _until(lambda: started == ["c0"])
    for _ in range(20):
        await asyncio.sleep(0)
    first.set()
    await scheduler.drain()
    assert started[:2] == ["c0", "burst"]


async def test_a_conversation_over_its_window_does_not_wait_for_the_pace() -> None:
    """Over the model's window every turn sent uncompacted fails: its compaction
    runs beside the pace, and never past ``max_concurrent`` in all."""
    pacer, _ = _pacer(Clock(), floor=1, ceiling=2)
    tokens = {"c0": 4_100, "c1": 4_100, "over1": 9_000, "over2": 9_000}
    scheduler: CompactionScheduler[int] = CompactionScheduler(
        _acked, max_concurrent=2, pacer=pacer, urgency=lambda c: tokens[c], urgent_at=8_000
    )
    started: list[str] = []
    hold = asyncio.Event()

    def work(conversation: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            started.append(conversation)
            await hold.wait()

        return run

    for n, conversation in enumerate(tokens):
        await scheduler.submit(
            partition=0, offset=n, token=n, conversation_id=conversation, work=work(conversation)
        )
    await _until(lambda: len(started) == 2)
    for _ in range(20):
        await asyncio.sleep(0)
    assert started == ["c0", "over1"]  # c1 waits for the pace, over2 for max_concurrent
    hold.set()
    await scheduler.drain()
    assert sorted(started) == sorted(tokens)


def test_a_group_published_over_a_window_ago_is_not_a_turn() -> None:
    """An import sent with its original times must not hold every tenant's
    compactions at the floor: only delays within a window count."""
    clock = Clock()
    pacer, late = _pacer(clock, floor=1)
    pacer.stored(published_at=clock.now - 0.01)
    pacer.stored(published_at=clock.now - 86_400)  # a day old
    pacer.stored(published_at=clock.now - 61)
    assert late == []
    pacer.stored(published_at=clock.now - 59)
    assert late == [1]
