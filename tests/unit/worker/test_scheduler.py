from __future__ import annotations

import asyncio
import random

import pytest

from streams.worker.scheduler import CompactionScheduler, OrderedAcker

pytestmark = pytest.mark.unit


class Acks:
    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def __call__(self, token: str) -> None:
        self.tokens.append(token)


async def test_acks_follow_offset_order_whatever_order_work_finishes() -> None:
    acks = Acks()
    acker: OrderedAcker[str] = OrderedAcker(acks)
    tickets = [acker.track(offset, f"t{offset}") for offset in (10, 11, 12)]
    await acker.finish(tickets[2])
    await acker.finish(tickets[1])
    assert acks.tokens == []  # 10 still running: nothing may be committed
    await acker.finish(tickets[0])
    assert acks.tokens == ["t10", "t11", "t12"]


async def test_a_record_delivered_again_is_not_run_twice_and_is_acked_with_the_first() -> None:
    """A seek back (a gap read again) delivers pending records a second time:
    before, the processor agent crashed ("offset 23 is not after 23")."""
    acks = Acks()
    acker: OrderedAcker[str] = OrderedAcker(acks)
    first = [acker.track(offset, f"t{offset}") for offset in (20, 23)]
    assert acker.track(23, "t23 again") is None  # pending: nothing to run
    missed = acker.track(21, "t21")  # delivered for the first time by the re-read
    assert missed is not None
    await acker.finish(first[1])
    await acker.finish(first[0])
    assert acks.tokens == ["t20"]  # 21 still running: 23 (and its copy) wait
    await acker.finish(missed)
    assert acks.tokens == ["t20", "t21", "t23", "t23 again"]


async def test_one_compaction_at_a_time_per_conversation_and_bounded_overall() -> None:
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=2)
    running: dict[str, int] = {}
    peak_total = 0
    order: list[str] = []

    def job(conversation: str, name: str, seconds: float):  # type: ignore[no-untyped-def]
        async def work() -> None:
            nonlocal peak_total
            running[conversation] = running.get(conversation, 0) + 1
            assert running[conversation] == 1, "two compactions of one conversation at once"
            peak_total = max(peak_total, sum(running.values()))
            await asyncio.sleep(seconds)
            order.append(name)
            running[conversation] -= 1

        return work

    plan = [
        ("a", "a1", 0.05),
        ("b", "b1", 0.01),
        ("a", "a2", 0.0),
        ("c", "c1", 0.01),
        ("d", "d1", 0.0),
    ]
    for offset, (conversation, name, seconds) in enumerate(plan):
        await scheduler.submit(
            partition=0,
            offset=offset,
            token=name,
            conversation_id=conversation,
            work=job(conversation, name, seconds),
        )
    await scheduler.drain()
    assert peak_total <= 2
    assert order.index("a1") < order.index("a2")
    assert order.index("b1") < order.index("a1")  # b did not wait for slow a
    assert acks.tokens == ["a1", "b1", "a2", "c1", "d1"]
    assert scheduler.stats.peak_in_flight == 2
    assert scheduler.stats.completed == 5


async def test_slow_partition_does_not_hold_back_acks_of_another() -> None:
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=4)
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()

    async def fast() -> None:
        return None

    await scheduler.submit(partition=0, offset=0, token="p0", conversation_id="a", work=slow)
    await scheduler.submit(partition=1, offset=0, token="p1", conversation_id="b", work=fast)
    await asyncio.sleep(0.01)
    assert acks.tokens == ["p1"]
    gate.set()
    await scheduler.drain()
    assert acks.tokens == ["p1", "p0"]


async def test_undecodable_record_keeps_its_place_in_ack_order() -> None:
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=1)
    gate = asyncio.Event()

    async def wait() -> None:
        await gate.wait()

    await scheduler.submit(partition=0, offset=0, token="work", conversation_id="a", work=wait)
    await scheduler.submit(partition=0, offset=1, token="junk", conversation_id=None, work=None)
    assert acks.tokens == []
    gate.set()
    await scheduler.drain()
    assert acks.tokens == ["work", "junk"]


async def test_crashing_work_is_logged_counted_and_acked() -> None:
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=1)

    async def boom() -> None:
        raise RuntimeError("database went away")

    await scheduler.submit(partition=0, offset=0, token="x", conversation_id="a", work=boom)
    await scheduler.drain()
    assert scheduler.stats.crashed == 1 and acks.tokens == ["x"]


