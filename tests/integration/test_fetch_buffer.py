"""The watchdog reads aiokafka's fetch buffer as the pinned aiokafka keeps it.

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

from streams.kafka.watchdog import _waiting_in_fetch_buffer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_records_fetched_but_not_handed_out_are_seen_waiting(kafka_bootstrap: str) -> None:
    topic = f"fetch-buffer-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(200):
            await producer.send(topic, f"m{i}".encode(), partition=0)
        await producer.send_and_wait(topic, b"last", partition=0)
    finally:
        await producer.stop()

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
