"""What the compactor and the service need from storage.

Writes are idempotent by message id or compaction id, because every caller
upstream (Kafka) delivers at least once. The worker depends on these ports
only: ``core.storage.postgres.PostgresStore`` implements all of them, and
``tests.support.memory_store.InMemoryStore`` does too, so the worker's
components can be tested without a database.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict

from core.compaction import AppliedStats, CompactionPlan, OutboxFactory, StoredBatch
from core.messages import ConversationMessage

ApplyOutcome = Literal["applied", "already_applied"]


class ApplyResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: ApplyOutcome
    stats: AppliedStats | None = None  # None when already applied


class OutboxRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    compaction_id: str
    topic: str
    key: str
    payload: str


class HistoryConflictError(Exception):
    """The history a plan was computed from changed before it could be applied
    (a message it meant to delete is gone). Nothing was written."""


class MemoryHit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_id: str
    label: str
    conversation_id: str
    content: str
    depth: int
    start_time: AwareDatetime
    end_time: AwareDatetime
    message_count: int
    score: float  # fused reciprocal-rank score, higher is better
    text_rank: int | None  # 1-based rank in full-text results, None if absent
    vector_rank: int | None  # 1-based rank in vector results, None if absent
    superseded: bool


class MemorySearchResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    hits: tuple[MemoryHit, ...]
    mode: Literal["hybrid", "full_text"]  # full_text when no embedder is configured


class MessageStore(Protocol):
    async def save_message(self, message: ConversationMessage, token_estimate: int) -> bool:
        """Insert once; ``False`` when that message id was already stored."""
        ...

    async def load_history(
        self,
        conversation_id: str,
        *,
        as_of: datetime | None = None,
        up_to_seq: int | None = None,
    ) -> list[ConversationMessage]:
        """The conversation in model order: clip-archive first, then by time.

        ``up_to_seq`` excludes messages stored after that arrival number, so a
        compaction never touches messages that arrived after its command;
        ``as_of`` does the same by ``created_at``.
        """
        ...

    async def compaction_applied(self, compaction_id: str) -> bool: ...

    async def apply_compaction(
        self, plan: CompactionPlan, outbox: OutboxFactory | None = None
    ) -> ApplyResult:
        """Archive, supersede, delete, insert the clip-archive and write the
        outbox rows ``outbox`` makes from the measured stats, in one transaction.

        Raises ``HistoryConflictError`` (and writes nothing) when the plan's
        messages are no longer all there.
        """
        ...


class MemoryStore(Protocol):
    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        """Batches not superseded, oldest first: what the clip-archive shows."""
        ...

    async def memory_read(
        self, query: str, conversation_id: str | None = None, limit: int = 5
    ) -> MemorySearchResult: ...


class OutboxStore(Protocol):
    """The transactional outbox: events written with a compaction, published after it."""

    async def pending_outbox(
        self, *, compaction_id: str | None = None, limit: int = 100
    ) -> list[OutboxRow]:
        """Unpublished rows, oldest first (optionally of one compaction)."""
        ...

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        """Every row of one compaction, published or not, in order."""
        ...

    async def mark_published(self, ids: Sequence[int]) -> None:
        """A row published before keeps its first time."""
        ...


class TallySource(Protocol):
    """The store's own counts, which the token table caches."""

    async def conversation_totals(self, conversation_id: str) -> tuple[int, int]:
        """(estimated tokens, rows) of the conversation as the model would now see it."""
        ...

    async def conversation_token_total(self, conversation_id: str) -> int: ...

    async def last_seq(self, conversation_id: str) -> int | None:
        """The arrival number of the newest message: a compaction's as-of cut."""
        ...

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        """(conversation, tokens) of every conversation over ``threshold``, largest first:
        what reconciliation compares the table with."""
        ...


class WorkerStore(MessageStore, MemoryStore, OutboxStore, TallySource, Protocol):
    """Everything the streaming worker asks of storage."""

    async def close(self) -> None: ...