async def test_backpressure_blocks_submit_when_too_much_is_pending() -> None:
    scheduler: CompactionScheduler[str] = CompactionScheduler(
        Acks(), max_concurrent=1, max_pending=2
    )
    gate = asyncio.Event()

    async def wait() -> None:
        await gate.wait()

    await scheduler.submit(partition=0, offset=0, token="1", conversation_id="a", work=wait)
    await scheduler.submit(partition=0, offset=1, token="2", conversation_id="b", work=wait)
    third = asyncio.ensure_future(
        scheduler.submit(partition=0, offset=2, token="3", conversation_id="c", work=wait)
    )
    await asyncio.sleep(0.02)
    assert not third.done()
    gate.set()
    await third
    await scheduler.drain()


async def test_revoked_partition_acks_nothing_more() -> None:
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=2)
    gate = asyncio.Event()

    async def wait() -> None:
        await gate.wait()

    await scheduler.submit(partition=3, offset=0, token="x", conversation_id="a", work=wait)
    scheduler.revoke({3})
    gate.set()
    await scheduler.drain()
    assert acks.tokens == []


async def test_random_interleavings_ack_every_offset_once_in_order() -> None:
    rng = random.Random(7)
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=3)

    def work(seconds: float):  # type: ignore[no-untyped-def]
        async def run() -> None:
            await asyncio.sleep(seconds)

        return run

    for offset in range(60):
        await scheduler.submit(
            partition=0,
            offset=offset,
            token=str(offset),
            conversation_id=f"c{rng.randrange(6)}",
            work=work(rng.random() / 200),
        )
    await scheduler.drain()
    assert acks.tokens == [str(i) for i in range(60)]


async def test_drain_within_abandons_a_never_finishing_compaction_within_the_grace() -> None:
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=2)

    async def forever() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        return None

    await scheduler.submit(partition=0, offset=1, token="t1", conversation_id="a", work=quick)
    await scheduler.submit(partition=1, offset=1, token="t2", conversation_id="b", work=forever)
    await scheduler.submit(partition=1, offset=2, token="t3", conversation_id="b", work=quick)
    loop = asyncio.get_running_loop()
    started = loop.time()
    abandoned = await scheduler.drain_within(0.2)
    assert loop.time() - started < 1.0
    assert abandoned == 2  # the stuck one and the one queued behind it
    assert acks.tokens == ["t1"]  # abandoned commands stay unacked: redelivered
    assert await scheduler.drain_within(0.2) == 0


async def test_compaction_log_lines_carry_conversation_and_partition() -> None:
    import logging

    from streams.logs import ContextFields

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    handler.addFilter(ContextFields())
    logger = logging.getLogger("test.scheduler.context")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        scheduler: CompactionScheduler[str] = CompactionScheduler(Acks(), max_concurrent=1)

        async def work() -> None:
            logger.info("inside")

        await scheduler.submit(partition=3, offset=1, token="t", conversation_id="c-9", work=work)
        await scheduler.drain()
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = seen
    assert (inside.conversation_id, inside.partition) == ("c-9", 3)  # type: ignore[attr-defined]
    assert not hasattr(outside, "conversation_id")


async def test_a_cancellation_from_inside_the_work_is_a_crash_not_a_stuck_partition() -> None:
    """A future the compaction awaits is cancelled by someone else (the task
    itself is not): the command is counted as crashed and acked, and the
    commands after it on the partition are acked too."""
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=2)
    dropped: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def awaits_a_dropped_send() -> None:
        await dropped

    async def fine() -> None:
        return None

    await scheduler.submit(
        partition=0, offset=1, token="t1", conversation_id="a", work=awaits_a_dropped_send
    )
    await scheduler.submit(partition=0, offset=2, token="t2", conversation_id="b", work=fine)
    await asyncio.sleep(0)  # the first compaction is now waiting on the send
    dropped.cancel()
    await asyncio.wait_for(scheduler.drain(), timeout=5)
    assert acks.tokens == ["t1", "t2"]
    assert scheduler.stats.crashed == 1


async def test_cancelling_the_compaction_task_itself_still_abandons_it() -> None:
    acks = Acks()
    scheduler: CompactionScheduler[str] = CompactionScheduler(acks, max_concurrent=1)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def hangs() -> None:
        await never

    await scheduler.submit(partition=0, offset=1, token="t1", conversation_id="a", work=hangs)
    await asyncio.sleep(0)
    assert await scheduler.drain_within(0.05) == 1
    assert acks.tokens == []  # abandoned at shutdown: redone by the next owner
    assert scheduler.stats.crashed == 0
