"""The compactor's plan applied to a store the way the processor applies it
(``streams.worker.processor.apply_plan``), without the events: for tests of
what a compaction leaves in storage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.compactor import PipelineCompactor, create_compactor
from core.domain.compaction import CompactionResult
from core.domain.messages import ConversationMessage
from core.ports.storage import MessageStore
from streams.worker.processor import apply_plan


class PlanAndApply:
    def __init__(self, compactor: PipelineCompactor, store: MessageStore) -> None:
        self.compactor = compactor
        self.store = store

    async def compress(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str | None = None,
    ) -> CompactionResult:
        """As the processor does: a compaction id already applied is not planned
        again (no LLM spend on a replay), anything else is planned, then applied."""
        if compaction_id is not None and await self.store.compaction_applied(compaction_id):
            return CompactionResult(
                history=tuple(history),
                compaction_id=compaction_id,
                already_applied=True,
                reason="compaction already applied",
            )
        planned = await self.compactor.plan(history, conversation_id, compaction_id=compaction_id)
        return await apply_plan(self.store, planned, history)

    def __getattr__(self, name: str) -> Any:  # breaker, provider_guard, ...
        return getattr(self.compactor, name)


def applying_compactor(*, store: Any, **options: Any) -> PlanAndApply:
    """``create_compactor(memory_store=store, **options)``, applied to ``store``."""
    return PlanAndApply(create_compactor(memory_store=store, **options), store)
