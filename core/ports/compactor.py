"""The compactor as the worker sees it: history in, a plan out, nothing written.

The processor (``streams.worker.processor``) applies the plan with the store's
``apply_compaction`` in one transaction, together with the events it builds;
keeping the write out of the compactor leaves one place that decides what a
compaction publishes and one that asks whether it was applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from core.domain.compaction import CompactionResult
from core.domain.messages import ConversationMessage


class Compactor(Protocol):
    async def plan(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str | None = None,
        fallback: bool = False,
    ) -> CompactionResult:
        """The compaction of ``history`` as a plan (``CompactionResult.plan``), or
        the history back unchanged with the reason (failed, nothing to compress).
        ``fallback``: with the local fallback summariser instead of the LLM (the
        tenant's LLM budget for the day is spent)."""
        ...
