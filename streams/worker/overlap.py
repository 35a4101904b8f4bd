"""Take and decode the next group while the current one is being stored.

Under a backlog a group's store is a PostgreSQL transaction of 20-40 ms on
this class of machine, and the accounting agent had nothing to do while it
waited; taking the next group from Faust's queue and decoding it (~40 µs an
event) then ran after it, one after the other (docs/performance.md section 2).
Here they overlap, and nothing else changes: stores still run one at a time,
in the order the groups were taken, so locks, arrival numbers, counts and acks
are what they were. A group is handed to its store only once the one before
it has returned.

The overlap is only taken when more events are already waiting: a lone group
is handled before the agent goes back to its stream, so nothing is ever left
in flight while the stream is idle, and a failure surfaces in the agent as
before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import TypeVar

Group = TypeVar("Group")
Ahead = TypeVar("Ahead")


async def overlapped(
    groups: AsyncIterable[Group],
    prepare: Callable[[Group], Awaitable[Ahead]],
    handle: Callable[[Group, Ahead], Awaitable[None]],
    more_waiting: Callable[[], bool],
) -> None:
    """``handle(group, prepare(group))`` for each group in order; the next group's
    ``prepare`` runs while a group's ``handle`` is in flight when ``more_waiting``.

    A ``handle`` that raises makes this raise, at the latest when the next group
    is ready; cancelled, this cancels the ``handle`` in flight.
    """
    in_flight: asyncio.Future[None] | None = None
    try:
        async for group in groups:
            ahead = await prepare(group)
            if in_flight is not None:
                await in_flight
                in_flight = None
            task = asyncio.ensure_future(handle(group, ahead))
            if more_waiting():
                in_flight = task
            else:
                await task
        if in_flight is not None:
            await in_flight
    finally:
        if in_flight is not None and not in_flight.done():
            in_flight.cancel()
            await asyncio.wait([in_flight])  # its end, without raising what it raised
