"""The worker's components built from the settings, a table, a publisher and a runtime.

Faust-free, so the worker (``streams.bootstrap.build_app``), the offline CLI
(``compactor compact``) and the tests build exactly the same components; which
adapters are behind the runtime is the composition root's business
(``streams.bootstrap``), the hooks are the consumer's and the table's state,
which only the worker has.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from core.domain.pace import PaceRule
from core.domain.tally import reconcile_due
from core.ports.publisher import Publisher
from core.settings import Settings
from streams.metrics import Metrics
from streams.topics import TopicNames
from streams.worker.accounting import Accounting, AccountingHooks, AccountingRules
from streams.worker.components import Components
from streams.worker.dead_letters import DeadLetters
from streams.worker.health import Health
from streams.worker.ingest_notices import IngestNotices
from streams.worker.intake import CommandIntake
from streams.worker.issued_commands import IssuedCommands
from streams.worker.outbox import OutboxRelay
from streams.worker.pacer import CompactionPacer
from streams.worker.processor import Processor
from streams.worker.reconciler import CommandBacklog, Reconciler
from streams.worker.records import Record
from streams.worker.requests import OperatorRequests
from streams.worker.runtime import Runtime
from streams.worker.scheduler import CompactionScheduler
from streams.worker.tally_table import TallyTable, WriteContext
from streams.worker.tenant_budget import TenantBudgets

Token = TypeVar("Token")


def build_components(
    settings: Settings,
    *,
    table: MutableMapping[str, Any],
    publisher: Publisher,
    runtime: Runtime,
    ack: Callable[[Token], Awaitable[None]],
    metrics: Metrics | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    still_assigned: Callable[[Record], bool] = lambda _: True,
    owns: Callable[[str], bool] = lambda _: True,
    write_context: WriteContext | None = None,
    tables_ready: Callable[[], bool] = lambda: True,
    backlog: CommandBacklog | None = None,
) -> Components[Token]:
    """The components over the given table, publisher and runtime: the worker's (Faust's) or
    a test's and the offline CLI's; the hooks are the consumer's and the table's state."""
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    metrics = metrics or Metrics()
    health = Health(clock)
    tallies = tally_table(settings, table, metrics, write_context)
    dead_letters = _dead_letters(settings, publisher, metrics, clock)
    pacer = compaction_pacer(settings, metrics)  # ingest tells it, the scheduler asks it
    relay, processor, intake = _compaction(
        settings, runtime, publisher, metrics, clock, ack, dead_letters, pacer, tallies
    )
    issued = IssuedCommands()  # accounting notes where commands went; reconciliation reads
    notices = IngestNotices()  # readers waiting for a message to be stored
    hooks = AccountingHooks(health, clock, sleep, still_assigned, issued, notices.stored,
                            pacer.stored)  # fmt: skip
    accounting = _accounting(settings, names, runtime, tallies, publisher, dead_letters,
                             metrics, hooks)  # fmt: skip
    reconciler = Reconciler(
        table=tallies, publisher=publisher, budget=settings.budget,
        interval_seconds=settings.service.reconcile_interval_seconds,
        command_timeout_seconds=settings.service.command_timeout_seconds,
        runtime=runtime, owns=owns, clock=clock, ready=tables_ready, metrics=metrics,
        backlog=backlog, issued=issued,
    )  # fmt: skip
    return Components(
        names=names, metrics=metrics, health=health, table=tallies, dead_letters=dead_letters,
        accounting=accounting, relay=relay, processor=processor, intake=intake,
        reconciler=reconciler, requests=OperatorRequests(publisher), notices=notices,
    )  # fmt: skip


def _accounting(
    settings: Settings,
    names: TopicNames,
    runtime: Runtime,
    table: TallyTable,
    publisher: Publisher,
    dead_letters: DeadLetters,
    metrics: Metrics,
    hooks: AccountingHooks,
) -> Accounting:
    return Accounting(
        names=names, rules=AccountingRules.of(settings), runtime=runtime, table=table,
        publisher=publisher, dead_letters=dead_letters, metrics=metrics, hooks=hooks,
    )  # fmt: skip


def _dead_letters(
    settings: Settings, publisher: Publisher, metrics: Metrics, clock: Callable[[], float]
) -> DeadLetters:
    return DeadLetters(
        publisher,
        metrics,
        clock,
        max_request_bytes=settings.kafka.max_request_bytes,
        content=settings.kafka.dead_letter_content,
    )


def _compaction(
    settings: Settings,
    runtime: Runtime,
    publisher: Publisher,
    metrics: Metrics,
    clock: Callable[[], float],
    ack: Callable[[Token], Awaitable[None]],
    dead_letters: DeadLetters,
    pacer: CompactionPacer,
    tallies: TallyTable,
) -> tuple[OutboxRelay, Processor, CommandIntake[Token]]:
    """The processor, the scheduler in front of it and the relay behind it: how
    commands become compactions and their events."""
    service = settings.service
    relay = OutboxRelay(runtime, publisher, metrics, grace_seconds=service.command_timeout_seconds)
    tenant_budgets = TenantBudgets(
        {t.id: t.llm_tokens_per_day for t in settings.tenants}, runtime, metrics, clock
    )
    processor = Processor(
        runtime=runtime, publisher=publisher, relay=relay, metrics=metrics,
        budget=settings.budget, clock=clock, tenant_budgets=tenant_budgets,
        hold_seconds=service.command_timeout_seconds,
    )  # fmt: skip
    scheduler: CompactionScheduler[Token] = CompactionScheduler(
        ack,
        max_concurrent=service.max_concurrent_compactions,
        fair_share=settings.summarization.fair_share,
        tenant_weights=settings.tenant_weights(),
        pacer=pacer,
        urgency=lambda conversation: float(tokens_counted(tallies, conversation)),
        urgent_at=settings.budget.model_max_tokens,
    )
    return relay, processor, CommandIntake(processor, scheduler, dead_letters)


def tokens_counted(tallies: TallyTable, conversation: str) -> int:
    """The conversation's token total as counted (0 when it has no entry)."""
    tally = tallies.get(conversation)
    return 0 if tally is None else tally.token_total


def compaction_pacer(settings: Settings, metrics: Metrics) -> CompactionPacer:
    """Compactions at once, fewer while messages are stored late (wall clock: the
    records' timestamps are)."""
    service = settings.service
    ceiling = service.max_concurrent_compactions
    rule = PaceRule(
        floor=min(service.min_concurrent_compactions, ceiling),
        ceiling=ceiling,
        target_seconds=service.turn_delay_target_ms / 1000,
    )
    return CompactionPacer(
        rule, on_limit=metrics.compaction_limit.set, on_late=metrics.turns_late.inc
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
        writes_per_second=settings.service.table_writes_per_second,
        max_cached=settings.service.tally_cache_entries,
        on_write=metrics.table_writes.inc,
        on_interval=metrics.table_flush_interval.set,
        write_context=write_context,
    )
