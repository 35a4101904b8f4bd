"""The processor: run one compaction command, publish what it produced.

Commands reach ``CommandIntake`` from the commands topic; the scheduler runs
them concurrently across conversations (one at a time per conversation) and
acks each in offset order once it and every earlier command have finished.
``Processor.compact`` is idempotent by compaction id: a replayed command
republishes its compaction's events instead of compacting again.

The processor is glue; each step is another module's: the inputs
(``CompactionInputsReader``, one round trip), whether the conversation is
still due (``core.domain.budget``), the plan (the ``Compactor``, which only
plans), its events, built before the write from what the store read
(``streams.worker.compaction_events``), the write of both in one transaction
(``CompactionStore.apply_compaction``), and their relay (``OutboxRelay``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from core.compaction.attempt import failure_kind
from core.domain.budget import BudgetConfig, compaction_due
from core.domain.compaction import CompactionPlan, Failed, Planned, PlanOutcome, Unchanged
from core.domain.gate import Rejected
from core.domain.keep_rules import pinned_tokens
from core.domain.messages import ConversationMessage
from core.domain.tenancy import tenant_of
from core.ports.compactor import Compactor
from core.ports.publisher import Publisher
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    CompactionInputs,
    CompactionInputsReader,
    CompactionOutbox,
    CompactionStore,
    HistoryConflictError,
    UsageStore,
)
from streams.events import CompactionCommand
from streams.metrics import Metrics
from streams.worker.compaction_events import compaction_outbox, completion
from streams.worker.gate_fallback import GateRejections, next_safe_strategy, pinned_over_budget
from streams.worker.outbox import OutboxRelay
from streams.worker.tenant_budget import TenantBudgets

log = logging.getLogger("compactor.worker")


class CompactionPorts(Protocol):
    """What the processor uses of the runtime (``streams.worker.runtime``)."""

    @property
    def history(self) -> CompactionInputsReader: ...

    @property
    def compactions(self) -> CompactionStore: ...

    @property
    def compactor(self) -> Compactor: ...

    @property
    def usage(self) -> UsageStore: ...


@dataclass(frozen=True)
class Compacted:
    """The command's compaction was written and its events published."""

    plan: CompactionPlan


@dataclass(frozen=True)
class Noop:
    """Nothing to do (``under_budget``, ``nothing_to_compress``, or an operator
    request's reason); a ``noop`` completion was published."""

    reason: str


@dataclass(frozen=True)
class Replayed:
    """The compaction id was applied before: its events were published again."""


CommandOutcome = Compacted | Noop | Replayed | Failed
"""What one command came to (``Failed`` as the compactor or the store said)."""


@dataclass(frozen=True)
class _Written:
    """A plan applied now, with the outbox written beside it."""

    planned: Planned
    outbox: CompactionOutbox


_Finished = _Written | AlreadyApplied | Unchanged | Failed
"""A command planned and, when there was a plan, written: what ``_settle`` settles."""


def _fields(command: CompactionCommand) -> dict[str, str]:
    """The structured log fields of a command (JSON logs, streams.logs)."""
    return {"conversation_id": command.conversation_key, "compaction_id": command.compaction_id}


def _not_restored(plan: CompactionPlan) -> str:
    left = plan.not_restored_message_ids
    return f", {len(left)} did not fit the budget and stay summarised" if left else ""


