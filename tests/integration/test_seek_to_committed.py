"""Faust's seek back to the committed offsets, on a real broker: a partition
that was never committed goes back to its first record.

Why: Faust drops records it fetched when a rebalance interrupts their delivery
and relies on seeking to the committed offsets to read them again. aiokafka
seeks only partitions committed above 0, so a fresh partition kept its
position past the dropped records and its head was never stored: the
malformed-records and rolling-restart chaos tests lost offsets 0 and 1 of
such partitions (two failures in one clean-clone CI run).
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

from streams.kafka.seeking import seek_to_committed_or_start, seek_uncommitted_partitions_to_start
from tests.integration.test_fetch_buffer import create, send

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDS = 5


async def _consumer_at_the_end(bootstrap: str) -> tuple[AIOKafkaConsumer, list[TopicPartition]]:
    """Three partitions of five records, read to the end; partition 1 committed
    at 0 and partition 2 at 3, partition 0 never."""
    topic = f"seek-{uuid.uuid4().hex[:8]}"
    await create(bootstrap, topic, partitions=3)
    for partition in range(3):
        await send(bootstrap, topic, RECORDS, partition=partition)
    tps = [TopicPartition(topic, p) for p in range(3)]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=f"seek-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    consumer.assign(tps)
    await consumer.start()
    await _read(consumer, {tp: RECORDS for tp in tps})
    await consumer.commit({tps[1]: OffsetAndMetadata(0, ""), tps[2]: OffsetAndMetadata(3, "")})
    return consumer, tps


async def _read(consumer: AIOKafkaConsumer, wanted: dict[TopicPartition, int]) -> dict[Any, int]:
    """The first offset read from each partition, reading ``wanted`` records of each."""
    first: dict[Any, int] = {}
    counts = dict.fromkeys(wanted, 0)
    async with asyncio.timeout(60):
        while any(counts[tp] < n for tp, n in wanted.items()):
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                first.setdefault(tp, records[0].offset)
                counts[tp] += len(records)
    return first


async def test_a_never_committed_partition_goes_back_to_its_first_record(
    kafka_bootstrap: str,
) -> None:
    consumer, (never, at_zero, at_three) = await _consumer_at_the_end(kafka_bootstrap)
    try:
        await consumer.seek_to_committed()  # aiokafka's own: partitions 0 and 1 stay at the end
        assert await consumer.position(never) == RECORDS
        assert await consumer.position(at_zero) == RECORDS
        committed = await seek_to_committed_or_start(consumer)
        assert committed == {never: None, at_zero: 0, at_three: 3}
        first = await _read(consumer, {never: RECORDS, at_zero: RECORDS, at_three: RECORDS - 3})
        assert first == {never: 0, at_zero: 0, at_three: 3}
    finally:
        await consumer.stop()


async def test_fausts_seek_to_committed_goes_through_it(kafka_bootstrap: str) -> None:
    """The patch is what Faust's ``perform_seek`` calls, on the consumer's thread."""
    assert seek_uncommitted_partitions_to_start()
    assert seek_uncommitted_partitions_to_start()  # applying twice is a no-op
    consumer, (never, _, _) = await _consumer_at_the_end(kafka_bootstrap)

    async def call_thread(fun: Any, *args: Any) -> Any:
        return await fun(*args)

    def thread(reset: str) -> Any:
        conf = SimpleNamespace(consumer_auto_offset_reset=reset)
        return SimpleNamespace(
            app=SimpleNamespace(conf=conf),
            call_thread=call_thread,
            _ensure_consumer=lambda: consumer,
        )

    try:
        await AIOKafkaConsumerThread.seek_to_committed(thread("latest"))  # type: ignore[arg-type]
        assert await consumer.position(never) == RECORDS  # Faust's own behaviour under latest
        await AIOKafkaConsumerThread.seek_to_committed(thread("earliest"))  # type: ignore[arg-type]
        assert await consumer.position(never) == 0
    finally:
        await consumer.stop()


@pytest.mark.parametrize("patched", [True, False], ids=["patched", "faust-as-released"])
async def test_records_a_stopped_flow_dropped_are_read_again(
    kafka_bootstrap: str, patched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Faust app whose first fetch comes back while the flow is stopped
    (as when a rebalance starts under it): Faust discards the records and seeks
    to the committed offsets. Patched, the fresh partition goes back to 0 and
    every record reaches the agent; as released, none of them ever does (the
    agent's first record is the one produced after). If the second case fails,
    Faust or aiokafka fixed it: the patch can go."""
    assert seek_uncommitted_partitions_to_start()
    if not patched:
        original = AIOKafkaConsumerThread.seek_to_committed.__wrapped__  # type: ignore[attr-defined]
        monkeypatch.setattr(AIOKafkaConsumerThread, "seek_to_committed", original)
    name = f"flow-{uuid.uuid4().hex[:8]}"
    app, seen, arrived = await recording_app(kafka_bootstrap, name, RECORDS)
    dropped = asyncio.Event()
    await app.start()
    try:
        consumer = app.consumer
        wait_next_records = consumer._wait_next_records

        async def stop_flow_under_the_first_fetch(timeout: float) -> Any:
            records, active = await wait_next_records(timeout)
            if records and not dropped.is_set():
                consumer.stop_flow()  # the fetch returns into a stopped flow
                dropped.set()
                asyncio.get_running_loop().call_later(0.2, consumer.resume_flow)
            return records, active

        consumer._wait_next_records = stop_flow_under_the_first_fetch
        async with asyncio.timeout(60):
            await dropped.wait()
            await last_record_seen(kafka_bootstrap, name, RECORDS, seen, arrived)
    finally:
        await app.stop()
    if patched:
        assert sorted(set(seen)) == list(range(RECORDS + 1))
    else:
        assert seen == [RECORDS], seen


async def last_record_seen(
    bootstrap: str, name: str, offset: int, seen: list[int], arrived: asyncio.Event
) -> None:
    """Produce one more record (at ``offset``) and wait until the agent is handed
    it: whatever comes before it in the partition came by then."""
    await send(bootstrap, name, 1)
    while offset not in seen:
        arrived.clear()
        await arrived.wait()


def plain_app(bootstrap: str, name: str, **settings: Any) -> faust.App:
    """A Faust app reading ``name`` from its start, with no web server."""
    return faust.App(
        name,
        broker=f"kafka://{bootstrap}",
        value_serializer="raw",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        topic_partitions=1,
        datadir=tempfile.mkdtemp(prefix=f"{name}-"),  # not {name}-data in the work tree
        **settings,
    )


async def recording_app(
    bootstrap: str, name: str, records: int, busy_seconds: float = 0.0, **settings: Any
) -> tuple[faust.App, list[int], asyncio.Event]:
    """A topic ``name`` of ``records`` records and a Faust app (not started) whose
    agent notes each offset it is handed, then takes ``busy_seconds`` over it:
    (app, offsets seen, set on each)."""
    await create(bootstrap, name)
    await send(bootstrap, name, records)
    app = plain_app(bootstrap, name, **settings)
    seen: list[int] = []
    arrived = asyncio.Event()

    @app.agent(app.topic(name, value_type=bytes))
    async def agent(stream: Any) -> None:
        async for event in stream.events():
            seen.append(event.message.offset)
            arrived.set()
            await asyncio.sleep(busy_seconds)

    return app, seen, arrived
