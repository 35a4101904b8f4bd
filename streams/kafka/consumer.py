"""The worker's side of Faust's consumer: rebalances and lag.

These talk to ``faust.App.consumer`` directly, so they are exercised by the
end-to-end tests (two workers, a worker joining mid-stream) rather than by
unit tests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from faust.types import TP

from core.domain.tenancy import conversation_id_of
from streams.kafka.gap_reread import expect_heads
from streams.kafka.seeking import seek_to_reread
from streams.kafka.watchdog import Watchdog
from streams.metrics import Metrics
from streams.worker.records import Record
from streams.worker.scheduler import CompactionScheduler

log = logging.getLogger("compactor.worker")

# A command record and the stream it came from: what the scheduler acks.
CommandToken = tuple[Any, Any]  # (faust.StreamT[bytes], faust.EventT[bytes])


async def ack_command(token: CommandToken) -> None:
    stream, event = token
    await stream.ack(event)


def owns_conversation(app: Any, control_topic: str, partitions: int) -> Any:
    """Does this worker own a conversation? Its control partition is assigned here
    (keys are partitioned by murmur2, as every Kafka client's default does)."""
    partitioner = DefaultPartitioner()
    every = list(range(partitions))

    def owns(conversation_key: str) -> bool:
        # Routed by the producer's id alone (the record key), whatever its tenant.
        partition = partitioner(conversation_id_of(conversation_key).encode(), every, every)
        return TP(control_topic, partition) in app.consumer.assignment()

    return owns


def assigned(app: Any, record: Record) -> bool:
    """Is the record's partition still this worker's? (During a rebalance: yes, until
    the new assignment says otherwise.)"""
    return TP(record.topic, record.partition) in app.consumer.assignment()


class Rebalance:
    def __init__(
        self,
        consumer: Callable[[], Any],
        scheduler: CompactionScheduler[Any],
        source_topics: Collection[str],
    ) -> None:
        self._consumer = consumer
        self._scheduler = scheduler
        self._source_topics = set(source_topics)

    def on_revoked(self, revoked: set[Hashable]) -> None:
        """Stop acking for revoked partitions: their new owner redoes what is unacked."""
        self._scheduler.revoke(revoked)

    async def rewind_uncommitted(self) -> None:
        """Re-read partitions that have no committed offset from their beginning.

        Records fetched while a rebalance suspends the flow are discarded by
        Faust, which then relies on seeking back to the committed offset to
        read them again; a partition with no committed offset yet (nothing
        processed on it so far) is not sought at all, so its first records
        were silently lost: a message never stored, a command never run.
        This runs after table recovery, before the flow resumes. Records
        read twice are harmless: every write is idempotent.
        """
        consumer = self._consumer()
        if not consumer.assignment():
            return
        try:
            committed = await consumer.seek_to_committed()
            uncommitted = [
                tp
                for tp, offset in committed.items()
                if tp.topic in self._source_topics and not offset
            ]
            if not uncommitted:
                return
            earliest = await consumer.earliest_offsets(*uncommitted)
            heads = {tp: earliest.get(tp) or 0 for tp in uncommitted}
            await seek_to_reread(consumer, heads)
            expect_heads(consumer, heads)  # the first commit of each must start there
        except Exception:  # a rebalance is not the moment to crash the worker
            log.exception("could not rewind partitions without a committed offset")
            return
        log.info(
            "partitions with no committed offset read from the start: %s",
            sorted(f"{tp.topic}:{tp.partition}" for tp in uncommitted),
        )


class LagMeter:
    def __init__(self, consumer: Callable[[], Any], metrics: Metrics) -> None:
        self._consumer = consumer
        self._metrics = metrics

    def tick(self) -> None:
        consumer = self._consumer()
        # Faust keeps the last offset read per partition privately; there is
        # no public accessor.
        read_offsets = getattr(consumer, "_read_offset", {})
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            if highwater is None:
                continue
            read = read_offsets.get(tp)
            lag = highwater - (read + 1 if read is not None else 0)
            self._metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, lag))


@dataclass
class ConsumerSide:
    """What watches Faust's consumer: rebalances, lag and progress."""

    rebalance: Rebalance
    lag: LagMeter
    watchdog: Watchdog
