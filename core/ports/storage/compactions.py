"""What one compaction writes, in one transaction, and whether it was written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.domain.compaction import CompactionPlan
from core.ports.storage.outbox import CompactionOutbox


@dataclass(frozen=True)
class Applied:
    """``apply_compaction`` wrote the compaction now."""


@dataclass(frozen=True)
class AlreadyApplied:
    """``apply_compaction`` found the compaction id recorded: a replay, nothing written."""


class CompactionStore(Protocol):
    async def apply_compaction(
        self, plan: CompactionPlan, outbox: CompactionOutbox | None = None
    ) -> Applied | AlreadyApplied:
        """Archive (with the plan's vectors), supersede, delete, restore, insert the
        clip-archive and write ``outbox.records``, in one transaction. A
        compaction id already recorded writes nothing (``AlreadyApplied``).

        Raises ``HistoryConflictError`` (and writes nothing) when the plan's
        messages are no longer all there, or when the stored token counts of
        the rows it removes and adds are not ``outbox.tokens``.
        """
        ...


class CompactionLedger(Protocol):
    async def compaction_applied(self, compaction_id: str) -> bool:
        """Whether the compaction id is recorded (applied, and not erased since)."""
        ...


class Compactions(CompactionStore, CompactionLedger, Protocol):
    """The compactions role: what a store implements (``Storage.compactions``)."""
