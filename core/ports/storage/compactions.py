"""What one compaction writes, in one transaction, and whether it was written."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from core.domain.compaction import CompactionPlan
from core.domain.gate import Rejected
from core.ports.storage.outbox import CompactionOutbox


@dataclass(frozen=True)
class Applied:
    """``apply_compaction`` wrote the compaction now."""


@dataclass(frozen=True)
class AlreadyApplied:
    """``apply_compaction`` found the compaction id recorded: a replay, nothing written."""


ApplyOutcome = Applied | AlreadyApplied | Rejected
"""What ``apply_compaction`` did; ``Rejected``: the gate (``core.domain.gate``) refused
the plan inside the transaction, which rolled back (the history is as it was)."""


@dataclass(frozen=True)
class RejectionRecord:
    """One refused compaction as stored: which, by which summariser, why, when."""

    compaction_id: str
    summarizer: str
    reason: str
    detail: str
    rejected_at: datetime


class CompactionStore(Protocol):
    async def apply_compaction(
        self, plan: CompactionPlan, outbox: CompactionOutbox | None = None
    ) -> ApplyOutcome:
        """Archive (with the plan's vectors), supersede, delete, restore, insert the
        clip-archive and write ``outbox.records``, in one transaction. A
        compaction id already recorded writes nothing (``AlreadyApplied``). A plan
        the gate refuses (``core.domain.gate.check_compaction``, run on the rows
        the transaction removes and keeps) writes nothing but its rejection
        (``Rejected``; listed by ``CompactionLedger.rejections``).

        Raises ``HistoryConflictError`` (and writes nothing) when the plan's
        messages are no longer all there, or when the stored token counts of
        the rows it removes and adds are not ``outbox.tokens``.
        """
        ...


class CompactionLedger(Protocol):
    async def compaction_applied(self, compaction_id: str) -> bool:
        """Whether the compaction id is recorded (applied, and not erased since)."""
        ...

    async def rejections(self, conversation_id: str, limit: int = 50) -> list[RejectionRecord]:
        """The conversation's compactions the gate refused, newest first."""
        ...


class Pins(Protocol):
    async def set_pinned(self, conversation_id: str, message_id: str, pinned: bool) -> bool:
        """Pin (or unpin) a stored message of the conversation; False when it has no
        such live message (compacted, erased, never sent). Idempotent."""
        ...

    async def pinned_tokens(self, conversation_id: str) -> int:
        """The stored tokens of the conversation's pinned messages."""
        ...


class Compactions(CompactionStore, CompactionLedger, Pins, Protocol):
    """The compactions role: what a store implements (``Storage.compactions``)."""
