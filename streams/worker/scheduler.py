"""Running compactions concurrently without ever acking ahead of unfinished work.

A slow LLM call must not stall its partition or other conversations, so
compaction commands run as tasks: at most ``max_concurrent`` at once across
conversations, the slots shared by tenant (``core.fair_slots``), strictly one
at a time per conversation (a second command for
a conversation waits for the first), fewer at once while messages are stored
late (``streams.worker.pacer``). Offsets are committed by acking, and an
ack is only sent when the command and every earlier command of the same
partition are finished; so after a crash every unfinished command is
delivered again. Faust's own out-of-order ack handling is not relied on.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from core.domain.pace import PaceRule
from core.domain.tenancy import tenant_of
from core.fair_slots import FairSlots
from streams.logs import log_context

log = logging.getLogger("compactor.scheduler")

Token = TypeVar("Token")


@dataclass
class _Ticket(Generic[Token]):
    offset: int
    token: Token
    done: bool = False
    # The same record delivered again (a seek back read it twice): acked with it.
    again: list[Token] = field(default_factory=list)


class OrderedAcker(Generic[Token]):
    """Acks one partition's records in offset order, whatever order they finish in.

    A seek back (a gap or a partition head read again, ``streams.kafka.gap_reread``)
    delivers records again: one still pending is not run twice, its new delivery
    is acked when the first finishes (acking it sooner would let a commit pass a
    record still being processed); one not pending takes its place in the order
    (a record delivered for the first time, or one done before: run again, as a
    redelivery after a restart would be)."""

    def __init__(self, ack: Callable[[Token], Awaitable[None]]) -> None:
        self._ack = ack
        self._pending: deque[_Ticket[Token]] = deque()
        self._closed = False

    def track(self, offset: int, token: Token) -> _Ticket[Token] | None:
        """The record's ticket; ``None`` when it is pending already (nothing to run)."""
        if self._pending and offset <= self._pending[-1].offset:
            for ticket in self._pending:
                if ticket.offset == offset:
                    ticket.again.append(token)
                    return None
            ticket = _Ticket(offset, token)
            index = next(i for i, t in enumerate(self._pending) if t.offset > offset)
            self._pending.insert(index, ticket)
            return ticket
        ticket = _Ticket(offset, token)
        self._pending.append(ticket)
        return ticket

    async def finish(self, ticket: _Ticket[Token]) -> None:
        ticket.done = True
        while self._pending and self._pending[0].done and not self._closed:
            head = self._pending.popleft()
            for token in (head.token, *head.again):
                await self._ack(token)

    def close(self) -> None:
        """The partition was revoked: its new owner will redo whatever is unacked."""
        self._closed = True
        self._pending.clear()

    @property
    def unacked(self) -> int:
        return len(self._pending)


@dataclass
class _Conversation:
    tail: asyncio.Task[None] | None = None
    queued: int = 0


@dataclass
class SchedulerStats:
    in_flight: int = 0
    peak_in_flight: int = 0
    queued: int = 0
    completed: int = 0
    crashed: int = 0
    conversations: dict[str, _Conversation] = field(default_factory=dict)


class Pacer(Protocol):
    """How many compactions may run now (``streams.worker.pacer.CompactionPacer``)."""

    @property
    def rule(self) -> PaceRule: ...

    def limit(self, wanted: int) -> int: ...

    def when_cut(self, callback: Callable[[], None]) -> None: ...


