"""Producing to and reading from real Kafka topics in end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value.decode()
        return None


@dataclass(frozen=True)
class Sent:
    """Where a produced record landed."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes


#: Requests and fetches of the tests' clients: records up to what a topic may be
#: configured to accept in a test (8 MiB), never limited by the client.
CLIENT_MAX_BYTES = 16 * 1024 * 1024


class Producer:
    def __init__(self, bootstrap: str) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", max_request_size=CLIENT_MAX_BYTES
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> Sent:
        """``timestamp_ms``: the record's time (CreateTime), now unless given."""
        meta = await self._producer.send_and_wait(
            topic, value, key=key, headers=headers, timestamp_ms=timestamp_ms
        )
        return Sent(meta.partition, meta.offset, key, value)


class TopicCollector:
    """Reads a topic from its beginning in the background (no consumer group)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.records: list[Record] = []
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            group_id=None,
            max_partition_fetch_bytes=CLIENT_MAX_BYTES,
            fetch_max_bytes=CLIENT_MAX_BYTES,
        )
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def start(self) -> None:
        await self._consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=200)
                for tp, messages in batches.items():
                    for message in messages:
                        self.records.append(
                            Record(
                                topic=tp.topic,
                                partition=tp.partition,
                                offset=message.offset,
                                key=message.key,
                                value=message.value,
                                headers=tuple(message.headers or ()),
                            )
                        )
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # surfaced by wait_for
            self._error = error

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()

    async def wait_for(
        self,
        predicate: Callable[[list[Record]], bool],
        timeout: float,
        what: str = "records",
        describe: Callable[[list[Record]], Any] | None = None,
    ) -> list[Record]:
        deadline = time.monotonic() + timeout
        while True:
            if self._error is not None:
                raise AssertionError(f"reading {self.topic} failed: {self._error!r}")
            snapshot = list(self.records)
            if predicate(snapshot):
                return snapshot
            if time.monotonic() > deadline:
                shown = describe(snapshot) if describe else f"{len(snapshot)} records"
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what} on {self.topic}: {shown}"
                )
            await asyncio.sleep(0.1)
