"""A fixed number of slots shared fairly by tenants: weighted round robin.

Why: the provider guard's call slots and the scheduler's compaction slots
were FIFO semaphores, so a tenant that put 1,000 conversations over budget at
once queued ahead of every other tenant's ten, which then waited for the
whole burst (issue 18, "fair share"). Here each tenant waiting has its own
queue, and a freed slot goes to the waiting tenant that has had the least
service for its weight (stride scheduling: each grant advances the tenant's
pass by ``1 / weight``; the lowest pass goes next, ties in the order the
tenants started waiting). A tenant alone gets every slot; two tenants with
waiters get them in turns, whatever each has queued.

A tenant that starts waiting joins at the current virtual time (the pass of
the last grant), so a tenant idle for an hour cannot claim an hour's worth of
slots in a row. ``fair=False`` is one FIFO queue, as before (the benchmark's
baseline, and a switch for an operator).

``max_per_tenant`` caps what one tenant may hold even with slots free. The
scheduler uses it: a burst's compactions beyond the provider guard's call
slots only queue inside the guard, and holding every compaction slot as well
would keep a newcomer's commands out of that queue until the burst's first
compactions end, a whole LLM round trip later.

``headroom`` slots are kept from a tenant while another tenant has acquired
one in the last ``active_seconds``: the guard's call slots are not
preemptible, so a tenant that holds them all makes an active neighbour wait a
whole LLM call for the first one to free. Alone (a single-tenant
deployment, or the others quiet for a minute) a tenant gets every slot.

Within a tenant, a waiter with a higher ``priority`` goes first (then in
arrival order): the scheduler gives a compaction its conversation's token
total, so while compactions are paced (``core.domain.pace``) the conversation
furthest over its budget is not queued behind a wave of ones just over it.

asyncio's own ``Semaphore`` would need one per tenant and a picker around
them; a few dozen lines of queues are simpler and say what they do.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

Tenant = str | None


# A waiter: (-priority, arrival, future); a heap of them serves the most
# urgent first, then in arrival order.
_Waiter = tuple[float, int, asyncio.Future[None]]


@dataclass
class _Queue:
    waiters: list[_Waiter] = field(default_factory=list)
    passed: float = 0.0  # virtual time of this tenant's service so far
    joined: int = 0  # tie-break: the order tenants started waiting


class FairSlots:
    """``capacity`` slots; ``acquire(tenant)`` waits its turn, ``release()`` frees one."""

    def __init__(
        self,
        capacity: int,
        *,
        weights: Mapping[str, float] | None = None,
        fair: bool = True,
        default_weight: float = 1.0,
        max_per_tenant: int | None = None,
        headroom: int = 0,
        active_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._cap = capacity if max_per_tenant is None or not fair else max(1, max_per_tenant)
        self._held: dict[Tenant, int] = {}
        self._headroom = min(headroom, capacity - 1) if fair else 0
        self._active_seconds = active_seconds
        self._clock = clock
        self._seen: dict[Tenant, float] = {}  # tenant → when it last acquired
        self.fair = fair
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        self._free = capacity
        self._queues: dict[Tenant, _Queue] = {}
        self._virtual_time = 0.0
        self._joins = 0
        self._arrivals = 0
        self.granted: dict[Tenant, int] = {}  # slots each tenant got (tests, metrics)

    def weight(self, tenant: Tenant) -> float:
        return self._weights.get(tenant, self._default_weight) if tenant else self._default_weight

    @property
    def waiting(self) -> int:
        return sum(len(q.waiters) for q in self._queues.values())

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    async def acquire(self, tenant: Tenant = None, priority: float = 0.0) -> None:
        """A slot for ``tenant``; among its waiters the highest ``priority`` first."""
        key = tenant if self.fair else None
        if self._headroom:
            self._note_active(key)
        if (
            self._free > 0
            and not self._queues
            and self._held.get(key, 0) < self._cap_of(key, self._active())
        ):
            self._take(key)
            self._count(tenant)
            return
        queue = self._queues.get(key)
        if queue is None:
            self._joins += 1
            queue = self._queues[key] = _Queue(passed=self._virtual_time, joined=self._joins)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._arrivals += 1
        heapq.heappush(queue.waiters, (-priority, self._arrivals, waiter))
        self._grant()  # free slots the tenants ahead may not take (their cap): ours?
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(tenant)  # granted as it was cancelled: hand the slot on
            else:
                self._forget(key, waiter)
            raise
        self._count(tenant)

    def release(self, tenant: Tenant = None) -> None:
        key = tenant if self.fair else None
        self._free += 1
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)
        self._grant()

    @asynccontextmanager
    async def hold(self, tenant: Tenant = None, priority: float = 0.0) -> AsyncIterator[None]:
        await self.acquire(tenant, priority)
        try:
            yield
        finally:
            self.release(tenant)

    def resize(self, capacity: int) -> None:
        """Change the number of slots; held slots above a smaller capacity are kept
        by their holders until released (``streams.worker.pacer`` moves it)."""
        capacity = max(1, capacity)
        self._free += capacity - self.capacity
        self.capacity = capacity
        self._grant()

    def _take(self, key: Tenant) -> None:
        self._free -= 1
        self._held[key] = self._held.get(key, 0) + 1

    def _grant(self) -> None:
        while self._free > 0 and self._queues:
            chosen = self._next_tenant()
            if chosen is None:
                return  # every waiting tenant holds its cap
            (key,) = chosen
            queue = self._queues[key]
            waiter = heapq.heappop(queue.waiters)[2]
            if not queue.waiters:
                del self._queues[key]
            if waiter.done():  # cancelled while queued
                continue
            self._take(key)
            self._virtual_time = queue.passed
            queue.passed += 1.0 / self.weight(key)
            waiter.set_result(None)

    def _next_tenant(self) -> tuple[Tenant] | None:
        """The waiting tenant under its cap with the least service for its weight
        (then the earliest to start waiting)."""
        active = self._active()
        eligible = [
            (queue.passed, queue.joined, key)
            for key, queue in self._queues.items()
            if self._held.get(key, 0) < self._cap_of(key, active)
        ]
        return (min(eligible, key=lambda item: item[:2])[2],) if eligible else None

    def _forget(self, key: Tenant, waiter: asyncio.Future[None]) -> None:
        queue = self._queues.get(key)
        if queue is None:
            return
        index = next((n for n, item in enumerate(queue.waiters) if item[2] is waiter), None)
        if index is None:
            return
        queue.waiters.pop(index)
        heapq.heapify(queue.waiters)
        if not queue.waiters:
            del self._queues[key]

    def _cap_of(self, key: Tenant, active: set[Tenant]) -> int:
        """What ``key`` may hold: less the headroom while another tenant is active."""
        if not self._headroom or not (active - {key}):
            return self._cap
        return max(1, min(self._cap, self.capacity - self._headroom))

    def _note_active(self, key: Tenant) -> None:
        now = self._clock()
        self._seen[key] = now
        if len(self._seen) > 1000:  # forget the quiet ones
            horizon = now - self._active_seconds
            self._seen = {t: at for t, at in self._seen.items() if at >= horizon}

    def _active(self) -> set[Tenant]:
        """The tenants that acquired a slot in the last ``active_seconds``."""
        if not self._headroom:
            return set()
        horizon = self._clock() - self._active_seconds
        return {t for t, at in self._seen.items() if at >= horizon}

    def _count(self, tenant: Tenant) -> None:
        self.granted[tenant] = self.granted.get(tenant, 0) + 1
