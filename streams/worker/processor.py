"""The processor: run one compaction command, publish what it produced.

Commands reach ``CommandIntake`` from the commands topic; the scheduler runs
them concurrently across conversations (one at a time per conversation) and
acks each in offset order once it and every earlier command have finished.
``Processor.compact`` is idempotent by compaction id: a replayed command
republishes its compaction's events instead of compacting again. The
compactor only plans; the processor applies the plan and the events it
builds (``streams.worker.outbox``) in one ``apply_compaction`` call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, Literal, TypeVar

from core.domain.budget import BudgetConfig, compaction_due
from core.domain.compaction import CompactionResult
from core.domain.messages import ConversationMessage
from core.ports.publisher import Publisher
from core.ports.storage import HistoryConflictError, MessageStore, OutboxBuilder, OutboxRecord
from streams.events import CompactionCommand
from streams.metrics import Metrics
from streams.worker.dead_letters import DeadLetters
from streams.worker.outbox import OutboxEvents, OutboxRelay, completion
from streams.worker.records import InvalidRecord, Record, decode_command
from streams.worker.runtime import Runtime
from streams.worker.scheduler import CompactionScheduler
from streams.worker.tenant_budget import TenantBudgets

log = logging.getLogger("compactor.worker")


def _fields(command: CompactionCommand) -> dict[str, str]:
    """The structured log fields of a command (JSON logs, streams.logs)."""
    return {"conversation_id": command.conversation_key, "compaction_id": command.compaction_id}


def _not_restored(result: CompactionResult) -> str:
    left = result.plan.not_restored_message_ids if result.plan is not None else ()
    return f", {len(left)} did not fit the budget and stay summarised" if left else ""


OutcomeStatus = Literal["compacted", "noop", "replayed", "failed"]


@dataclass(frozen=True)
class CompactionOutcome:
    status: OutcomeStatus
    reason: str = ""
    messages_compressed: int = 0
    batches_created: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    # Failed in a provider outage (the guard's answer count then): goes again once it answers.
    provider_down_at: int | None = None


class Processor:
    """Runs one command: asks the store once, has the compactor plan, applies the
    plan with the events it publishes in one transaction, then relays them."""

    def __init__(
        self,
        *,
        runtime: Runtime,
        publisher: Publisher,
        relay: OutboxRelay,
        metrics: Metrics,
        budget: BudgetConfig,
        clock: Callable[[], float] = time.time,
        tenant_budgets: TenantBudgets | None = None,
        hold_seconds: float = 0.0,
    ) -> None:
        """``hold_seconds``: how long after its issue a command that failed in a
        provider outage waits for the provider and goes again (the command
        timeout: past it, reconciliation re-sends the command anyway)."""
        self._hold_seconds = hold_seconds
        self._tenant_budgets = tenant_budgets
        self._runtime = runtime
        self._publisher = publisher
        self._relay = relay
        self._metrics = metrics
        self._budget = budget
        self._clock = clock

    async def compact(self, command: CompactionCommand) -> CompactionOutcome:
        """Run the command; one that failed because the provider was down waits for
        it to answer (``Compactor.provider_answers``) and goes again, for as long
        as the command is not yet due to be re-sent: back the moment the provider
        is, instead of after ``command_timeout_seconds`` and reconciliation."""
        outcome = await self._compact_once(command)
        while outcome.provider_down_at is not None:
            left = self._hold_seconds - self._age(command)
            if left <= 0:
                break
            answers = self._runtime.compactor.provider_answers(outcome.provider_down_at)
            try:
                await asyncio.wait_for(answers, left)
            except TimeoutError:
                break
            self._metrics.compactions_retried_after_outage.inc()
            outcome = await self._compact_once(command)
        return outcome

    def _age(self, command: CompactionCommand) -> float:
        issued = command.issued_at.timestamp()
        return self._clock() - issued

    async def _compact_once(self, command: CompactionCommand) -> CompactionOutcome:
        inputs = await self._runtime.store.compaction_inputs(
            command.compaction_id, command.conversation_key, up_to_seq=command.up_to_seq
        )
        if inputs.applied:
            return await self._replayed(command)
        if command.action == "compact" and not compaction_due(inputs.total, self._budget):
            return await self._complete_without_compaction(command, "under_budget")
        self._metrics.observe_history_at_compaction(inputs.total, self._budget.budget_tokens)
        metrics = self._metrics
        metrics.compactions_started.inc()
        metrics.in_flight.inc()
        with self._relay.claim(command.compaction_id):
            try:
                planned = await self._plan(command, inputs.history)
                result, records = await self._apply(command, inputs.history, planned)
            finally:
                metrics.in_flight.dec()
            return await self._settle(command, result, records)

    async def _plan(
        self, command: CompactionCommand, history: Sequence[ConversationMessage]
    ) -> CompactionResult:
        """The command's plan: an ordinary compaction, or an operator's recompact or
        restore (``CompactionCommand.action``), planned by the compactor alike."""
        compactor = self._runtime.compactor
        key, compaction_id = command.conversation_key, command.compaction_id
        if command.action == "recompact":
            return await compactor.recompact(history, key, compaction_id=compaction_id)
        if command.action == "restore":
            return await compactor.restore(
                history, key, compaction_id=compaction_id, batch_id=command.batch_id
            )
        fallback = await self._budget_spent(command)
        return await compactor.plan(history, key, compaction_id=compaction_id, fallback=fallback)

    async def _budget_spent(self, command: CompactionCommand) -> bool:
        """The tenant's LLM budget for the day is spent: compact with the fallback."""
        budgets = self._tenant_budgets
        return budgets is not None and await budgets.spent(command.conversation_key)

    async def _apply(
        self,
        command: CompactionCommand,
        history: Sequence[ConversationMessage],
        planned: CompactionResult,
    ) -> tuple[CompactionResult, list[OutboxRecord]]:
        if planned.plan is None:
            return planned, []
        events = OutboxEvents(command, history, planned.plan, self._clock)
        result = await apply_plan(self._runtime.store, planned, history, events.build)
        return result, events.records if result.plan is not None else []

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
            return self._failed(command, result.reason or "unknown", result.provider_down_at)
        if result.already_applied:
            return await self._replayed(command)
        if (
            result.messages_compressed == 0
            and result.batches_created == 0
            and result.messages_restored == 0
            and (result.plan is None or result.plan.clip_archive is not None)
        ):
            # (No message compressed but a new batch: the clip-archive was re-fitted
            # under the target, a compaction like any other.)
            detail = result.reason if command.action != "compact" else None
            return await self._complete_without_compaction(command, "nothing_to_compress", detail)
        await self._relay.relay(command.compaction_id, records=records)
        metrics.compactions_succeeded.inc()
        if result.usage is not None:
            metrics.count_usage(result.usage)
        issued = (datetime.fromtimestamp(self._clock(), UTC) - command.issued_at).total_seconds()
        metrics.compaction_latency.observe(max(0.0, issued))
        if command.action != "compact":
            self._metrics.operator_requests.labels(command.action, "applied").inc()
            log.info(
                "%s %s of %s (request %s) applied: %d batches, %d turns restored%s",
                command.action, command.compaction_id, command.conversation_key,
                command.request_id, result.batches_created, result.messages_restored,
                _not_restored(result), extra=_fields(command),
            )  # fmt: skip
        return CompactionOutcome(
            "compacted",
            reason=_not_restored(result).lstrip(", "),
            messages_compressed=result.messages_compressed,
            batches_created=result.batches_created,
            tokens_before=result.tokens_estimate_before,
            tokens_after=result.tokens_estimate_after,
        )

    def _failed(
        self, command: CompactionCommand, reason: str, provider_down_at: int | None
    ) -> CompactionOutcome:
        kind = reason.split(":", 1)[0]
        self._metrics.compactions_failed.labels(kind).inc()
        # A provider outage fails every compaction at once; the guard has said so.
        provider_down = provider_down_at is not None
        level = logging.INFO if provider_down else logging.WARNING
        then = "again once the provider answers" if provider_down else "reconciliation retries it"
        log.log(
            level,
            "compaction %s of %s failed, history unchanged; %s: %s",
            command.compaction_id,
            command.conversation_key,
            then,
            reason,
            extra=_fields(command),
        )
        if command.action != "compact":
            self._metrics.operator_requests.labels(command.action, "failed").inc()
        return CompactionOutcome("failed", reason, provider_down_at=provider_down_at)

    async def _replayed(self, command: CompactionCommand) -> CompactionOutcome:
        self._metrics.compactions_noop.labels("replayed").inc()
        # Claimed, so the relay timer does not publish the same unpublished rows meanwhile.
        with self._relay.claim(command.compaction_id):
            await self._relay.relay(command.compaction_id, again=True)
        return CompactionOutcome("replayed", "compaction already applied")

    async def _complete_without_compaction(
        self, command: CompactionCommand, reason: str, detail: str | None = None
    ) -> CompactionOutcome:
        self._metrics.compactions_noop.labels(reason).inc()
        if command.action != "compact":
            self._metrics.operator_requests.labels(command.action, "noop").inc()
        noop = completion(command, datetime.fromtimestamp(self._clock(), UTC))
        await self._publisher.publish(
            "control", command.conversation_id.encode(), noop.model_dump_json().encode()
        )
        log.info(
            "compaction %s of %s: nothing to do (%s)",
            command.compaction_id,
            command.conversation_key,
            detail or reason,
            extra=_fields(command),
        )
        return CompactionOutcome("noop", detail or reason)


