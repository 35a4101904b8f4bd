"""The compactor as the worker sees it: history in, an outcome out, nothing written.

``Planned`` carries the plan, which the processor (``streams.worker.processor``)
applies with the store's ``apply_compaction`` in one transaction, together
with the events it builds; keeping the write out of the compactor leaves one
place that decides what a compaction publishes and one that asks whether it
was applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from core.domain.compaction import PlanOutcome
from core.domain.messages import ConversationMessage


class Compactor(Protocol):
    async def plan(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str,
        fallback: bool = False,
    ) -> PlanOutcome:
        """The compaction of ``history``: ``Planned``, ``Unchanged`` (nothing to
        compress) or ``Failed``, with why.
        ``fallback``: with the local fallback summariser instead of the LLM (the
        tenant's LLM budget for the day is spent)."""
        ...

    async def recompact(
        self, history: Sequence[ConversationMessage], conversation_id: str, *, compaction_id: str
    ) -> PlanOutcome:
        """The live batches re-summarised from their archived raw turns with the
        current prompt, model and settings, as a plan (``compactor recompact``)."""
        ...

    async def restore(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str,
        batch_id: str | None = None,
    ) -> PlanOutcome:
        """A batch's raw turns back in the live history as far as the budget allows,
        as a plan (``compactor restore``)."""
        ...

    async def provider_answers(self, since: int) -> None:
        """Return once the model's provider may be called again: a compaction that
        ``Failed`` with ``provider_down_at=since`` waits here, then goes again."""
        ...