class Processor:
    """Runs one command: asks the store once, has the compactor plan, applies the
    plan with the events it publishes in one transaction, then relays them."""

    def __init__(
        self,
        *,
        runtime: CompactionPorts,
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
        self._rejections = GateRejections(publisher, metrics)

    async def compact(self, command: CompactionCommand) -> CommandOutcome:
        """Run the command; one that failed because the provider was down waits for
        it to answer (``Compactor.provider_answers``) and goes again, for as long
        as the command is not yet due to be re-sent: back the moment the provider
        is, instead of after ``command_timeout_seconds`` and reconciliation."""
        outcome = await self._compact_once(command)
        while isinstance(outcome, Failed) and outcome.provider_down_at is not None:
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

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    async def _compact_once(self, command: CompactionCommand) -> CommandOutcome:
        inputs = await self._runtime.history.compaction_inputs(
            command.compaction_id, command.conversation_key, up_to_seq=command.up_to_seq
        )
        if inputs.applied:
            return await self._replayed(command)
        if command.action == "compact" and not compaction_due(inputs.total, self._budget):
            return await self._complete_without_compaction(command, "under_budget")
        self._metrics.observe_history_at_compaction(inputs.total, self._budget.budget_tokens)
        pinned = pinned_tokens(inputs.stored_tokens, inputs.history)
        pinned_over_budget(
            command.conversation_key, pinned, self._budget.budget_tokens, self._metrics
        )
        metrics = self._metrics
        metrics.compactions_started.inc()
        metrics.in_flight.inc()
        try:
            finished = await self._plan_and_write(command, inputs)
        finally:
            metrics.in_flight.dec()
        return await self._settle(command, finished)

    async def _plan_and_write(
        self, command: CompactionCommand, inputs: CompactionInputs
    ) -> _Finished:
        """The command planned and, when there is a plan, written with its outbox."""
        planned = await self._ask_compactor(command, inputs.history)
        if not isinstance(planned, Planned):
            return planned
        written = await self._write(command, inputs, planned)
        if not isinstance(written, Rejected):
            return written
        fallback = next_safe_strategy(planned.plan, command.action)
        await self._rejections.report(command, planned.plan, written, fallback, self._now())
        if fallback is None:
            return Failed("gate_rejected", f"rejected by the gate: {written.detail}")
        key, compaction_id = command.conversation_key, command.compaction_id
        compactor = self._runtime.compactor
        again = await compactor.plan(
            inputs.history, key, compaction_id=compaction_id, fallback=True
        )
        if not isinstance(again, Planned):
            return again
        rewritten = await self._write(command, inputs, again)
        if isinstance(rewritten, Rejected):
            await self._rejections.report(command, again.plan, rewritten, None, self._now())
            return Failed("gate_rejected", f"rejected by the gate: {rewritten.detail}")
        return rewritten

    async def _write(
        self, command: CompactionCommand, inputs: CompactionInputs, planned: Planned
    ) -> _Written | AlreadyApplied | Rejected | Failed:
        self._metrics.llm_tokens.labels("input").inc(planned.llm_input_tokens)
        self._metrics.llm_tokens.labels("output").inc(planned.llm_output_tokens)
        outbox = compaction_outbox(command, inputs, planned.plan, self._now())
        written = await write_plan(self._runtime.compactions, planned.plan, outbox)
        if isinstance(written, Failed):
            # Its LLM calls were spent all the same: counted (``_record_spend``).
            return replace(written, usage=planned.plan.usage)
        return _Written(planned, outbox) if isinstance(written, Applied) else written

    async def _ask_compactor(
        self, command: CompactionCommand, history: Sequence[ConversationMessage]
    ) -> PlanOutcome:
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

    async def _settle(self, command: CompactionCommand, finished: _Finished) -> CommandOutcome:
        """What a finished compaction means: publish its events, or say why not."""
        match finished:
            case Failed() as failed:
                await self._record_spend(command, failed)
                return self._failed(command, failed)
            case AlreadyApplied():
                return await self._replayed(command)
            case Unchanged(reason=reason, over_target=over_target):
                if over_target:
                    self._metrics.compactions_over_target.inc()
                detail = reason if command.action != "compact" else None
                return await self._complete_without_compaction(
                    command, "nothing_to_compress", detail
                )
            case _Written(planned=planned, outbox=outbox):
                if planned.over_target is not None:
                    self._metrics.compactions_over_target.inc()
                if planned.plan.changes_nothing:
                    # Its events stay in the outbox for the relay timer.
                    return await self._complete_without_compaction(command, "nothing_to_compress")
                await self._relay.send(command.compaction_id, outbox.records)
                return self._compacted(command, planned.plan)

    def _compacted(self, command: CompactionCommand, plan: CompactionPlan) -> Compacted:
        metrics = self._metrics
        metrics.compactions_succeeded.inc()
        metrics.count_usage(plan.usage)
        issued = (self._now() - command.issued_at).total_seconds()
        metrics.compaction_latency.observe(max(0.0, issued))
        if command.action != "compact":
            metrics.operator_requests.labels(command.action, "applied").inc()
            log.info(
                "%s %s of %s (request %s) applied: %d batches, %d turns restored%s",
                command.action, command.compaction_id, command.conversation_key,
                command.request_id, len(plan.new_batches), len(plan.restored_message_ids),
                _not_restored(plan), extra=_fields(command),
            )  # fmt: skip
        return Compacted(plan)

    async def _record_spend(self, command: CompactionCommand, failed: Failed) -> None:
        """A failed compaction's LLM spend, in a content-free usage row: a
        compaction failing at every attempt is not free for its tenant's
        ``llm_tokens_per_day``. Not recorded when it cannot be (the store is
        away): the failure is what is reported, and the next attempt goes on."""
        usage = failed.usage
        if usage is None or usage.calls == 0:
            return
        self._metrics.count_usage(usage)
        tenant = tenant_of(command.conversation_key)
        try:
            await self._runtime.usage.record_failed_spend(tenant, usage, self._now().date())
        except Exception as error:
            log.warning(
                "the LLM spend of failed compaction %s was not recorded: %s",
                command.compaction_id, error, extra=_fields(command),
            )  # fmt: skip

    def _failed(self, command: CompactionCommand, failed: Failed) -> Failed:
        self._metrics.compactions_failed.labels(failed.kind).inc()
        # A provider outage fails every compaction at once; the guard has said so.
        provider_down = failed.provider_down_at is not None
        level = logging.INFO if provider_down else logging.WARNING
        then = "again once the provider answers" if provider_down else "reconciliation retries it"
        log.log(
            level,
            "compaction %s of %s failed, history unchanged; %s: %s",
            command.compaction_id,
            command.conversation_key,
            then,
            failed.detail,
            extra=_fields(command),
        )
        if command.action != "compact":
            self._metrics.operator_requests.labels(command.action, "failed").inc()
        return failed

    async def _replayed(self, command: CompactionCommand) -> Replayed:
        self._metrics.compactions_noop.labels("replayed").inc()
        await self._relay.republish(command.compaction_id)
        return Replayed()

    async def _complete_without_compaction(
        self, command: CompactionCommand, reason: str, detail: str | None = None
    ) -> Noop:
        self._metrics.compactions_noop.labels(reason).inc()
        if command.action != "compact":
            self._metrics.operator_requests.labels(command.action, "noop").inc()
        noop = completion(command, self._now())
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
        return Noop(detail or reason)


async def write_plan(
    store: CompactionStore, plan: CompactionPlan, outbox: CompactionOutbox | None = None
) -> Applied | AlreadyApplied | Rejected | Failed:
    """Write ``plan`` (and ``outbox``) in one transaction. On any failure the
    history stays exactly as it was and ``Failed`` says why."""
    try:
        return await store.apply_compaction(plan, outbox)
    except HistoryConflictError as error:
        log.warning(
            "compaction %s of %s conflicted: %s",
            plan.compaction_id,
            plan.conversation_id,
            error,
            extra={"conversation_id": plan.conversation_id, "compaction_id": plan.compaction_id},
        )
        return Failed("history_conflict", f"history changed during compaction: {error}")
    except Exception as error:
        return Failed(failure_kind(error), f"{type(error).__name__}: {error}")
