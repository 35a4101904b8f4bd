"""The active-partition snapshot patch: aiokafka never sees Faust's live set.

Why: Faust handed aiokafka the set it empties on a rebalance, and to aiokafka
an empty set means "every partition": a fetch in flight then swallowed the
changelog records table recovery was waiting for, and the worker stayed in
recovery (reproduced in 6 of 6 runs with the window widened, 0 of 6 patched).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import Consumer, ThreadDelegateConsumer
from faust.types import TP
from mode import Service
from mode.utils.locks import Event

from streams.kafka import faust_patches

pytestmark = pytest.mark.unit


class RecordingThread:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def getmany(self, active: Any, timeout: float) -> dict[TP, list[Any]]:
        self.seen.append(active)
        return {}


async def test_aiokafka_gets_a_copy_and_nothing_is_fetched_for_an_empty_set() -> None:
    assert faust_patches.snapshot_active_partitions()
    assert faust_patches.snapshot_active_partitions()  # applying twice is a no-op
    thread = RecordingThread()
    consumer = SimpleNamespace(_thread=thread)
    live = {TP("t", 0)}
    await ThreadDelegateConsumer._getmany(consumer, live, 0.01)  # type: ignore[arg-type]
    (seen,) = thread.seen
    assert seen == live and seen is not live  # Faust may empty ``live``: not aiokafka's copy
    assert await ThreadDelegateConsumer._getmany(consumer, set(), 0.01) == {}  # type: ignore[arg-type]
    assert len(thread.seen) == 1  # an empty set would have meant "every partition"
    await ThreadDelegateConsumer._getmany(consumer, None, 0.01)  # type: ignore[arg-type]
    assert thread.seen[-1] is None  # None (no flow control) passes through


def test_aiokafka_waits_at_most_10_ms_behind_an_undrained_partition() -> None:
    """A command waited ~100 ms behind another partition's buffered records
    (P2 p95 140 ms with aiokafka's default, 55 ms with this, same run shape)."""
    from aiokafka.consumer.fetcher import Fetcher

    faust_patches.apply()
    faust_patches.apply()  # idempotent
    created: dict[str, Any] = {}

    def fake_init(self: Any, *args: Any, **kwargs: Any) -> None:
        created.update(kwargs)

    wrapped = Fetcher.__init__
    assert getattr(wrapped, faust_patches._MARK, False)
    try:
        Fetcher.__init__ = fake_init  # type: ignore[method-assign]
        faust_patches.shorter_prefetch_backoff()
        Fetcher(client=None, subscriptions=None)  # type: ignore[arg-type]
        assert created["prefetch_backoff"] == faust_patches.PREFETCH_BACKOFF_SECONDS == 0.01
        created.clear()
        Fetcher(client=None, subscriptions=None, prefetch_backoff=0.5)  # type: ignore[arg-type]
        assert created["prefetch_backoff"] == 0.5  # an explicit value wins
        # Faust's 1,500 ms: a fetch of idle partitions held new messages back that long.
        Fetcher(client=None, subscriptions=None, fetch_max_wait_ms=1500)  # type: ignore[arg-type]
        assert created["fetch_max_wait_ms"] == faust_patches.FETCH_MAX_WAIT_MS == 100
        Fetcher(client=None, subscriptions=None, fetch_max_wait_ms=20)  # type: ignore[arg-type]
        assert created["fetch_max_wait_ms"] == 20  # a shorter wait stays
    finally:
        Fetcher.__init__ = wrapped  # type: ignore[method-assign]


class FetchLoop(Service):
    """What ``Consumer.wait_first`` needs of the consumer: a mode service and its flow event."""

    def __init__(self) -> None:
        super().__init__()
        self.suspend_flow = Event()


async def delivered_in(consumer: FetchLoop, delivery: Any) -> Any:
    faust_patches.deliver_without_tasks()
    return await Consumer.wait_first(consumer, delivery, consumer.suspend_flow.wait())  # type: ignore[arg-type]


async def test_a_delivery_that_does_not_wait_runs_in_the_fetch_loop_itself() -> None:
    """Faust ran every delivery in a task of its own (two or three loop turns a
    record); a fetch of hundreds of records then reached the agent ~11 at a time."""
    consumer = FetchLoop()
    tasks: list[asyncio.Task[Any] | None] = []

    async def callback() -> str:
        tasks.append(asyncio.current_task())
        return "delivered"

    results = await delivered_in(consumer, callback())
    assert tasks == [asyncio.current_task()]  # no task of its own
    assert results.results == ["delivered"] and not results.stopped


async def test_a_delivery_that_waits_is_still_interrupted_by_a_rebalance() -> None:
    consumer = FetchLoop()
    queue_has_room, decoded = asyncio.Event(), asyncio.Event()
    steps: list[str] = []

    async def callback() -> None:
        steps.append("decoded")
        decoded.set()
        try:
            await queue_has_room.wait()  # a stream's queue is full
            steps.append("queued")
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    waiting = asyncio.ensure_future(delivered_in(consumer, callback()))
    await decoded.wait()
    consumer.suspend_flow.set()  # the rebalance: Faust's fetch loop moves on
    results = await asyncio.wait_for(waiting, 5)
    assert len(results.done) == 1 and not results.stopped  # the flow's wait, not the delivery
    await asyncio.sleep(0)
    assert steps == ["decoded", "cancelled"]


async def test_a_delivery_that_waits_completes_through_the_rest_of_it() -> None:
    consumer = FetchLoop()
    queue_has_room = asyncio.Event()

    async def callback() -> str:
        await queue_has_room.wait()
        await asyncio.sleep(0)
        return "queued"

    waiting = asyncio.ensure_future(delivered_in(consumer, callback()))
    await asyncio.sleep(0)
    queue_has_room.set()
    results = await asyncio.wait_for(waiting, 5)
    assert results.results == ["queued"]


def _consumer_state(
    committed: int | None, acked: list[int], delivered: tuple[int, ...] = ()
) -> Any:
    """A consumer's commit bookkeeping; ``delivered``: records handed to the
    streams and not acked yet (Faust's ``_unacked_messages``)."""
    from collections import defaultdict

    from intervaltree import IntervalTree

    tp = TP("messages", 0)
    state = SimpleNamespace(
        _acked=defaultdict(list, {tp: list(acked)}),
        _acked_index=defaultdict(set, {tp: set(acked)}),
        _committed_offset=defaultdict(lambda: None, {tp: committed}),
        _gap=defaultdict(IntervalTree),
        _unacked_messages=[SimpleNamespace(tp=tp, offset=o, acked=False) for o in delivered],
    )
    return state, tp


def test_no_commit_passes_a_delivered_unacked_record_at_the_committed_offset() -> None:
    """Issue 29: committed 64 (the next record to read), 64 delivered and not acked,
    65 and 66 acked: Faust committed 67 (its head-gap test was ``min(acked) - 64 >
    1``) and record 64 was never read again, one message lost (the upgrade test's
    "offsets ahead")."""
    assert faust_patches.no_commit_past_an_unacked_head()
    assert faust_patches.no_commit_past_an_unacked_head()  # applying twice is a no-op
    state, tp = _consumer_state(64, [65, 66], delivered=(64,))
    assert Consumer._new_offset(state, tp) is None
    (record,) = state._unacked_messages
    record.acked = True
    state._acked[tp].insert(0, 64)
    state._acked_index[tp].add(64)
    assert Consumer._new_offset(state, tp) == 67


def test_an_offset_never_delivered_at_the_head_still_commits() -> None:
    """A transaction's commit marker at the committed offset is never delivered:
    refusing to commit past it would stall the partition after every restart."""
    assert faust_patches.no_commit_past_an_unacked_head()
    state, tp = _consumer_state(64, [65, 66])
    assert Consumer._new_offset(state, tp) == 67
    state, tp = _consumer_state(64, [66, 67])
    state._gap[tp].addi(64, 66)  # 64 and 65 never came (compacted away)
    assert Consumer._new_offset(state, tp) == 68
    state, tp = _consumer_state(64, [64, 65])
    assert Consumer._new_offset(state, tp) == 66  # the ordinary case


@pytest.mark.parametrize("committed", [None, 0])
def test_a_fresh_group_never_commits_past_its_first_record_still_in_process(
    committed: int | None,
) -> None:
    """Issue 29, in a clean-clone CI run: nothing committed yet, record 0
    delivered and not acked, 1..9 acked: Faust committed 10 (its head test is
    ``if committed:``, false for ``None`` and for ``0``) and record 0 of three
    partitions was lost."""
    assert faust_patches.no_commit_past_an_unacked_head()
    state, tp = _consumer_state(committed, list(range(1, 10)), delivered=(0,))
    assert Consumer._new_offset(state, tp) is None
    (record,) = state._unacked_messages
    record.acked = True
    state._acked[tp].insert(0, 0)
    state._acked_index[tp].add(0)
    assert Consumer._new_offset(state, tp) == 10


def test_a_stale_unacked_record_below_the_committed_offset_does_not_stall_commits() -> None:
    """Faust never acks a record under the committed offset (a redelivery after a
    seek): it stays in ``_unacked_messages`` and must not hold the partition."""
    assert faust_patches.no_commit_past_an_unacked_head()
    state, tp = _consumer_state(64, [64, 65], delivered=(30,))
    assert Consumer._new_offset(state, tp) == 66


def test_a_read_routed_without_the_topics_metadata_is_a_503_that_fetches_it() -> None:
    """After a broker kill the producer's metadata lost the messages topic (it
    never sends there): every routed read was a 500 for minutes."""
    from faust.transport.drivers.aiokafka import Producer
    from faust.web.exceptions import ServiceUnavailable

    assert faust_patches.route_after_metadata_loss()
    assert faust_patches.route_after_metadata_loss()  # applying twice is a no-op
    known: dict[str, set[int]] = {}
    asked: list[str] = []

    class Client:
        def __init__(self) -> None:
            self._topics: set[str] = set()

        def add_topic(self, topic: str) -> None:
            asked.append(f"add {topic}")
            self._topics.add(topic)

        def force_metadata_update(self) -> None:
            asked.append("refresh")

    client = Client()
    aio = SimpleNamespace(
        _metadata=SimpleNamespace(partitions_for_topic=known.get),
        client=client,
        _partition=lambda topic, **_: 2,
    )
    producer = SimpleNamespace(_ensure_producer=lambda: aio)
    with pytest.raises(ServiceUnavailable):
        Producer.key_partition(producer, "messages", b"k")  # type: ignore[arg-type]
    with pytest.raises(ServiceUnavailable):
        Producer.key_partition(producer, "messages", b"k")  # type: ignore[arg-type]
    assert asked == ["add messages", "refresh", "add messages"]
    known["messages"] = {0, 1, 2}
    assert Producer.key_partition(producer, "messages", b"k") == TP("messages", 2)  # type: ignore[arg-type]
