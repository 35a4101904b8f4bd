"""``overlapped``: the next group is decoded while the current one is stored, and
nothing else changes: stores one at a time, in order, failures and cancellation
reaching the agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streams.worker.overlap import overlapped


class Trace:
    """What ran when: ``("prepare", n)`` on its start, ``("handle", n)`` on its
    start and ``("handled", n)`` once done; each handle waits for its gate."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.gates: dict[int, asyncio.Event] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self._marks: dict[tuple[str, int], asyncio.Event] = {}

    def note(self, kind: str, group: int) -> None:
        self.events.append((kind, group))
        self._marks.setdefault((kind, group), asyncio.Event()).set()

    async def reached(self, kind: str, group: int) -> None:
        await asyncio.wait_for(self._marks.setdefault((kind, group), asyncio.Event()).wait(), 5)

    async def prepare(self, group: int) -> str:
        self.note("prepare", group)
        return f"decoded {group}"

    async def handle(self, group: int, ahead: str) -> None:
        assert ahead == f"decoded {group}"
        self.note("handle", group)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gates.setdefault(group, asyncio.Event()).wait()
        finally:
            self.in_flight -= 1
        self.note("handled", group)

    def release(self, group: int) -> None:
        self.gates.setdefault(group, asyncio.Event()).set()


async def groups_of(n: int) -> AsyncIterator[int]:
    for group in range(n):
        yield group


async def test_the_next_group_is_decoded_while_the_current_one_is_stored() -> None:
    trace = Trace()
    run = asyncio.ensure_future(overlapped(groups_of(3), trace.prepare, trace.handle, lambda: True))
    await trace.reached("prepare", 1)
    await trace.reached("handle", 0)
    assert ("handled", 0) not in trace.events  # group 1 decoded while group 0 is stored
    assert ("handle", 1) not in trace.events  # stores one at a time
    for group in range(3):
        trace.release(group)
    await asyncio.wait_for(run, 5)
    handled = [group for kind, group in trace.events if kind == "handled"]
    assert handled == [0, 1, 2] and trace.most_in_flight == 1
    starts = [(kind, group) for kind, group in trace.events if kind == "handle"]
    assert starts == [("handle", 0), ("handle", 1), ("handle", 2)]
    assert trace.events.index(("handled", 0)) < trace.events.index(("handle", 1))


async def test_a_lone_group_is_handled_before_the_agent_goes_back_to_its_stream() -> None:
    """Nothing waiting: no overlap, nothing left in flight while the stream is idle."""
    trace = Trace()
    taken: list[int] = []

    async def slow_stream() -> AsyncIterator[int]:
        for group in range(2):
            taken.append(group)
            yield group

    run = asyncio.ensure_future(
        overlapped(slow_stream(), trace.prepare, trace.handle, lambda: False)
    )
    await trace.reached("handle", 0)
    assert taken == [0]  # the stream is not asked for more until group 0 is done
    trace.release(0)
    trace.release(1)
    await asyncio.wait_for(run, 5)
    assert taken == [0, 1]


async def test_a_failed_store_fails_the_loop_and_the_next_group_is_not_stored() -> None:
    trace = Trace()

    async def handle(group: int, ahead: str) -> None:
        if group == 0:
            raise RuntimeError("store broke")
        await trace.handle(group, ahead)

    with pytest.raises(RuntimeError, match="store broke"):
        await asyncio.wait_for(overlapped(groups_of(3), trace.prepare, handle, lambda: True), 5)
    assert ("handle", 1) not in trace.events


async def test_the_last_group_in_flight_is_awaited_when_the_stream_ends() -> None:
    trace = Trace()
    run = asyncio.ensure_future(overlapped(groups_of(1), trace.prepare, trace.handle, lambda: True))
    await trace.reached("handle", 0)
    assert not run.done()
    trace.release(0)
    await asyncio.wait_for(run, 5)
    assert trace.events[-1] == ("handled", 0)


async def test_cancelling_the_loop_cancels_the_store_in_flight() -> None:
    """A worker stopping: the group in flight is not acked, its records read again."""
    trace = Trace()
    never = asyncio.Event()

    async def stream() -> AsyncIterator[int]:
        yield 0
        yield 1
        await never.wait()
        yield 2

    run = asyncio.ensure_future(overlapped(stream(), trace.prepare, trace.handle, lambda: True))
    trace.release(0)
    await trace.reached("handle", 1)
    assert trace.in_flight == 1
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert trace.in_flight == 0 and ("handled", 1) not in trace.events
