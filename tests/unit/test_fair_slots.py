"""Slots shared by tenant: one tenant's burst does not starve the others (issue 18.5)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.fair_slots import FairSlots

pytestmark = pytest.mark.unit


async def _order_served(slots: FairSlots, queued: list[str]) -> list[str]:
    """Hold every slot, queue ``queued`` (one acquire each, in that order), then let
    go: each served tenant hands its slot on at once. The order they are served in."""
    for _ in range(slots.capacity):
        await slots.acquire("holder")
    served: list[str] = []

    async def one(tenant: str) -> None:
        await slots.acquire(tenant)
        served.append(tenant)
        slots.release(tenant)

    tasks = [asyncio.create_task(one(t)) for t in queued]
    await asyncio.sleep(0)
    for _ in range(slots.capacity):
        slots.release("holder")
    await asyncio.gather(*tasks)
    return served


async def test_a_burst_queued_first_does_not_hold_the_other_tenant_behind_it() -> None:
    served = await _order_served(FairSlots(1), ["a"] * 100 + ["b"] * 3)
    assert [i for i, t in enumerate(served) if t == "b"] == [1, 3, 5]


async def test_fifo_serves_in_arrival_order() -> None:
    served = await _order_served(FairSlots(1, fair=False), ["a"] * 100 + ["b"] * 3)
    assert served[-3:] == ["b", "b", "b"]


async def test_weights_share_the_slots_in_proportion() -> None:
    slots = FairSlots(1, weights={"a": 3.0})
    served = await _order_served(slots, ["a"] * 60 + ["b"] * 60)
    first = served[:40]
    assert first.count("a") == 30 and first.count("b") == 10


async def test_a_tenant_back_after_idling_gets_no_backlog_of_turns() -> None:
    slots = FairSlots(1)
    await _order_served(slots, ["a"] * 20)  # a alone: served 20 times
    served = await _order_served(slots, ["b"] * 10 + ["a"] * 10)
    assert served[:4] in (["b", "a", "b", "a"], ["a", "b", "a", "b"])


async def test_a_cancelled_waiter_gives_up_its_place_and_no_slot_is_lost() -> None:
    slots = FairSlots(1)
    await slots.acquire("x")
    waiting = asyncio.create_task(slots.acquire("a"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    slots.release("x")
    assert slots.in_use == 0 and slots.waiting == 0
    async with slots.hold("b"):
        assert slots.in_use == 1


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=60),
    st.integers(1, 4),
)
def test_every_waiter_is_served_once_and_never_more_than_capacity(
    queued: list[str | None], capacity: int
) -> None:
    async def run() -> None:
        slots = FairSlots(capacity)
        peak = 0

        async def one(tenant: str | None) -> None:
            nonlocal peak
            async with slots.hold(tenant):
                peak = max(peak, slots.in_use)
                await asyncio.sleep(0)

        await asyncio.gather(*(one(t) for t in queued))
        assert peak <= capacity and slots.in_use == 0 and slots.waiting == 0
        assert sum(slots.granted.values()) == len(queued)

    asyncio.run(run())


async def test_headroom_is_kept_from_a_burst_while_another_tenant_is_active() -> None:
    now = [0.0]
    slots = FairSlots(8, headroom=2, active_seconds=10, clock=lambda: now[0])
    for _ in range(8):
        await slots.acquire("a")  # alone: every slot
    for _ in range(8):
        slots.release("a")
    async with slots.hold("b"):
        pass  # b is active now
    burst = [asyncio.create_task(slots.acquire("a")) for _ in range(8)]
    await asyncio.sleep(0)
    assert slots.in_use == 6  # two kept for b
    await asyncio.wait_for(slots.acquire("b"), 1)  # b goes at once
    now[0] = 11.0  # b quiet for longer than active_seconds: a may take the rest
    slots.release("b")
    await asyncio.sleep(0)
    assert slots.in_use == 8 and slots.waiting == 0  # a has them all
    for task in burst:
        task.cancel()
    await asyncio.gather(*burst, return_exceptions=True)


async def _queued_by_priority(
    queued: list[tuple[str, float]], cancel: str | None = None
) -> list[str]:
    """One slot held; ``queued`` wait for it with their priorities (``cancel``
    gives up while queued); then the slot is let go. The order they got it in."""
    slots = FairSlots(1)
    await slots.acquire("t")
    served: list[str] = []

    async def one(name: str, priority: float) -> None:
        await slots.acquire("t", priority)
        served.append(name)
        slots.release("t")

    tasks = {name: asyncio.create_task(one(name, p)) for name, p in queued}
    await asyncio.sleep(0)
    if cancel is not None:
        tasks.pop(cancel).cancel()
        await asyncio.sleep(0)
        assert slots.waiting == len(tasks)
    slots.release("t")
    await asyncio.gather(*tasks.values())
    return served


async def test_within_a_tenant_the_highest_priority_goes_first_then_arrival_order() -> None:
    queued = [("a", 1.0), ("b", 5.0), ("c", 1.0), ("d", 9.0), ("e", 5.0)]
    served = await _queued_by_priority(queued)
    assert served == ["d", "b", "e", "a", "c"]


async def test_a_waiter_cancelled_in_the_queue_leaves_the_order_of_the_rest() -> None:
    served = await _queued_by_priority([("a", 1), ("b", 3), ("c", 2)], cancel="b")
    assert served == ["c", "a"]


async def test_shrinking_keeps_the_held_slots_and_grants_none_until_under_the_new_size() -> None:
    slots = FairSlots(4)
    for _ in range(4):
        await slots.acquire("t")
    slots.resize(2)
    waiter = asyncio.create_task(slots.acquire("t"))
    for _ in range(3):
        slots.release("t")
        await asyncio.sleep(0)
        assert not waiter.done() or slots.in_use <= 2
    await waiter
    assert slots.in_use == 2
    slots.resize(3)
    await asyncio.wait_for(slots.acquire("t"), 1)
    assert slots.in_use == 3
