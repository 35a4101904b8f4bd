"""``PipelineCompactor``: the ``Compactor`` port over the pipeline.

History in, an outcome out (``Planned``, ``Unchanged`` or ``Failed``),
nothing written: every LLM call happens before any write, and a failed call
leaves no plan. Every call goes through the worker's one ``ProviderGuard``,
so a provider outage is met once for the whole worker rather than once per
conversation. Build it with ``core.compaction.factory.create_compactor``.

Each method is the same glue: the planning (``Pipeline`` or ``Redo``, its LLM
calls counted and priced in an ``LlmSpend``) run as one attempt under the
conversation's circuit breaker (``Attempts``), then the plan given its vectors
(``embedding.with_embeddings``; none without an embedder).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from core.compaction.attempt import Attempts
from core.compaction.batches import CompactionIds
from core.compaction.embedding import with_embeddings
from core.compaction.pipeline import Pipeline
from core.compaction.redo import Redo
from core.compaction.spend import LlmSpend
from core.compaction.summarizer import Summarizer
from core.domain.circuit import CircuitBreaker
from core.domain.compaction import Planned, PlanOutcome, Unchanged
from core.domain.messages import ConversationMessage
from core.domain.tenancy import tenant_of
from core.domain.tokens import TokenCounter
from core.domain.usage import ModelPrice
from core.ports.embedding import Embedder
from core.provider_guard import ProviderGuard

Planning = Callable[[LlmSpend], Awaitable[Planned | Unchanged]]
"""A compaction's planning, its LLM calls added up in the ``LlmSpend`` it is given."""


class PipelineCompactor:
    def __init__(
        self,
        *,
        pipeline: Pipeline,
        attempts: Attempts,
        summarizer: Summarizer,
        fallback: Summarizer | None,
        embedder: Embedder | None,
        prices: Mapping[str, ModelPrice],
    ) -> None:
        """``fallback``: the summariser of a tenant whose LLM budget for the day is
        spent (local: it neither takes a provider slot nor waits out an outage);
        ``prices``: what a plan's LLM spend is priced with."""
        self._pipeline = pipeline
        self._attempts = attempts
        self._summarizer = summarizer
        self._fallback = fallback
        self._embedder = embedder
        self._prices = prices
        self._redo = Redo(pipeline, pipeline.memory, summarizer)

    @property
    def breaker(self) -> CircuitBreaker:
        return self._attempts.breaker

    @property
    def provider_guard(self) -> ProviderGuard:
        return self._attempts.guard

    @property
    def target_tokens(self) -> int | None:
        """What every compaction must leave the history at or under (None: no target)."""
        return self._pipeline.fitter.target

    @property
    def counter(self) -> TokenCounter:
        """What it counts tokens with; ingest counts new messages with it too."""
        return self._pipeline.counter

    async def plan(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str,
        fallback: bool = False,
    ) -> PlanOutcome:
        """The compaction of ``history``. Whether ``compaction_id`` was applied is
        the caller's question (it asks the store once, before planning).
        ``fallback``: summarise with the local fallback summariser (a tenant's
        LLM budget is spent), when the compactor has one."""
        found = tuple(history)
        summarizer = self._fallback if fallback and self._fallback else self._summarizer
        ids = CompactionIds(conversation_id, compaction_id)

        async def planning(calls: LlmSpend) -> Planned | Unchanged:
            return await self._pipeline.compaction(found, ids, calls, summarizer)

        return await self._one_attempt(ids, planning, found, summarizer)

    async def recompact(
        self, history: Sequence[ConversationMessage], conversation_id: str, *, compaction_id: str
    ) -> PlanOutcome:
        found = tuple(history)
        ids = CompactionIds(conversation_id, compaction_id)

        async def planning(calls: LlmSpend) -> Planned | Unchanged:
            return await self._redo.recompact(found, ids, calls)

        return await self._one_attempt(ids, planning, found, self._summarizer)

    async def restore(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str,
        batch_id: str | None = None,
    ) -> PlanOutcome:
        found = tuple(history)
        ids = CompactionIds(conversation_id, compaction_id)

        async def planning(calls: LlmSpend) -> Planned | Unchanged:
            return await self._redo.restore(found, ids, batch_id, calls)

        return await self._one_attempt(ids, planning, found, self._summarizer)

    async def provider_answers(self, since: int) -> None:
        """Return once the provider answered after a compaction failed with
        ``provider_down_at=since`` (``ProviderGuard.until_answering``)."""
        await self.provider_guard.until_answering(since)

    async def _one_attempt(
        self,
        ids: CompactionIds,
        planning: Planning,
        history: tuple[ConversationMessage, ...],
        summarizer: Summarizer,
    ) -> PlanOutcome:
        """The planning as one attempt under the conversation's breaker, its LLM calls
        counted by ``summarizer`` and priced; a plan then gets its vectors (none
        without an embedder)."""
        calls = LlmSpend(
            summarizer=summarizer.provider, model=summarizer.model_name,
            tenant=tenant_of(ids.conversation_id), prices=self._prices,
            fallback=summarizer is self._fallback,
        )  # fmt: skip
        outcome = await self._attempts.run(ids, lambda: planning(calls), calls)
        if not isinstance(outcome, Planned):
            return outcome
        plan = outcome.plan.model_copy(update={"instructions": summarizer.instructions})
        plan = await with_embeddings(self._embedder, plan, history)
        return replace(outcome, plan=plan)
