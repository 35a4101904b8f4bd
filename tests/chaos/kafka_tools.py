"""Kafka for fault injection: a producer that retries through broker outages,
reading a whole topic, a consumer group's committed offsets, topics with configs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from core.settings import default_min_insync
from streams.kafka.admin import MIN_INSYNC_REPLICAS, Replication, ensure_topics, topic_configs
from streams.kafka.producers import producer_config
from streams.topics import TopicNames
from tests.support.kafka_io import Record

PRODUCER_MAX_REQUEST = 16 * 1024 * 1024


class ChaosProducer:
    """Sends until the broker acknowledges (acks=all, idempotent, as the service's
    producers), retrying through outages."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.retries = 0
        self._producer = self._new()

    def _new(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            **producer_config(
                {},
                client_id="chaos-producer",
                linger_ms=5,
                max_request_size=PRODUCER_MAX_REQUEST,
                request_timeout_ms=10_000,
                retry_backoff_ms=200,
            ),
        )

    async def start(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                await self._producer.start()
                return
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                with contextlib.suppress(Exception):
                    await self._producer.stop()
                self._producer = self._new()
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._producer.stop()

    async def send(
        self, topic: str, value: bytes, key: bytes | None, timeout: float = 240.0
    ) -> tuple[int, int]:
        """(partition, offset) once acknowledged."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                future = await self._producer.send(topic, value, key=key)
                meta = await asyncio.wait_for(future, 30)
                return int(meta.partition), int(meta.offset)
            except (KafkaError, TimeoutError, OSError) as error:
                self.retries += 1
                if time.monotonic() > deadline:
                    raise AssertionError(f"could not produce to {topic}: {error!r}") from None
                await asyncio.sleep(0.5)  # backoff between attempts

    async def send_many(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes]]
    ) -> list[tuple[int, int]]:
        """Enqueued in order (one partition's records keep their order), awaited together;
        any that failed are re-sent one by one."""
        futures: list[asyncio.Future[Any] | None] = []
        for key, value in records:
            try:
                futures.append(await self._producer.send(topic, value, key=key))
            except (KafkaError, OSError):
                futures.append(None)
        out: list[tuple[int, int]] = []
        for (key, value), future in zip(records, futures, strict=True):
            try:
                if future is None:
                    raise KafkaError("not enqueued")
                meta = await asyncio.wait_for(future, 30)
                out.append((int(meta.partition), int(meta.offset)))
            except (KafkaError, TimeoutError, OSError):
                self.retries += 1
                out.append(await self.send(topic, value, key))
        return out


async def read_topic(
    bootstrap: str, topic: str, partitions: int, timeout: float = 30.0
) -> list[Record]:
    """Every record of ``topic`` from its beginning to its current end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        group_id=None,
        max_partition_fetch_bytes=PRODUCER_MAX_REQUEST,
        fetch_max_bytes=4 * PRODUCER_MAX_REQUEST,
    )
    await consumer.start()
    records: list[Record] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: not at the end after {timeout:.0f}s")
            batches = await consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                for message in messages:
                    records.append(
                        Record(
                            topic=tp.topic,
                            partition=tp.partition,
                            offset=message.offset,
                            key=message.key,
                            value=message.value,
                            headers=tuple(message.headers or ()),
                        )
                    )
                    if message.offset + 1 >= ends[tp]:
                        remaining.discard(tp)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    return records


async def group_progress(
    bootstrap: str, group: str, topic: str, partitions: int
) -> dict[int, tuple[int, int]]:
    """{partition: (committed offset of ``group``, end offset)} of ``topic``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await admin.start()
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
        await admin.close()
    out = {}
    for tp in tps:
        meta = committed.get(tp)
        out[tp.partition] = (meta.offset if meta is not None else -1, int(ends[tp]))
    return out


async def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int
) -> dict[int, int]:
    """{partition: committed offset of ``group``} (-1: none) of ``topic``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
    finally:
        await admin.close()
    return {
        tp.partition: (committed[tp].offset if committed.get(tp) is not None else -1) for tp in tps
    }


async def create_topics(
    bootstrap: str,
    names: TopicNames,
    partitions: int,
    configs: Mapping[str, Mapping[str, str]],
    *,
    replication: int = 1,
) -> None:
    """Create the topics named in ``configs`` with those topic configs, then the rest
    as the worker would (``ensure_topics``), each with ``replication`` replicas and
    its default ``min.insync.replicas``."""
    wanted = Replication(replication, default_min_insync(replication))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if configs:
            await admin.create_topics(
                [
                    NewTopic(
                        name,
                        partitions,
                        replication,
                        topic_configs={
                            MIN_INSYNC_REPLICAS: str(wanted.min_insync),
                            **topic_config,
                        },
                    )
                    for name, topic_config in configs.items()
                ]
            )
    finally:
        await admin.close()
    await ensure_topics(
        bootstrap,
        names,
        partitions=partitions,
        replication_factor=replication,
        configs=topic_configs(names, replication=wanted),
    )


async def partition_leaders(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """{(topic, partition): node id of its leader} (-1 while it has none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    return {
        (d["topic"], p["partition"]): int(p["leader"]) for d in described for p in d["partitions"]
    }


async def under_replicated(bootstrap: str) -> list[str]:
    """Every partition of the cluster (internal topics too) whose ISR lacks a replica."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = await admin.list_topics()
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return [
        f"{d['topic']}:{p['partition']} isr {sorted(p['isr'])} of {sorted(p['replicas'])}"
        for d in described
        for p in d["partitions"]
        if set(p["isr"]) != set(p["replicas"]) or p["leader"] < 0
    ]


async def end_offsets(
    bootstrap: str, topics: Sequence[str], partitions: int
) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        return {tp: int(offset) for tp, offset in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()
