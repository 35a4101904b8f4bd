"""``compactor dead-letters redrive``: a ``RedrivePlan`` carried out, once each.

The steps and why they make a redrive safe to interrupt are in
``streams.cli.dead_letters`` (which reads the topics and makes the plan):
an *intent* in the ledger, the record itself, then *done*; a later run
resolves the intents an interrupted one left by looking for the record's
``compactor.redriven-from`` header on its source partition.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from streams.cli.dead_letters import (
    REDRIVEN_FROM,
    DeadLetter,
    LedgerEntry,
    RedriveError,
    RedrivePlan,
    read_topic,
    reader,
)
from streams.kafka.producers import producer_config
from streams.kafka.security import PLAINTEXT, KafkaSecurity

CHUNK = 100  # records per intent / send / done round

Progress = Callable[[str, Sequence[DeadLetter]], Awaitable[None]]


async def _no_progress(step: str, letters: Sequence[DeadLetter]) -> None:
    return None


@dataclass
class RedriveResult:
    sent: list[DeadLetter] = field(default_factory=list)
    found_sent: list[DeadLetter] = field(default_factory=list)  # an interrupted run's
    done_before: list[DeadLetter] = field(default_factory=list)
    unsendable: list[tuple[DeadLetter, str]] = field(default_factory=list)


class Redriver:
    """Carries out a ``RedrivePlan``: intent, record, done, in rounds of ``CHUNK``."""

    def __init__(
        self,
        bootstrap: str,
        ledger_topic: str,
        security: KafkaSecurity = PLAINTEXT,
        progress: Progress = _no_progress,
    ) -> None:
        self._bootstrap = bootstrap
        self._ledger = ledger_topic
        self._security = security
        self._progress = progress
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            **producer_config(security.client_kwargs(), client_id="compactor-redrive"),
        )

    async def run(self, plan: RedrivePlan) -> RedriveResult:
        result = RedriveResult(done_before=plan.done, unsendable=plan.unsendable)
        await self._producer.start()
        try:
            found, again = await self._resolve(plan.check)
            result.found_sent = found
            pending = [*again, *plan.send]
            for start in range(0, len(pending), CHUNK):
                chunk = pending[start : start + CHUNK]
                await self._redrive(chunk)
                result.sent += chunk
        except KafkaError as error:
            raise RedriveError(f"re-driving on {self._bootstrap} failed: {error}") from error
        finally:
            await self._producer.stop()
        return result

    async def _resolve(
        self, intents: Sequence[tuple[DeadLetter, LedgerEntry]]
    ) -> tuple[list[DeadLetter], list[DeadLetter]]:
        """(sent by an interrupted run: now recorded done, never sent: to send)."""
        by_partition: dict[tuple[str, int], list[tuple[DeadLetter, LedgerEntry]]] = {}
        for letter, entry in intents:
            key = (letter.meta.source_topic, letter.meta.source_partition)
            by_partition.setdefault(key, []).append((letter, entry))
        found: list[DeadLetter] = []
        again: list[DeadLetter] = []
        for (topic, partition), waiting in by_partition.items():
            start = min(entry.scan_from for _, entry in waiting)
            landed = {
                _redriven_from(record): record.offset
                for record in await read_topic(
                    self._bootstrap, topic, self._security, {partition: start}, [partition]
                )
            }
            for letter, _ in waiting:
                if letter.source in landed:
                    found.append(letter)
                    await self._write_ledger([(letter, _entry("done", 0, landed[letter.source]))])
                else:
                    again.append(letter)
        return found, again

    async def _redrive(self, chunk: Sequence[DeadLetter]) -> None:
        ends = await self._end_offsets(chunk)
        await self._write_ledger(
            [(letter, _entry("intent", ends[_source_tp(letter)])) for letter in chunk]
        )
        await self._progress("intent", chunk)
        sends = [
            await self._producer.send(
                letter.meta.source_topic,
                letter.value,
                key=letter.key,
                partition=letter.meta.source_partition,
                headers=[*letter.original_headers(), (REDRIVEN_FROM, letter.source.encode())],
            )
            for letter in chunk
        ]
        offsets = [(await sent).offset for sent in sends]
        await self._progress("sent", chunk)
        await self._write_ledger(
            [
                (letter, _entry("done", 0, offset))
                for letter, offset in zip(chunk, offsets, strict=True)
            ]
        )
        await self._progress("done", chunk)

    async def _end_offsets(self, chunk: Sequence[DeadLetter]) -> dict[TopicPartition, int]:
        consumer = reader(self._bootstrap, self._security)
        await consumer.start()
        try:
            wanted = sorted({_source_tp(letter) for letter in chunk})
            ends: dict[TopicPartition, int] = await consumer.end_offsets(wanted)
            return ends
        finally:
            await consumer.stop()

    async def _write_ledger(self, entries: Sequence[tuple[DeadLetter, LedgerEntry]]) -> None:
        sends = [
            await self._producer.send(self._ledger, entry.encode(), key=letter.source.encode())
            for letter, entry in entries
        ]
        for sent in sends:
            await sent


def _source_tp(letter: DeadLetter) -> TopicPartition:
    return TopicPartition(letter.meta.source_topic, letter.meta.source_partition)


def _entry(
    state: Literal["intent", "done"], scan_from: int, offset: int | None = None
) -> LedgerEntry:
    return LedgerEntry(state, scan_from, offset, datetime.now(UTC).isoformat())


def _redriven_from(record: Any) -> str | None:
    found = None
    for name, value in record.headers or ():
        if name == REDRIVEN_FROM:
            found = bytes(value).decode("utf-8", "replace")
    return found
