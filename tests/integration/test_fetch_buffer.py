"""aiokafka's fetch buffer, as the pinned aiokafka keeps it: the watchdog reads
it, and a patch hands the control topics' records out before the messages'.

Why: a partition whose fetched records wait behind other partitions' is slow,
not stuck (``streams.kafka.watchdog._waiting_in_fetch_buffer``). That reads
aiokafka's private ``_fetcher._records`` through Faust's consumer thread; if a
release moved it, the watchdog would silently count a backlog as a stall again
(three useless re-seeks end the worker). This checks the path on a real broker.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.types import TP

from streams.kafka.faust_patches import bulk_topics_last
from streams.kafka.watchdog import _waiting_in_fetch_buffer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def create(bootstrap: str, *topics: str, partitions: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, partitions, replication_factor=1) for t in topics])
    finally:
        await admin.close()


async def send(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(count - 1):
            await producer.send(topic, f"m{i}".encode(), partition=partition)
        await producer.send_and_wait(topic, b"last", partition=partition)
    finally:
        await producer.stop()


async def test_records_fetched_but_not_handed_out_are_seen_waiting(kafka_bootstrap: str) -> None:
    topic = f"fetch-buffer-{uuid.uuid4().hex[:8]}"
    await create(kafka_bootstrap, topic, partitions=2)
    await send(kafka_bootstrap, topic, 201)

    backlogged, idle = TP(topic, 0), TP(topic, 1)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    await consumer.start()
    faust_consumer = SimpleNamespace(
        _thread=SimpleNamespace(_ensure_consumer=lambda: consumer),
        assignment=lambda: {backlogged, idle},
        _active_partitions={backlogged, idle},
    )
    try:
        async with asyncio.timeout(60):
            while not await consumer.getmany(timeout_ms=200, max_records=1):
                pass  # the first fetch: one record handed out, the rest buffered
        assert _waiting_in_fetch_buffer(faust_consumer) == {backlogged}
        faust_consumer._active_partitions = {idle}  # Faust paused it: not waiting
        assert _waiting_in_fetch_buffer(faust_consumer) == set()
        faust_consumer._active_partitions = {backlogged, idle}
        async with asyncio.timeout(60):
            while _waiting_in_fetch_buffer(faust_consumer):
                await consumer.getmany(timeout_ms=200, max_records=500)
    finally:
        await consumer.stop()


async def test_a_control_record_fetched_after_a_messages_backlog_is_handed_out_first(
    kafka_bootstrap: str,
) -> None:
    """Without the patch aiokafka hands out the messages fetched first: the
    control record waits behind all 300 (over 30 s under the bench's backlog)."""
    suffix = uuid.uuid4().hex[:8]
    messages, control = f"bulk-{suffix}.messages", f"bulk-{suffix}.accounting-control"
    await create(kafka_bootstrap, messages, control)
    await send(kafka_bootstrap, messages, 300)
    bulk_topics_last({messages})
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(messages, 0), TopicPartition(control, 0)])
    await consumer.start()
    try:
        async with asyncio.timeout(60):
            while not await consumer.getmany(timeout_ms=200, max_records=1):
                pass  # the messages are fetched: 299 wait in the buffer
        await send(kafka_bootstrap, control, 1)
        fetcher = consumer._fetcher
        async with asyncio.timeout(60):
            while TopicPartition(control, 0) not in fetcher._records:
                await fetcher._create_fetch_waiter()  # set when a fetch brings records
        first = await consumer.getmany(timeout_ms=0, max_records=50)
        assert TopicPartition(control, 0) in first, {tp: len(r) for tp, r in first.items()}
    finally:
        await consumer.stop()
