"""``compactor tail``: follow the clip-archive topic, one line per compaction.

Why: it is the service's output as a downstream consumer sees it, so it is
how a developer checks that a replayed conversation got compacted. It joins
no consumer group (partitions are assigned by hand), so it commits nothing
and never steals partitions from a real consumer. The topic is written at
least once, so events are de-duplicated by ``compaction_id``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from streams.events import ClipArchiveEvent
from streams.kafka.security import PLAINTEXT, KafkaSecurity

Emit = Callable[[str], None]


def summarise(event: ClipArchiveEvent) -> str:
    """One human line: who was compacted, by how much, into what."""
    depths = sorted({batch.depth for batch in event.batches})
    depth = f"depth {depths[0]}" if len(depths) == 1 else f"depths {depths[0]}-{depths[-1]}"
    batches = f"{len(event.batches)} batches ({depth})" if event.batches else "0 batches"
    return (
        f"{event.created_at:%Y-%m-%d %H:%M:%S} {event.conversation_key} "
        f"compaction {event.compaction_id} (gen {event.generation}): "
        f"{len(event.compressed_message_ids)} messages compressed, "
        f"tokens {event.tokens_before} → {event.tokens_after}, {batches}, "
        f"{len(event.kept_message_ids)} kept"
    )


class TailError(RuntimeError):
    """Reading the topic failed; the message names topic and broker."""


@dataclass
class TailResult:
    printed: int = 0
    duplicates: int = 0
    invalid: int = 0
    timed_out: bool = False


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _partitions(consumer: AIOKafkaConsumer, topic: str, wait: float | None) -> set[int]:
    """The topic's partitions, waiting (up to ``wait`` s, forever if None) for it to exist:
    tail may well start before the worker has written anything."""
    loop = asyncio.get_running_loop()
    deadline = None if wait is None else loop.time() + wait
    announced = False
    while True:
        # Without a subscription the client only knows the topics it was asked
        # about, so refresh before looking (a refresh without topics fetches all).
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return set(partitions)
        if not announced:
            _stderr(f"waiting for topic {topic} to exist")
            announced = True
        if deadline is not None and loop.time() >= deadline:
            return set()
        await asyncio.sleep(0.5)


@dataclass
class _Printer:
    """Prints each new event once (the topic is written at least once), the chosen
    conversation's only, and counts what it skipped."""

    conversation_id: str | None
    max_events: int | None
    as_json: bool
    emit: Emit
    warn: Emit
    result: TailResult = field(default_factory=TailResult)
    seen: set[str] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.max_events is not None and self.result.printed >= self.max_events

    def take(self, tp: TopicPartition, record: ConsumerRecord[bytes, bytes]) -> None:
        try:
            event = ClipArchiveEvent.model_validate_json(record.value or b"")
        except ValidationError as error:
            self.result.invalid += 1
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(value)"
            self.warn(
                f"skipping {tp.topic}[{tp.partition}]@{record.offset}: "
                f"not a ClipArchiveEvent: {where}: {first['msg']}"
            )
            return
        if event.compaction_id in self.seen:
            self.result.duplicates += 1
            return
        self.seen.add(event.compaction_id)
        if self.conversation_id is not None and event.conversation_id != self.conversation_id:
            return
        self.emit(event.model_dump_json() if self.as_json else summarise(event))
        self.result.printed += 1


async def tail(
    *,
    bootstrap: str,
    topic: str,
    from_beginning: bool = False,
    conversation_id: str | None = None,
    max_events: int | None = None,
    idle_timeout: float | None = None,
    as_json: bool = False,
    emit: Emit = print,
    warn: Emit = _stderr,
    security: KafkaSecurity = PLAINTEXT,
) -> TailResult:
    """Print clip-archive events until ``max_events`` were printed or nothing new came
    for ``idle_timeout`` seconds (both optional: without them, until interrupted)."""
    printer = _Printer(conversation_id, max_events, as_json, emit, warn)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        client_id="compactor-tail",
        **security.client_kwargs(),
    )
    try:
        await consumer.start()
        partitions = await _partitions(consumer, topic, idle_timeout)
        if not partitions:
            printer.result.timed_out = True
            return printer.result
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        if from_beginning:
            await consumer.seek_to_beginning(*assigned)
        else:
            await consumer.seek_to_end(*assigned)
        await _follow(consumer, printer, idle_timeout)
    except KafkaError as error:
        raise TailError(f"reading {topic} on {bootstrap} failed: {error}") from error
    finally:
        await consumer.stop()
    return printer.result


async def _follow(
    consumer: AIOKafkaConsumer, printer: _Printer, idle_timeout: float | None
) -> None:
    """Hand every record to ``printer`` until it is done or the topic stays idle."""
    loop = asyncio.get_running_loop()
    last_activity = loop.time()
    while not printer.done:
        wait = 1.0
        if idle_timeout is not None:
            remaining = idle_timeout - (loop.time() - last_activity)
            if remaining <= 0:
                printer.result.timed_out = True
                return
            wait = min(wait, remaining)
        batches = await consumer.getmany(timeout_ms=max(int(wait * 1000), 1))
        for tp, records in batches.items():
            for record in records:
                last_activity = loop.time()
                printer.take(tp, record)
                if printer.done:
                    return
