"""One planning attempt under the conversation's circuit breaker, and whom a
failure is blamed on: the wrapper around the planning, which it neither plans
nor prices.

If any LLM call fails there is no plan: the caller gets ``Failed`` and its
history stays as it was (context-compaction.AC1.7). A failure counts against
the conversation's breaker only when it is the conversation's; a provider
outage is the provider guard's business (``core.provider_guard``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.compaction.batches import CompactionIds
from core.compaction.spend import LlmSpend
from core.domain.circuit import CircuitBreaker, DuringOutage
from core.domain.compaction import Failed, FailureKind, Planned, PlanOutcome, Unchanged
from core.ports.model import (
    ModelAuthError,
    ModelError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
    ModelUnreadableError,
)
from core.ports.storage import HistoryConflictError, StoreUnavailable
from core.provider_guard import ProviderGuard, ProviderUnavailableError

log = logging.getLogger("compactor")

Step = Callable[[], Awaitable[Planned | Unchanged]]
"""What one attempt runs: the planning."""

_KINDS: tuple[tuple[type[Exception], FailureKind], ...] = (
    (ProviderUnavailableError, "provider_unavailable"),  # a ModelError: first
    (ModelRateLimitError, "rate_limited"),
    (ModelAuthError, "model_auth"),
    (ModelTimeoutError, "model_timeout"),
    (ModelUnreadableError, "model_response"),  # a ModelServerError: first
    (ModelServerError, "model_server"),
    (ModelResponseError, "model_response"),
    (ModelError, "model_error"),
    (HistoryConflictError, "history_conflict"),
    (StoreUnavailable, "store_unavailable"),
)


def failure_kind(error: Exception) -> FailureKind:
    """The word for what failed: a stable metric label, whatever the message says."""
    return next((kind for cls, kind in _KINDS if isinstance(error, cls)), "error")


@dataclass(frozen=True)
class Attempts:
    """Runs planning steps under the per-conversation ``breaker``; ``guard`` is
    the worker's one provider guard, whose answer count tells an outage from a
    request the provider chokes on."""

    breaker: CircuitBreaker
    guard: ProviderGuard

    async def run(self, ids: CompactionIds, step: Step, calls: LlmSpend) -> PlanOutcome:
        """``step`` once: a failure is ``Failed`` (``provider_down_at`` when the
        provider was down), ``Unchanged`` and ``Planned`` are returned as they are.
        ``calls``: what the step's LLM calls add up to (when they first failed)."""
        conversation_id = ids.conversation_id
        refused = self._refused(conversation_id)
        if refused is not None:
            return refused
        started = time.perf_counter()
        try:
            outcome = await step()
        except asyncio.CancelledError:
            self.breaker.release(conversation_id)
            raise
        except Exception as error:
            return self._failed(error, ids, calls)
        if isinstance(outcome, Unchanged):
            self.breaker.release(conversation_id)
            return outcome
        self.breaker.record_success(conversation_id)
        _log_planned(outcome, time.perf_counter() - started)
        return outcome

    def _refused(self, conversation_id: str) -> Failed | None:
        """``None`` when the conversation's breaker lets an attempt go. A circuit
        opened during a provider outage is released once the provider answers
        again; until then its refusal waits for the provider
        (``provider_down_at``), not for reconciliation."""
        outage = self.breaker.outage_of(conversation_id)
        if outage is not None and self.guard.answering_since(outage.answers):
            self.breaker.end_outage(conversation_id)
        if self.breaker.try_acquire(conversation_id):
            return None
        retry_in = self.breaker.retry_in(conversation_id)
        outage = self.breaker.outage_of(conversation_id)
        if outage is None:
            return Failed("circuit_open", f"circuit open: retry in {retry_in:.0f}s")
        detail = f"circuit open until the provider answers again (at most {retry_in:.0f}s)"
        return Failed("circuit_open", detail, provider_down_at=outage.answers)

    def _failed(self, error: Exception, ids: CompactionIds, calls: LlmSpend) -> Failed:
        answers = self.guard.successes
        provider_down = answers if self._blame(error, ids.conversation_id, calls) else None
        # Refusals come by the thousand in an outage; the guard logs the outage once.
        log.log(
            logging.INFO if isinstance(error, ProviderUnavailableError) else logging.WARNING,
            "compaction %s of %s failed, history left unchanged: %s: %s",
            ids.compaction_id,
            ids.conversation_id,
            type(error).__name__,
            error,
        )
        detail = f"{type(error).__name__}: {error}"
        return Failed(failure_kind(error), detail, provider_down_at=provider_down)

    def _blame(self, error: Exception, conversation_id: str, calls: LlmSpend) -> bool:
        """Count a failure against the conversation's breaker only when it is the
        conversation's: a provider outage is the provider guard's business, and
        counting it against every conversation would shut them all out for a
        cool-down after the provider is back. ``True`` for a provider outage.

        Rate limits, refusals by the guard and a rejected key are never the
        conversation's. A 5xx, a timeout, a broken connection or a body that is
        no response (a proxy's HTML page) is, when other calls got answers
        while this compaction's kept failing (its request is the trouble: too
        large, or one the provider chokes on); otherwise it is an outage. A
        failure held against the conversation while the provider is failing
        for everyone (``ProviderGuard.in_outage``) opens its circuit only until
        the provider answers again (``DuringOutage``).
        """
        if isinstance(error, ProviderUnavailableError | ModelRateLimitError | ModelAuthError):
            provider_wide = True
        elif isinstance(error, ModelServerError | ModelTimeoutError):
            first = calls.answers_at_first_failure
            provider_wide = first is None or self.guard.successes <= first
        else:
            provider_wide = False
        if provider_wide:
            self.breaker.release(conversation_id)
        else:
            outage = DuringOutage(self.guard.successes) if self.guard.in_outage() else None
            self.breaker.record_failure(conversation_id, outage)
        return provider_wide


def _log_planned(planned: Planned, elapsed: float) -> None:
    plan = planned.plan
    log.info(
        "planned %s: %d messages into %d batches, %d → %d tokens in %.2fs",
        plan.conversation_id,
        plan.messages_compressed,
        len(plan.new_batches),
        plan.tokens_estimate_before,
        plan.tokens_estimate_after,
        elapsed,
    )
    if planned.over_target is not None:
        log.warning("compaction of %s: %s", plan.conversation_id, planned.over_target)
