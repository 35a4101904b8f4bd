"""Work-arounds for faust-streaming bugs, each applied once at app build.

Faust hands aiokafka its *live* set of active partitions, which aiokafka reads
on its own thread. A rebalance empties that set (Faust pauses every
partition), and to aiokafka an empty set means "all partitions": a fetch
already in flight then drains a changelog partition that recovery has just
sought to its start, and Faust throws the batch away (the flow is stopped).
Nothing seeks the changelog back (its offsets are never committed), so table
recovery waits forever: "No event received for active tp ... since recovery
start". Seen in about 1 of 20 rebalances of the end-to-end tests; with the
window widened by 0.3 s, 6 of 6, and 0 of 6 with this patch. Present in
faust-streaming 0.15.3, the newest release when this was written.

pyproject.toml pins faust-streaming to ``TESTED_WITH``: each patch replaces a
private method, so a new release must be read before the pin moves (the
checklist is in docs/operations.md, "Faust"). Each patch names the upstream
issue it works around, or says that none is known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Generator, Iterable, Mapping
from importlib.metadata import version
from typing import Any

from faust.transport.consumer import ThreadDelegateConsumer

from streams.kafka.gap_reread import delivered_unacked_below, reread_gaps
from streams.kafka.producers import DURABLE_SENDS
from streams.kafka.seeking import seek_before_resuming_streams, seek_uncommitted_partitions_to_start

log = logging.getLogger("compactor.worker")

TESTED_WITH = "0.15.3"
_MARK = "_compactor_snapshot_patch"


def snapshot_active_partitions() -> bool:
    """Give aiokafka a copy of the active set, and no fetch at all when it is empty.

    Upstream issue: none known for this race. faust-streaming's tracker has
    the same symptom from other causes: #597 (open; recovery never ends when
    a changelog partition is empty) and #651 (open; with
    auto.offset.reset=latest, retention deletes changelog segments during
    recovery). Its PR #256 re-seeks to the committed offsets when a fetch
    returns while the flow is stopped, which cannot help a changelog
    partition: its offsets are never committed.

    ``True`` when the patch is (now or already) in place.
    """
    original = ThreadDelegateConsumer._getmany
    if getattr(original, _MARK, False):
        return True

    async def _getmany(self: Any, active_partitions: Any, timeout: float) -> Any:  # noqa: ASYNC109
        if active_partitions is not None:
            active_partitions = set(active_partitions)
            if not active_partitions:
                await asyncio.sleep(timeout)
                return {}
        return await original(self, active_partitions, timeout)

    setattr(_getmany, _MARK, True)
    ThreadDelegateConsumer._getmany = _getmany  # type: ignore[method-assign]
    installed = version("faust-streaming")
    if installed != TESTED_WITH:
        log.warning(
            "faust-streaming %s: the active-partition snapshot patch was written for %s; "
            "check that ThreadDelegateConsumer._getmany still hands aiokafka a live set",
            installed,
            TESTED_WITH,
        )
    return True


# aiokafka skips the next fetch from a broker while any partition it serves
# still holds records the application has not taken, for up to
# ``prefetch_backoff`` (0.1 s). With every topic on one broker, a command or a
# completion then waited ~100 ms behind a partition Faust was slow to drain
# (2 of 15 commands in a traced run of the compaction-latency benchmark).
PREFETCH_BACKOFF_SECONDS = 0.01

# Faust builds aiokafka's consumer with ``fetch_max_wait_ms=1500``. aiokafka
# leaves a partition whose fetched records are not all taken out of the next
# fetch request, and sends a broker one fetch at a time: under steady traffic
# the request in flight asked only for idle partitions (changelogs, control,
# commands), so the broker held it the whole 1.5 s while new messages waited
# behind it. Publish to readable was ~1.5 s at 300 events/s against 46 ms idle
# (docs/performance.md section 10). An idle worker now asks every 100 ms.
FETCH_MAX_WAIT_MS = 100


def shorter_prefetch_backoff() -> bool:
    """Faust builds aiokafka's consumer without this setting, and with a long
    fetch wait: lower both (``PREFETCH_BACKOFF_SECONDS``, ``FETCH_MAX_WAIT_MS``).

    Upstream issue: none known. Not a bug in either project: aiokafka added the
    back-off on purpose (aiokafka PR #534, for aiokafka #496) and faust-streaming
    has no setting that passes ``prefetch_backoff`` or ``fetch_max_wait_ms`` through.
    """
    from aiokafka.consumer import fetcher

    original = fetcher.Fetcher.__init__
    if getattr(original, _MARK, False):
        return True

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefetch_backoff", PREFETCH_BACKOFF_SECONDS)
        kwargs["fetch_max_wait_ms"] = min(kwargs.get("fetch_max_wait_ms", 500), FETCH_MAX_WAIT_MS)
        original(self, *args, **kwargs)

    setattr(__init__, _MARK, True)
    fetcher.Fetcher.__init__ = __init__
    return True


def durable_producer() -> bool:
    """Every producer Faust builds sends with ``DURABLE_SENDS`` (acks=all, idempotence).

    Faust has ``producer_acks`` but no setting for idempotence: it adds
    ``enable_idempotence`` only inside its own transactions (exactly-once,
    which the worker does not use), through ``Producer._settings_extra``. This
    adds the service's producer settings there, for every producer.
    Upstream issue: none known; faust-streaming exposes no such setting.
    """
    from faust.transport.drivers.aiokafka import Producer

    original = Producer._settings_extra
    if getattr(original, _MARK, False):
        return True

    def _settings_extra(self: Any) -> Mapping[str, Any]:
        return {**original(self), **DURABLE_SENDS}

    setattr(_settings_extra, _MARK, True)
    Producer._settings_extra = _settings_extra  # type: ignore[method-assign]
    return True


class _Resumed:
    """The rest of a coroutine whose first step already ran (and suspended on ``pending``).

    Awaiting it forwards every send and throw to the coroutine, so a task built
    on it behaves as one built on the coroutine from the start would have.
    """

    def __init__(self, coroutine: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coroutine = coroutine
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, step = self._coroutine, self._pending
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:  # cancellation included: the coroutine decides
                try:
                    step = coroutine.throw(error)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    step = coroutine.send(sent)
                except StopIteration as stop:
                    return stop.value


def _is_delivery(consumer: Any, coros: tuple[Any, ...]) -> bool:
    """Is this the fetch loop's ``wait_first(callback(message), suspend_flow.wait())``?"""
    if len(coros) != 2 or not asyncio.iscoroutine(coros[0]):
        return False
    frame = getattr(coros[1], "cr_frame", None)
    return frame is not None and frame.f_locals.get("self") is consumer.suspend_flow


def deliver_without_tasks() -> bool:
    """Hand a fetched record to the streams without four tasks when nothing makes it wait.

    Faust's fetch loop (``Consumer._drain_messages``) delivers every record
    through ``wait_first(callback(message), suspend_flow.wait())``: four
    tasks, an ``asyncio.wait`` and three cancellations per record, so that a
    rebalance can interrupt a delivery that waits (a stream's queue full, the
    flow stopped, the producer's buffer over its limit). Each record cost two or
    three turns of the event loop, every turn ran whatever else was ready, and
    aiokafka fetches nothing new until the whole previous batch is handed over:
    under paced traffic events waited seconds there (docs/performance.md
    section 10). This runs the delivery's first step in the fetch loop itself:
    when it completes without suspending (the stream's queue had room; the
    usual case) that was the whole delivery, with no task and no loop turn;
    when it suspends, the rest of it goes through Faust's ``wait_first`` as
    before, so a rebalance still interrupts it. While the flow is suspended,
    Faust's way is taken from the start. The fetch loop still yields to the
    event loop every 100 records (its own ``sleep(0)``).
    Upstream issue: none known.
    """
    from faust.transport.consumer import Consumer
    from mode.services import WaitResults

    original = Consumer.wait_first
    if getattr(original, _MARK, False):
        return True

    async def wait_first(self: Any, *coros: Any, timeout: Any = None) -> Any:  # noqa: ASYNC109
        if timeout is not None or not _is_delivery(self, coros) or self.suspend_flow.is_set():
            return await original(self, *coros, timeout=timeout)
        delivery, suspended = coros
        try:
            pending = delivery.send(None)
        except StopIteration as done:
            suspended.close()  # never started: nothing waited on it
            return WaitResults([delivery], [done.value], False)
        except BaseException:
            suspended.close()
            raise
        return await original(self, _Resumed(delivery, pending), suspended)

    setattr(wait_first, _MARK, True)
    Consumer.wait_first = wait_first  # type: ignore[method-assign]
    return True


def no_commit_past_an_unacked_head() -> bool:
    """Never commit past a record that was delivered and is not acked yet.

    ``Consumer._new_offset`` keeps the committed offset as Kafka does (the next
    offset to read, ``C``) and commits the first run of consecutive acked
    offsets. Its only head test is ``if C: refuse when min(acked) - C > 1``:
    with ``C`` itself unacked and ``C + 1`` acked it commits ``C + 2`` (the
    upgrade test lost single messages so), and with nothing committed yet
    (``C`` is ``None``, or ``0``, which is falsy) there is no test at all, so a
    fresh group whose record 0 is still being processed commits past it (a
    clean-clone CI run's malformed-records chaos test lost offset 0 of three
    partitions so). Either way that record is never read again (issue 29).
    Faust tolerates an unacked head on purpose: the offset may be no record at
    all (a transaction's commit marker, which the fetch never delivers), and
    refusing every commit then would stall the partition for good. So the
    commit is refused only while a record below the first acked offset, at or
    past ``C``, is among the consumer's delivered, unacked messages (Faust's
    ``_unacked_messages``, which the streams and ``stream_take`` track).
    Upstream issue: none known.
    """
    from faust.transport.consumer import Consumer

    original = Consumer._new_offset
    if _in_chain(original):  # the gap re-read wraps it again: look under it
        return True

    def _new_offset(self: Any, tp: Any) -> int | None:
        acked, committed = self._acked[tp], self._committed_offset[tp]
        if acked:
            # offsets Faust saw skipped (``_gap``) count as acked, as it counts them
            head = min([min(acked), *(interval.begin for interval in self._gap[tp])])
            if delivered_unacked_below(self, tp, committed, head):
                return None  # a record the commit would pass is still being processed
        result: int | None = original(self, tp)
        return result

    setattr(_new_offset, _MARK, True)
    _new_offset.__wrapped__ = original  # type: ignore[attr-defined]
    Consumer._new_offset = _new_offset  # type: ignore[method-assign]
    return True


def _in_chain(function: Any) -> bool:
    """Is this module's patch ``function`` or under it (``__wrapped__``, as patches set)?"""
    while function is not None:
        if getattr(function, _MARK, False):
            return True
        function = getattr(function, "__wrapped__", None)
    return False


#: Topics whose fetched records are handed out after every other topic's.
_BULK_TOPICS: set[str] = set()


def bulk_topics_last(bulk: Iterable[str]) -> bool:
    """Hand out the fetched records of every other topic before ``bulk``'s.

    aiokafka hands fetched records out partition by partition, in the order it
    fetched them, and fetches a partition again only once it is drained. Under
    a backlog each messages partition's fetch brings up to 1 MB, and a
    completion on the control topic (a few records per compaction) waited
    behind all of them: over 30 s at 1,000 events/s in the turn-read bench,
    and the conversation's next compaction waited with it. The other topics'
    buffered partitions now go first (on aiokafka's thread, where the buffer
    lives); order within a partition is untouched.

    Upstream issue: none known. Not a bug in aiokafka: its order is fair
    between fetches; a worker's topics are not equals.
    """
    from aiokafka.consumer import fetcher

    _BULK_TOPICS.update(bulk)
    original = fetcher.Fetcher.fetched_records
    if getattr(original, _MARK, False):
        return True

    async def fetched_records(
        self: Any,
        partitions: Any,
        timeout: float = 0,  # noqa: ASYNC109
        max_records: int | None = None,
    ) -> Any:
        buffered = self._records
        if any(tp.topic in _BULK_TOPICS for tp in buffered):
            for tp in [tp for tp in buffered if tp.topic not in _BULK_TOPICS]:
                buffered.move_to_end(tp, last=False)
        return await original(self, partitions, timeout=timeout, max_records=max_records)

    setattr(fetched_records, _MARK, True)
    fetcher.Fetcher.fetched_records = fetched_records
    return True


def route_after_metadata_loss() -> bool:
    """Answer 503 and fetch the topic's metadata when the producer lost it, not 500.

    A read is routed to its conversation's owner by hashing the key with the
    producer's metadata (``Producer.key_partition``). The producer never sends
    to the messages topic, and a metadata refresh (after a broker is killed)
    asks only for the topics it sends to: from then on
    ``partitions_for_topic`` was ``None`` and every routed read failed with a
    ``TypeError`` (500) until the next full refresh, minutes later (a leader-kill
    chaos run: 18 conversations unreadable 120 s after the fault). The topic is
    now added to the producer's client (its metadata comes with the next
    refresh, which this requests) and the read answered 503, retried.
    Upstream issue: none known.
    """
    from faust.transport.drivers.aiokafka import Producer
    from faust.web.exceptions import ServiceUnavailable

    original = Producer.key_partition
    if getattr(original, _MARK, False):
        return True

    def key_partition(self: Any, topic: str, key: bytes) -> Any:
        producer = self._ensure_producer()
        if producer._metadata.partitions_for_topic(topic) is None:
            client = producer.client
            if topic in client._topics:
                client.force_metadata_update()
            client.add_topic(topic)  # kept in every refresh from now on
            raise ServiceUnavailable(f"no metadata for topic {topic} yet: retry")
        return original(self, topic, key)

    setattr(key_partition, _MARK, True)
    Producer.key_partition = key_partition  # type: ignore[method-assign]
    return True


def apply() -> None:
    snapshot_active_partitions()
    shorter_prefetch_backoff()
    durable_producer()
    deliver_without_tasks()
    no_commit_past_an_unacked_head()
    seek_uncommitted_partitions_to_start()
    seek_before_resuming_streams()
    reread_gaps()  # wraps _new_offset again: applied last
    route_after_metadata_loss()
