"""The worker's components, each testable against in-memory ports without Kafka.

=================  ==============================================================
``accounting``     decode → store → tally → command (the table's single writer)
``processor``      run one compaction command; ``CommandIntake`` feeds the scheduler
``outbox``         the events a compaction publishes, and their relay
``dead_letters``   unusable records → the dead-letter topic, with the reason
``timers``         reconciliation (lost commands, failed compactions)
``consumer``       rebalance handling and lag, against Faust's consumer
``tally_table``    the token table as ``ConversationTally`` values
``records``        records and their decoding; ``publisher``: the one way to send
=================  ==============================================================

``assemble`` wires them; ``streams.app`` registers them with Faust and the
offline ``compactor compact`` drives the same ones in-process.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from core.domain.accounting import reconcile_due
from core.settings import Settings
from streams.kafka.publisher import Publisher
from streams.metrics import Metrics
from streams.topics import TopicNames
from streams.worker.accounting import Accounting, AccountingRules
from streams.worker.dead_letters import DeadLetters
from streams.worker.health import Health
from streams.worker.outbox import OutboxRelay
from streams.worker.processor import CommandIntake, Processor
from streams.worker.reconciler import Reconciler
from streams.worker.records import Record
from streams.worker.resources import Resources
from streams.worker.scheduler import CompactionScheduler
from streams.worker.tally_table import TallyTable, WriteContext

Token = TypeVar("Token")


@dataclass
class Components(Generic[Token]):
    names: TopicNames
    metrics: Metrics
    health: Health
    table: TallyTable
    dead_letters: DeadLetters
    accounting: Accounting
    relay: OutboxRelay
    processor: Processor
    intake: CommandIntake[Token]
    reconciler: Reconciler


def assemble(
    settings: Settings,
    *,
    table: MutableMapping[str, Any],
    publisher: Publisher,
    resources: Resources,
    ack: Callable[[Token], Awaitable[None]],
    metrics: Metrics | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    still_assigned: Callable[[Record], bool] = lambda _: True,
    owns: Callable[[str], bool] = lambda _: True,
    write_context: WriteContext | None = None,
    tables_ready: Callable[[], bool] = lambda: True,
) -> Components[Token]:
    """The components over the given table, publisher and resources.

    ``ack`` acknowledges a command record once it and every earlier one of
    its partition are done (see ``streams.worker.scheduler``); ``still_assigned``
    tells accounting whether to keep retrying a record through an outage, and
    ``owns`` reconciliation whether a conversation is this worker's;
    ``write_context`` lets the table flush write Faust table entries (see
    ``streams.kafka.table_context``).
    """
    service = settings.service
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    metrics = metrics or Metrics()
    health = Health(clock)
    tallies = tally_table(settings, table, metrics, write_context)
    dead_letters = DeadLetters(
        publisher, metrics, clock, max_request_bytes=settings.kafka.max_request_bytes
    )
    rules = AccountingRules.of(settings)
    relay = OutboxRelay(resources, publisher, metrics)
    processor = Processor(
        resources=resources,
        publisher=publisher,
        relay=relay,
        metrics=metrics,
        budget=settings.budget,
        clock=clock,
    )
    scheduler: CompactionScheduler[Token] = CompactionScheduler(
        ack, max_concurrent=service.max_concurrent_compactions
    )
    return Components(
        names=names,
        metrics=metrics,
        health=health,
        table=tallies,
        dead_letters=dead_letters,
        accounting=Accounting(
            names=names,
            rules=rules,
            resources=resources,
            table=tallies,
            publisher=publisher,
            dead_letters=dead_letters,
            metrics=metrics,
            health=health,
            clock=clock,
            sleep=sleep,
            still_assigned=still_assigned,
        ),
        relay=relay,
        processor=processor,
        intake=CommandIntake(processor, scheduler, dead_letters),
        reconciler=Reconciler(
            table=tallies,
            publisher=publisher,
            budget=settings.budget,
            interval_seconds=service.reconcile_interval_seconds,
            command_timeout_seconds=service.command_timeout_seconds,
            resources=resources,
            owns=owns,
            clock=clock,
            ready=tables_ready,
            metrics=metrics,
        ),
    )


def tally_table(
    settings: Settings,
    table: MutableMapping[str, Any],
    metrics: Metrics,
    write_context: WriteContext | None = None,
) -> TallyTable:
    """The cached token table; its index holds what ``reconcile_due`` may ever act on."""
    return TallyTable(
        table,
        candidate=lambda tally: reconcile_due(tally, settings.budget, math.inf, 0.0),
        flush_seconds=settings.service.table_flush_seconds,
        max_cached=settings.service.tally_cache_entries,
        on_write=metrics.table_writes.inc,
        write_context=write_context,
    )