class CompactionScheduler(Generic[Token]):
    """Runs ``work(item)`` per command with bounded, per-conversation-serial concurrency.

    ``submit`` returns once the command is scheduled; it blocks (backpressure)
    while ``max_pending`` commands are scheduled but unfinished, so a backlog
    stays in Kafka rather than in memory.
    """

    def __init__(
        self,
        ack: Callable[[Token], Awaitable[None]],
        *,
        max_concurrent: int,
        max_pending: int | None = None,
        fair_share: bool = True,
        tenant_weights: Mapping[str, float] | None = None,
        pacer: Pacer | None = None,
        urgency: Callable[[str], float] = lambda _: 0.0,
        urgent_at: float = math.inf,
    ) -> None:
        """``pacer``: the slots in use at once follow its limit, up to ``max_concurrent``;
        ``urgency``: a conversation's claim to the next free slot of its tenant (its
        token total: the furthest over budget first); ``urgent_at``: from that urgency
        on, a compaction does not wait for the pace."""
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        self._ack = ack
        # Shared by tenant like the provider guard's call slots: a tenant's burst
        # queued here must not hold the other tenants' commands behind it.
        # A tenant holds at most three quarters of them: see FairSlots, max_per_tenant.
        self._slots_max = max_concurrent
        self._slots = FairSlots(
            max_concurrent,
            weights=tenant_weights,
            fair=fair_share,
            max_per_tenant=max(1, max_concurrent - max_concurrent // 4),
        )
        self._room = asyncio.Semaphore(max_pending or max_concurrent * 8)
        self._ackers: dict[Hashable, OrderedAcker[Token]] = {}
        self._conversations: dict[str, _Conversation] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = SchedulerStats(conversations=self._conversations)
        self._pacer = pacer
        self._urgency = urgency
        self._urgent_at = urgent_at
        self._beside = 0  # urgent compactions running beside the pace
        self._tick: asyncio.TimerHandle | None = None
        if pacer is not None:
            self._slots.resize(min(max_concurrent, pacer.limit(0)))
            pacer.when_cut(self._repace)

    def _acker(self, partition: Hashable) -> OrderedAcker[Token]:
        acker = self._ackers.get(partition)
        if acker is None:
            acker = self._ackers[partition] = OrderedAcker(self._ack)
        return acker

    async def submit(
        self,
        *,
        partition: Hashable,
        offset: int,
        token: Token,
        conversation_id: str | None,
        work: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """Schedule ``work`` for the record at ``partition``/``offset``.

        ``work=None`` (an undecodable record, already dead-lettered) only
        takes its place in the ack order.
        """
        acker = self._acker(partition)
        ticket = acker.track(offset, token)
        if ticket is None:
            return  # delivered again while pending: acked when the first delivery is
        if work is None or conversation_id is None:
            await acker.finish(ticket)
            return
        await self._room.acquire()
        conversation = self._conversations.setdefault(conversation_id, _Conversation())
        previous = conversation.tail
        conversation.queued += 1
        self.stats.queued += 1
        task = asyncio.ensure_future(
            self._run(conversation_id, conversation, previous, work, partition, acker, ticket)
        )
        conversation.tail = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        conversation_id: str,
        conversation: _Conversation,
        previous: asyncio.Task[None] | None,
        work: Callable[[], Awaitable[None]],
        partition: Hashable,
        acker: OrderedAcker[Token],
        ticket: _Ticket[Token],
    ) -> None:
        """After the conversation's previous command, within a slot; then the ack."""
        try:
            if previous is not None:
                await asyncio.wait([previous])
            self._repace(arriving=1)
            async with self._slot(conversation_id):
                await self._compact(conversation_id, partition, work)
            self._repace()
            await acker.finish(ticket)
        finally:
            conversation.queued -= 1
            if conversation.tail is asyncio.current_task() and conversation.queued == 0:
                del self._conversations[conversation_id]
            self._room.release()

    @asynccontextmanager
    async def _slot(self, conversation_id: str) -> AsyncIterator[None]:
        """A paced slot, the most urgent of its tenant's waiters first; a conversation
        at ``urgent_at`` tokens or more (over its model's window: every turn sent
        uncompacted fails) runs beside the pace, up to ``max_concurrent`` in all."""
        urgency = self._urgency(conversation_id)
        if urgency >= self._urgent_at and self._slots.in_use + self._beside < self._slots_max:
            self._beside += 1
            try:
                yield
            finally:
                self._beside -= 1
            return
        async with self._slots.hold(tenant_of(conversation_id), urgency):
            yield

    def _repace(self, arriving: int = 0) -> None:
        """Slots to the pacer's limit; while some wait, again each round (it may grow)."""
        if self._pacer is None:
            return
        wanted = self._slots.in_use + self._slots.waiting + arriving
        limit = min(self._slots_max, self._pacer.limit(wanted))
        if limit != self._slots.capacity:
            self._slots.resize(limit)
        if self._tick is None and wanted > self._slots.capacity:
            self._tick = asyncio.get_running_loop().call_later(
                self._pacer.rule.round_seconds, self._next_round
            )

    def _next_round(self) -> None:
        self._tick = None
        self._repace()

    async def _compact(
        self, conversation_id: str, partition: Hashable, work: Callable[[], Awaitable[None]]
    ) -> None:
        self.stats.queued -= 1
        self.stats.in_flight += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        try:
            with log_context(conversation_id=conversation_id, partition=partition):
                await work()
            self.stats.completed += 1
        except asyncio.CancelledError:
            if _asked_to_stop():
                raise
            # Not this task's cancellation: something it awaited was cancelled
            # under it. Re-raised, the command would stay unacked and every later
            # command of its partition wait behind it for good: a crash instead.
            self.stats.crashed += 1
            log.exception("compaction of %s crashed: cancelled under it", conversation_id)
        except Exception:
            # Acked anyway, or one poisonous command would hold its
            # partition forever; reconciliation sends it again.
            self.stats.crashed += 1
            log.exception("compaction of %s crashed", conversation_id)
        finally:
            self.stats.in_flight -= 1

    def revoke(self, partitions: set[Hashable]) -> None:
        for partition in partitions:
            acker = self._ackers.pop(partition, None)
            if acker is not None:
                acker.close()

    async def drain(self) -> None:
        """Wait for everything scheduled so far (shutdown, tests)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def drain_within(self, seconds: float) -> int:
        """``drain`` for at most ``seconds``, then cancel what is left (shutdown).

        Unfinished compactions are not acked, so they are delivered again (or
        re-sent by reconciliation) and, being idempotent, redone. The number of
        commands abandoned (running or waiting), 0 if all finished.
        """
        try:
            await asyncio.wait_for(self.drain(), timeout=seconds)
        except TimeoutError:
            abandoned = len(self._tasks)
            for task in list(self._tasks):
                task.cancel()
            # A task that swallows its cancellation must not hold the shutdown.
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=1.0)
            return abandoned
        return 0

    async def cancel(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _asked_to_stop() -> bool:
    """Was the running task itself cancelled (shutdown, ``cancel``)? A
    ``CancelledError`` can also come out of an awaited future that someone else
    cancelled (a send the producer dropped, a shared wait that timed out for
    another waiter) while this task goes on."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