async def apply_plan(
    store: MessageStore,
    planned: CompactionResult,
    history: Sequence[ConversationMessage],
    outbox: OutboxBuilder | None = None,
) -> CompactionResult:
    """Write ``planned.plan`` (and the events ``outbox`` builds) in one transaction.

    On any failure the history stays exactly as it was and the result says
    why, with no plan; a compaction id already recorded is ``already_applied``.
    """
    if planned.plan is None:
        return planned
    before = tuple(history)
    try:
        applied = await store.apply_compaction(planned.plan, outbox)
    except HistoryConflictError as error:
        log.warning(
            "compaction %s of %s conflicted: %s",
            planned.plan.compaction_id,
            planned.plan.conversation_id,
            error,
            extra={
                "conversation_id": planned.plan.conversation_id,
                "compaction_id": planned.plan.compaction_id,
            },
        )
        return planned.unchanged(before, f"history changed during compaction: {error}", failed=True)
    except Exception as error:
        return planned.unchanged(before, f"{type(error).__name__}: {error}", failed=True)
    if applied.outcome == "already_applied" or applied.stats is None:
        reason = "compaction already applied"
        return planned.unchanged(before, reason, failed=False, already_applied=True)
    return planned.applied(applied.stats)


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
            conversation_id = command.conversation_key

            async def work() -> None:
                await self._processor.compact(command)

        await self.scheduler.submit(
            partition=partition,
            offset=record.offset,
            token=token,
            conversation_id=conversation_id,
            work=work,
        )
