"""Accounting: each record to its job, under its conversation's lock, durably.

It is the table's only writer. Messages and control events each have an
agent with concurrency 1 (acks stay in order), so a completion never waits
behind a backlog of messages; the agents take a per-conversation lock, which
keeps each entry's read-modify-write single-file. The jobs: a group of
messages (``streams.worker.ingest``), a control event
(``streams.worker.control``), an erase request (``streams.worker.erasure``);
each rule about the tally is ``core.domain.tally``'s, the commands are built
by ``streams.worker.commands``.

A record is only acknowledged once its effect is durable: a failure is
handled by ``streams.worker.failures`` (an outage waited out on the same
record, which also holds back the rest of its partition; ``/healthz`` says
so).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from core.domain.budget import BudgetConfig
from core.ports.publisher import Publisher
from core.settings import Settings
from streams.metrics import Metrics
from streams.topics import TopicNames
from streams.worker.commands import Commands
from streams.worker.control import Control, ControlPorts
from streams.worker.dead_letters import DeadLetters
from streams.worker.erasure import ConsumedOffsets, Eraser, ErasurePorts
from streams.worker.failures import Durably, FailurePolicy
from streams.worker.health import Health
from streams.worker.ingest import Decoded, Ingest, IngestPorts
from streams.worker.issued_commands import IssuedCommands
from streams.worker.keyed_lock import KeyedLock
from streams.worker.producers import ProducerPolicy
from streams.worker.records import InvalidRecord, Record, decode_control
from streams.worker.tally_table import TallyTable


class AccountingPorts(IngestPorts, ControlPorts, ErasurePorts, Protocol):
    """What accounting's jobs use of the runtime (``streams.worker.runtime``)."""


@dataclass(frozen=True)
class AccountingRules:
    budget: BudgetConfig
    max_content_chars: int
    command_timeout_seconds: float
    # A failure that is not an outage (a bug, a record breaking an assumption)
    # is retried this often, then the record is dead-lettered with the error.
    max_attempts: int = 5
    # What a message must show about its tenant ([tenancy]: signatures).
    producers: ProducerPolicy = field(default_factory=ProducerPolicy)

    @classmethod
    def of(cls, settings: Settings) -> AccountingRules:
        service = settings.service
        return cls(
            budget=settings.budget,
            max_content_chars=service.max_content_chars,
            command_timeout_seconds=service.command_timeout_seconds,
            producers=ProducerPolicy.of(settings.tenancy),
        )


@dataclass(frozen=True)
class AccountingHooks:
    """What the worker plugs into accounting (its consumer's view of assignments, its
    health, where commands went, who waits for stored messages); the defaults
    serve the tests and the offline CLI."""

    health: Health | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    still_assigned: Callable[[Record], bool] = lambda _: True
    issued: IssuedCommands | None = None
    # the conversations whose messages a group just stored (IngestNotices.stored)
    stored: Callable[[Collection[str]], None] = lambda _: None
    # when the newest message of a group just stored was published (CompactionPacer.stored)
    published: Callable[[float], None] = lambda _: None


class Accounting:
    def __init__(
        self,
        *,
        names: TopicNames,
        rules: AccountingRules,
        runtime: AccountingPorts,
        table: TallyTable,
        publisher: Publisher,
        dead_letters: DeadLetters,
        metrics: Metrics,
        hooks: AccountingHooks | None = None,
    ) -> None:
        self._names = names
        self._table = table
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._locks = KeyedLock()
        hooks = hooks or AccountingHooks()
        clock = hooks.clock
        issued = IssuedCommands() if hooks.issued is None else hooks.issued  # reconciliation reads
        budget = rules.budget
        commands = Commands(
            publisher, issued, metrics, budget_tokens=budget.budget_tokens, clock=clock
        )
        consumed = ConsumedOffsets()
        self._eraser = Eraser(
            runtime=runtime, table=table, publisher=publisher, metrics=metrics,
            consumed=consumed, clock=clock,
        )  # fmt: skip
        self._ingest = Ingest(
            budget=budget, max_content_chars=rules.max_content_chars, producers=rules.producers,
            runtime=runtime, table=table, commands=commands, dead_letter=self._dead_letter,
            consumed=consumed, metrics=metrics, clock=clock, stored=hooks.stored,
            published=hooks.published,
        )  # fmt: skip
        self._control = Control(
            budget=budget, command_timeout_seconds=rules.command_timeout_seconds,
            runtime=runtime, table=table, commands=commands, eraser=self._eraser,
            issued=issued, clock=clock,
        )  # fmt: skip
        self._durably = Durably(
            FailurePolicy(rules.max_attempts), dead_letter=self._dead_letter, metrics=metrics,
            health=hooks.health or Health(clock), sleep=hooks.sleep,
            still_assigned=hooks.still_assigned,
        )  # fmt: skip

    async def handle(self, record: Record) -> None:
        """Account one record, durably: returns only once its effect is written, and
        writes its table entry now (the control agent, the offline CLI)."""
        async with self._locks.hold(record.key):
            touched = await self._durably.run([record], self._account)
        self._table.flush(only=touched)

    async def decode(self, records: Sequence[Record]) -> Decoded:
        """A group of message records decoded as it is taken, ahead of its store
        (``streams.worker.overlap``); its partitions' epochs are taken now."""
        return await self._ingest.decode(records)

    async def handle_batch(
        self, records: Sequence[Record], ahead: Decoded | None = None
    ) -> set[int]:
        """Account a group of message records, durably; their table entries are
        written by the next due flush (``streams.worker.tally_table.AcksAfterFlush``).

        An unusable record is dead-lettered with its reason; during an outage the
        group waits, for as long as its partitions stay assigned here; a group
        that keeps failing otherwise is retried one record at a time, so one bad
        record cannot hold up or dead-letter the others.

        ``ahead``: the group as ``decode`` returned it when it was taken.
        Returns the partitions revoked since it was taken: their records must
        not be acked (their effect on the table was not kept), so whoever reads
        the partition next reads them again, finds them stored and resyncs.
        """
        if not records:
            return set()
        epochs = self._ingest.epochs(records) if ahead is None else ahead.epochs
        async with self._locks.hold_many(record.key for record in records):
            await self._durably.run(records, partial(self._account, ahead=ahead))
        self._metrics.accounting_batch_events.observe(len(records))
        return {p for p, epoch in epochs.items() if self._table.epoch(p) != epoch}

    async def _account(self, records: Sequence[Record], ahead: Decoded | None = None) -> set[str]:
        """One try: the conversation keys whose table entry it changed."""
        if len(records) == 1 and records[0].topic != self._names.messages:
            try:
                if records[0].topic == self._names.erasures:
                    return await self._eraser.erase_record(records[0])
                event = decode_control(records[0])
                return await self._control.apply(event, records[0].partition)
            except InvalidRecord as error:
                await self._dead_letter(records[0], error)
                return set()
        return await self._ingest.ingest(records, ahead)

    async def _dead_letter(self, record: Record, error: InvalidRecord) -> None:
        await self._dead_letters.send(record, error)
        if record.topic == self._names.messages:
            self._metrics.events_in.labels("dead_lettered").inc()
