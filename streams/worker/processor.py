"""The processor: run one compaction command, publish what it produced.

Commands reach ``CommandIntake`` from the commands topic; the scheduler runs
them concurrently across conversations (one at a time per conversation) and
acks each in offset order once it and every earlier command have finished.
``Processor.compact`` is idempotent by compaction id: a replayed command
republishes its compaction's events instead of compacting again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, Literal, Protocol, TypeVar, cast, runtime_checkable

from core.domain.budget import BudgetConfig, compaction_due
from core.domain.compaction import (
    AppliedStats,
    CompactionPlan,
    CompactionResult,
    OutboxFactory,
    OutboxRecord,
)
from core.domain.messages import ConversationMessage
from core.ports.storage import WorkerStore
from streams.events import CompactionCommand, CompactionCompleted
from streams.kafka.publisher import Publisher
from streams.metrics import Metrics
from streams.worker.dead_letters import DeadLetters
from streams.worker.outbox import OutboxRelay, outbox_events
from streams.worker.records import InvalidRecord, Record, decode_command
from streams.worker.resources import Resources
from streams.worker.scheduler import CompactionScheduler

log = logging.getLogger("compactor.worker")

OutcomeStatus = Literal["compacted", "noop", "replayed", "failed"]


@dataclass(frozen=True)
class CompactionOutcome:
    status: OutcomeStatus
    reason: str = ""
    messages_compressed: int = 0
    batches_created: int = 0
    tokens_before: int = 0
    tokens_after: int = 0


class Processor:
    def __init__(
        self,
        *,
        resources: Resources,
        publisher: Publisher,
        relay: OutboxRelay,
        metrics: Metrics,
        budget: BudgetConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._resources = resources
        self._publisher = publisher
        self._relay = relay
        self._metrics = metrics
        self._budget = budget
        self._clock = clock

    async def compact(self, command: CompactionCommand) -> CompactionOutcome:
        store = await self._resources.store()
        conversation_id = command.conversation_id
        applied, total, history = await _inputs(store, command)
        if applied:
            return await self._replayed(command)
        if not compaction_due(total, self._budget):
            return await self._complete_without_compaction(command, "under_budget")
        self._metrics.observe_history_at_compaction(total, self._budget.budget_tokens)
        compactor = await self._resources.compactor()
        metrics = self._metrics
        metrics.compactions_started.inc()
        metrics.in_flight.inc()
        built = _Built()
        with self._relay.claim(command.compaction_id):
            try:
                result = await compactor.compress(
                    history,
                    conversation_id,
                    compaction_id=command.compaction_id,
                    outbox=built.capture(outbox_events(command, history, self._clock)),
                    check_applied=False,
                )
            finally:
                metrics.in_flight.dec()
            return await self._settle(command, result, built.records)

    async def _settle(
        self, command: CompactionCommand, result: CompactionResult, records: list[OutboxRecord]
    ) -> CompactionOutcome:
        """What a finished ``compress`` means: publish its events, or say why not."""
        metrics = self._metrics
        metrics.llm_tokens.labels("input").inc(result.llm_input_tokens)
        metrics.llm_tokens.labels("output").inc(result.llm_output_tokens)
        if result.over_target:
            metrics.compactions_over_target.inc()
        if result.failed:
            return self._failed(command, result.reason or "unknown")
        if result.already_applied:
            return await self._replayed(command)
        if result.messages_compressed == 0 and result.batches_created == 0:
            # (No message compressed but a new batch: the clip-archive was re-fitted
            # under the target, a compaction like any other.)
            return await self._complete_without_compaction(command, "nothing_to_compress")
        await self._relay.relay(command.compaction_id, records=records)
        metrics.compactions_succeeded.inc()
        issued = (datetime.fromtimestamp(self._clock(), UTC) - command.issued_at).total_seconds()
        metrics.compaction_latency.observe(max(0.0, issued))
        return CompactionOutcome(
            "compacted",
            messages_compressed=result.messages_compressed,
            batches_created=result.batches_created,
            tokens_before=result.tokens_estimate_before,
            tokens_after=result.tokens_estimate_after,
        )

    def _failed(self, command: CompactionCommand, reason: str) -> CompactionOutcome:
        kind = reason.split(":", 1)[0]
        self._metrics.compactions_failed.labels(kind).inc()
        # A provider outage fails every compaction at once; the guard has said so.
        level = logging.INFO if kind == "ProviderUnavailableError" else logging.WARNING
        log.log(
            level,
            "compaction %s of %s failed, history unchanged; reconciliation will retry: %s",
            command.compaction_id,
            command.conversation_id,
            reason,
        )
        return CompactionOutcome("failed", reason)

    async def _replayed(self, command: CompactionCommand) -> CompactionOutcome:
        self._metrics.compactions_noop.labels("replayed").inc()
        await self._relay.relay(command.compaction_id, again=True)
        return CompactionOutcome("replayed", "compaction already applied")

    async def _complete_without_compaction(
        self, command: CompactionCommand, reason: str
    ) -> CompactionOutcome:
        self._metrics.compactions_noop.labels(reason).inc()
        noop = CompactionCompleted(
            compaction_id=command.compaction_id,
            conversation_id=command.conversation_id,
            generation=command.generation,
            status="noop",
            messages_compressed=0,
            rows_removed=0,
            rows_added=0,
            tokens_removed=0,
            tokens_added=0,
            completed_at=datetime.fromtimestamp(self._clock(), UTC),
        )
        await self._publisher.publish(
            "control", command.conversation_id.encode(), noop.model_dump_json().encode()
        )
        log.info(
            "compaction %s of %s: nothing to do (%s)",
            command.compaction_id,
            command.conversation_id,
            reason,
        )
        return CompactionOutcome("noop", reason)


class _Built:
    """Keeps the outbox records a compaction's transaction wrote, so the relay can
    send them without reading them back (used only once the compaction committed)."""

    def __init__(self) -> None:
        self.records: list[OutboxRecord] = []

    def capture(self, factory: OutboxFactory) -> OutboxFactory:
        def build(plan: CompactionPlan, stats: AppliedStats) -> list[OutboxRecord]:
            self.records = list(factory(plan, stats))
            return self.records

        return build


@runtime_checkable
class CompactionInputs(Protocol):
    """A store that answers the processor's three questions in one round trip
    (``PostgresStore.compaction_inputs``)."""

    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> tuple[bool, int, list[ConversationMessage]]: ...


async def _inputs(
    store: WorkerStore, command: CompactionCommand
) -> tuple[bool, int, list[ConversationMessage]]:
    """Is the compaction applied, the conversation's stored total, its history up to
    the command's cut: every compaction asks, so in one round trip where the store
    can. Otherwise three independent reads, asked at once; every outcome is
    collected (a database outage fails all three, and an exception left
    unretrieved would be logged as a bug) and the first failure raised."""
    if isinstance(store, CompactionInputs):
        return await store.compaction_inputs(
            command.compaction_id, command.conversation_id, up_to_seq=command.up_to_seq
        )
    outcomes = await asyncio.gather(
        store.compaction_applied(command.compaction_id),
        store.conversation_token_total(command.conversation_id),
        store.load_history(command.conversation_id, up_to_seq=command.up_to_seq),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return cast(tuple[bool, int, list[ConversationMessage]], tuple(outcomes))


Token = TypeVar("Token")


class CommandIntake(Generic[Token]):
    """Hands decoded commands to the scheduler; an unusable one is dead-lettered.

    Dead-lettered records still go through the scheduler (with no work), so
    their offsets are acked in order with the commands around them.
    """

    def __init__(
        self,
        processor: Processor,
        scheduler: CompactionScheduler[Token],
        dead_letters: DeadLetters,
    ) -> None:
        self._processor = processor
        self.scheduler = scheduler
        self._dead_letters = dead_letters

    async def submit(self, record: Record, partition: Hashable, token: Token) -> None:
        work = None
        conversation_id = None
        try:
            command = decode_command(record)
        except InvalidRecord as error:
            await self._dead_letters.send(record, error)
        else:
            conversation_id = command.conversation_id

            async def work() -> None:
                await self._processor.compact(command)

        await self.scheduler.submit(
            partition=partition,
            offset=record.offset,
            token=token,
            conversation_id=conversation_id,
            work=work,
        )
