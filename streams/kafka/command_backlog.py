"""``CommandBacklog`` (``streams.worker.reconciler``) over the brokers.

Why: a command that waits in a backlog longer than ``command_timeout_seconds``
is late, not lost. Re-sent, its copy joined the same backlog, made it longer,
and ran as a "replayed" no-op (one soak worker: 32,867 re-sent commands,
29,713 no-ops, for 2,666 compactions). The brokers can tell the two apart:
a command is queued or in flight while the worker group's committed offset
on its partition is not past the command's offset.

The offset is exact for a command this process sent (the broker's ack,
``streams.worker.issued_commands``). One sent before a restart or a
rebalance has only its issue time T; its record is at or after
``offsets_for_times(T)``, the first offset stamped at T or later (records
are stamped when sent, after T), so a group not past that offset has not
finished it. A whole batch issued at one instant shares T, so this bound is
looser. Anything else (no record that late, the group past the bound, an
error) means "not known to be queued" and the command may be re-sent as
before: this only ever holds a re-send back, never loses one.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner

from core.domain.tenancy import conversation_id_of
from core.ports.publisher import RecordPosition
from streams.kafka.security import KafkaSecurity
from streams.worker.issued_commands import IssuedCommand


class KafkaCommandBacklog:
    """The worker group's committed offsets against the commands topic's offsets by time."""

    def __init__(
        self,
        *,
        bootstrap: str,
        security: KafkaSecurity,
        group_id: str,
        topic: str,
        control_topic: str,
        partitions: int,
    ) -> None:
        self._bootstrap = bootstrap
        self._security = security
        self._group_id = group_id
        self._topic = topic
        self._control_topic = control_topic
        self._every = list(range(partitions))
        self._partitioner = DefaultPartitioner()
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    def partition_of(self, conversation_key: str) -> int:
        """Where the accounting agent's command for it went: keyed by the producer's id."""
        key = conversation_id_of(conversation_key).encode()
        return int(self._partitioner(key, self._every, self._every))

    async def still_queued(self, issued: Mapping[str, IssuedCommand]) -> set[str]:
        """Of these conversations (key → its outstanding command: when it was
        issued and, if this process sent it, where it went), those whose
        command no processor has finished yet."""
        if not issued:
            return set()
        known: dict[str, RecordPosition] = {}
        by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for key, command in issued.items():
            if command.position is not None:
                known[key] = command.position
            else:
                by_partition[self.partition_of(key)].append((int(command.at * 1000), key))
        partitions = set(by_partition) | {position.partition for position in known.values()}
        try:
            committed = await self._committed(self._topic, partitions)
            searches = {
                partition: _Search(sorted({at for at, _ in entries}), committed.get(partition, -1))
                for partition, entries in by_partition.items()
            }
            await self._narrow(searches)
        except Exception:
            with contextlib.suppress(Exception):
                await self.close()  # a fresh connection at the next pass
            raise
        queued = {
            key
            for key, position in known.items()
            if position.offset >= committed.get(position.partition, -1)
        }
        return queued | {
            key
            for partition, entries in by_partition.items()
            for at, key in entries
            if searches[partition].queued(at)
        }

    async def requests_unread(self, sent: Mapping[str, RecordPosition]) -> set[str]:
        """Of these reconcile requests (conversation key → where it went on the
        control topic), those the worker group has not read yet."""
        if not sent:
            return set()
        try:
            committed = await self._committed(
                self._control_topic, {position.partition for position in sent.values()}
            )
        except Exception:
            with contextlib.suppress(Exception):
                await self.close()
            raise
        return {
            key
            for key, position in sent.items()
            if position.offset >= committed.get(position.partition, -1)
        }

    async def _narrow(self, searches: Mapping[int, _Search]) -> None:
        """Both boundaries of every partition's search, by binary search: each
        round asks the brokers for one time per partition and boundary."""
        consumer = await self._consumer_client()
        while True:
            asks = [
                {
                    TopicPartition(self._topic, p): at
                    for p, search in searches.items()
                    if (at := ask(search)) is not None
                }
                for ask in (_Search.next_consumed_probe, _Search.next_missing_probe)
            ]
            if not any(asks):
                return
            for wanted in asks:
                if wanted:
                    found = await consumer.offsets_for_times(wanted)
                    for tp, at in wanted.items():
                        hit = found.get(tp)
                        searches[tp.partition].learn(at, None if hit is None else hit.offset)

    async def _committed(self, topic: str, partitions: Collection[int]) -> dict[int, int]:
        admin = await self._admin_client()
        wanted = [TopicPartition(topic, p) for p in partitions]
        offsets = await admin.list_consumer_group_offsets(self._group_id, partitions=wanted)
        return {
            tp.partition: meta.offset
            for tp, meta in offsets.items()
            if tp.topic == topic and meta is not None and meta.offset >= 0
        }

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self._bootstrap, **self._security.client_kwargs()
            )
            await admin.start()
            self._admin = admin
        return self._admin

    async def _consumer_client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap,
                group_id=None,  # reads offsets only; never joins the worker group
                enable_auto_commit=False,
                **self._security.client_kwargs(),
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        admin, consumer = self._admin, self._consumer
        self._admin = self._consumer = None
        try:
            if admin is not None:
                await admin.close()
        finally:
            if consumer is not None:
                await consumer.stop()


class _Search:
    """One partition's issue times (sorted, distinct, in ms) split in three.

    With ``first(t)`` the first offset stamped at or after ``t`` (``None``: no
    record that late) and ``committed`` the group's committed offset, a command
    issued at ``t`` is queued exactly when ``first(t)`` exists and is not below
    ``committed``: its record is at or after ``first(t)``, and the group has
    finished only what is below ``committed``. ``first`` never decreases and,
    once ``None``, stays so; both boundaries are found by binary search.
    """

    def __init__(self, times: list[int], committed: int) -> None:
        self.times = times
        self.committed = committed
        self.first: dict[int, int | None] = {}
        # The first index not consumed yet (or missing) and the first missing one.
        self.unconsumed = _Range(0, len(times))
        self.missing = _Range(0, len(times))

    def learn(self, at: int, offset: int | None) -> None:
        self.first[at] = offset

    def next_consumed_probe(self) -> int | None:
        return self._probe(self.unconsumed, lambda o: o is None or o >= self.committed)

    def next_missing_probe(self) -> int | None:
        return self._probe(self.missing, lambda o: o is None)

    def _probe(self, bounds: _Range, holds: Callable[[int | None], bool]) -> int | None:
        """Narrow ``bounds`` with what is known; the time still to ask, if any."""
        while bounds.low < bounds.high:
            middle = (bounds.low + bounds.high) // 2
            at = self.times[middle]
            if at not in self.first:
                return at
            if holds(self.first[at]):
                bounds.high = middle
            else:
                bounds.low = middle + 1
        return None

    def queued(self, at: int) -> bool:
        index = bisect.bisect_left(self.times, at)
        return self.unconsumed.low <= index < self.missing.low


@dataclass
class _Range:
    low: int
    high: int
