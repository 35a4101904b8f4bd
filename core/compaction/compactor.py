"""``PipelineCompactor``: the ``Compactor`` port over the pipeline.

History in, an outcome out (``Planned``, ``Unchanged`` or ``Failed``),
nothing written: every LLM call happens before any write, and a failed call
leaves no plan. Every call goes through the worker's one ``ProviderGuard``,
so a provider outage is met once for the whole worker rather than once per
conversation. Build it with ``core.compaction.factory.create_compactor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from core.compaction.attempt import Attempts
from core.compaction.batches import CompactionIds
from core.compaction.embedding import with_embeddings
from core.compaction.pipeline import Pipeline
from core.compaction.redo import Redo
from core.compaction.summarizer import LlmSpend, Summarizer
from core.domain.circuit import CircuitBreaker
from core.domain.compaction import Planned, PlanOutcome, Unchanged
from core.domain.messages import ConversationMessage
from core.ports.embedding import Embedder
from core.provider_guard import ProviderGuard


class PipelineCompactor:
    def __init__(
        self,
        *,
        pipeline: Pipeline,
        attempts: Attempts,
        summarizer: Summarizer,
        fallback: Summarizer | None,
        embedder: Embedder | None,
    ) -> None:
        """``fallback``: the summariser of a tenant whose LLM budget for the day is
        spent (local: it neither takes a provider slot nor waits out an outage)."""
        self._pipeline = pipeline
        self._attempts = attempts
        self._summarizer = summarizer
        self._fallback = fallback
        self._embedder = embedder
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

        async def step(calls: LlmSpend) -> Planned | Unchanged:
            return await self._pipeline.compaction(found, ids, calls, summarizer)

        outcome = await self._attempts.run(
            ids, step, summarizer, fallback=summarizer is self._fallback
        )
        return await self._embedded(outcome, found)

    async def recompact(
        self, history: Sequence[ConversationMessage], conversation_id: str, *, compaction_id: str
    ) -> PlanOutcome:
        found = tuple(history)
        ids = CompactionIds(conversation_id, compaction_id)

        async def step(calls: LlmSpend) -> Planned | Unchanged:
            return await self._redo.recompact(found, ids, calls)

        outcome = await self._attempts.run(ids, step, self._summarizer)
        return await self._embedded(outcome, found)

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

        async def step(calls: LlmSpend) -> Planned | Unchanged:
            return await self._redo.restore(found, ids, batch_id, calls)

        outcome = await self._attempts.run(ids, step, self._summarizer)
        return await self._embedded(outcome, found)

    async def provider_answers(self, since: int) -> None:
        """Return once the provider answered after a compaction failed with
        ``provider_down_at=since`` (``ProviderGuard.until_answering``)."""
        await self.provider_guard.until_answering(since)

    async def _embedded(
        self, outcome: PlanOutcome, history: tuple[ConversationMessage, ...]
    ) -> PlanOutcome:
        if not isinstance(outcome, Planned):
            return outcome
        plan = await with_embeddings(self._embedder, outcome.plan, history)
        return replace(outcome, plan=plan)
