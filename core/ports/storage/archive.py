"""The archive: the batches compactions wrote and the raw turns behind them."""

from __future__ import annotations

from typing import Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from core.domain.compaction import StoredBatch
from core.domain.messages import ConversationMessage
from core.domain.strategies import StrategyFreed
from core.domain.usage import LlmUsage
from core.ports.storage.reads import MessageKey, ReadScope


class ExpandedBatch(BaseModel):
    """A batch with every raw turn it covers, in conversation order (un-compacted).

    ``turns_missing`` counts covered turns no longer archived: removed by
    ``[archive].raw_retention_days``, or compacted before raw turns were kept.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: StoredBatch
    turns: tuple[ConversationMessage, ...]
    turns_missing: int
    turn_tokens: dict[str, int] = Field(default_factory=dict)  # stored count of each turn


class CompactedBatch(BaseModel):
    """A batch as a compaction archived it (its summary is read with ``expand_batch``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_id: str
    label: str
    depth: int
    start_time: AwareDatetime
    end_time: AwareDatetime
    message_count: int
    superseded_by: str | None


class CompactionRecord(BaseModel):
    """One applied compaction of a conversation, as ``compactions`` recorded it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compaction_id: str
    created_at: AwareDatetime
    messages_compressed: int
    batches_created: int
    tokens_before: int
    tokens_after: int
    usage: LlmUsage | None = None  # None: recorded before usage was (migration 0012)
    batches: tuple[CompactedBatch, ...] = ()
    # The strategies that ran, in order, and what each freed (empty: recorded before
    # migration 0015, or by a previous release).
    strategies: tuple[StrategyFreed, ...] = ()


class MemoryReader(Protocol):
    """What a compaction reads of the archive: the live batches, one batch's turns."""

    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        """Batches not superseded, oldest first: what the clip-archive shows."""
        ...

    async def expand_batch(
        self,
        conversation_id: str,
        batch_id: str,
        *,
        scope: ReadScope | None = None,
        after: MessageKey | None = None,
        limit: int | None = None,
    ) -> ExpandedBatch | None:
        """The batch with all its archived raw turns in order; None if unknown
        (or outside ``scope``). ``after`` / ``limit``: one page of the turns, as
        ``load_history`` (``turns_missing`` still counts the whole batch)."""
        ...


class CompactionLogReader(Protocol):
    async def compaction_log(
        self, conversation_id: str, *, scope: ReadScope | None = None
    ) -> list[CompactionRecord]:
        """The conversation's applied compactions, oldest first, each with the batches
        it archived (empty when unknown, or outside ``scope``): read-only, for the
        inspector page."""
        ...


class RawTurnRetention(Protocol):
    async def expire_raw_turns(self) -> int:
        """Remove archived raw turns older than the store's retention (none when it
        is 0 = forever); the number removed. Bounded per call and cheap, for a timer;
        a database error is logged and counts as 0."""
        ...


class Archive(MemoryReader, CompactionLogReader, RawTurnRetention, Protocol):
    """The archive role: what a store implements (``Storage.archive``)."""
