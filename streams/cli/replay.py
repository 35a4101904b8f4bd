"""``compactor replay``: publish a JSONL transcript of message events to Kafka.

Why a command of its own: it is how a developer (or a test) feeds the
running worker exactly what a chat platform would send, keyed by
conversation id so that one conversation stays on one partition and in order.
The file is validated whole before anything is published: half a transcript
on the topic is worse than none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from core.domain.signatures import SIGNATURE_HEADER, signature
from streams.events import MessageEvent
from streams.kafka.producers import producer_config
from streams.kafka.security import PLAINTEXT, KafkaSecurity


@dataclass(frozen=True)
class BadLine:
    path: Path
    number: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.number}: {self.field}: {self.message}"


@dataclass
class Transcript:
    events: list[MessageEvent] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


def read_events(path: Path) -> Transcript:
    """Every line of ``path`` as a MessageEvent; bad lines are collected, not raised,
    so that one run names all of them."""
    transcript = Transcript()
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                transcript.events.append(MessageEvent.model_validate_json(line))
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(part) for part in first["loc"]) or "(line)"
                transcript.bad.append(BadLine(path, number, where, first["msg"]))
    return transcript


class Progress:
    """A progress bar on a terminal, a line every few seconds elsewhere (logs, CI).

    Self-drawn: a dependency for one line of output is not worth it.
    """

    WIDTH = 30

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        label: str = "published",
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = 0
        self.stream = stream
        self.label = label
        self.is_tty = bool(getattr(stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.1 if self.is_tty else 5.0)
        self._clock = clock
        self._started = clock()
        # A terminal shows the bar at once; a log gets its first line after an interval.
        self._last_draw = float("-inf") if self.is_tty else self._started

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = self._clock()
        if now - self._last_draw >= self.interval:
            self._last_draw = now
            self._draw(now)

    def finish(self) -> None:
        self._draw(self._clock())
        if self.is_tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, now: float) -> None:
        elapsed = now - self._started
        fraction = self.done / self.total if self.total else 1.0
        # A rate over a few milliseconds is noise, not information.
        per_second = self.done / elapsed if elapsed >= 0.5 else None
        rate = (
            "" if per_second is None else f", {per_second:,.{0 if per_second >= 10 else 1}f} msg/s"
        )
        if self.is_tty:
            filled = int(fraction * self.WIDTH)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            self.stream.write(
                f"\r{self.label} [{bar}] {self.done}/{self.total} ({fraction:.0%}{rate})  "
            )
        else:
            self.stream.write(f"{self.label} {self.done}/{self.total} ({fraction:.0%}{rate})\n")
        self.stream.flush()


class PublishError(RuntimeError):
    """The broker refused or lost the records; the message names topic and broker."""


@dataclass(frozen=True)
class PublishResult:
    published: int
    conversations: int
    partitions: dict[str, int]  # conversation id -> partition it went to


async def publish(
    events: list[MessageEvent],
    *,
    bootstrap: str,
    topic: str,
    rate: float | None = None,
    progress: Progress | None = None,
    security: KafkaSecurity = PLAINTEXT,
    signing_keys: Mapping[str, bytes] | None = None,
) -> PublishResult:
    """Publish ``events`` in order, keyed by conversation id, and wait for every ack.

    ``acks=all`` with idempotence: a retried send after a lost ack never
    duplicates or reorders a conversation's messages. ``rate`` spaces sends
    evenly (messages per second) to imitate live traffic. An event of a
    tenant in ``signing_keys`` is signed with its key (``[tenancy]``; the
    first key of each tenant in the configuration).
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **producer_config(security.client_kwargs(), client_id="compactor-replay", linger_ms=5),
    )
    try:
        await producer.start()
        pending = await _send_all(producer, events, topic, rate, dict(signing_keys or {}), progress)
        acks = await asyncio.gather(*pending)
    except KafkaError as error:
        raise PublishError(f"publishing to {topic} on {bootstrap} failed: {error}") from error
    finally:
        await producer.stop()
    if progress is not None:
        progress.finish()
    partitions: dict[str, int] = {}
    for event, meta in zip(events, acks, strict=True):
        partitions[event.conversation_id] = int(getattr(meta, "partition", -1))
    return PublishResult(len(events), len(partitions), partitions)


async def _send_all(
    producer: AIOKafkaProducer,
    events: list[MessageEvent],
    topic: str,
    rate: float | None,
    keys: Mapping[str, bytes],
    progress: Progress | None,
) -> list[asyncio.Future[object]]:
    """Hand every event to the producer, spaced by ``rate``; the futures of their acks."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending: list[asyncio.Future[object]] = []
    for index, event in enumerate(events):
        if rate:
            delay = started + index / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        value = event.model_dump_json().encode()
        key = keys.get(event.tenant_id) if event.tenant_id is not None else None
        future = await producer.send(
            topic,
            value=value,
            key=event.conversation_id.encode(),
            headers=None if key is None else [(SIGNATURE_HEADER, signature(key, value).encode())],
        )
        if progress is not None:
            future.add_done_callback(_advance(progress))
        pending.append(future)
    return pending


def _advance(progress: Progress) -> Callable[[asyncio.Future[object]], None]:
    def done(future: asyncio.Future[object]) -> None:
        if not future.cancelled() and future.exception() is None:
            progress.advance()

    return done
