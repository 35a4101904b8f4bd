"""What the compactor and the service need from storage, and the errors a store raises.

Writes are idempotent by message id or compaction id, because every caller
upstream (Kafka) delivers at least once. The worker depends on these ports
only: ``core.adapters.postgres.store.PostgresStore`` implements all of them, and
``tests.support.memory_store.InMemoryStore`` does too, so the worker's
components run the same code path against either.

A store raises the errors below and nothing of its driver: the worker's retry
policy (``streams.worker.retry``) decides on these types alone, the way httpx
maps every transport's exceptions to its own at the edge.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict

from core.domain.compaction import AppliedStats, CompactionPlan, StoredBatch
from core.domain.messages import ConversationMessage


class StoreError(Exception):
    """Base of every error a store raises on purpose."""


class StoreUnavailable(StoreError):
    """The store could not be reached or is restarting (connection refused or lost,
    server shutting down or starting up, too many connections, a timeout).
    Nothing is known to have been written; the same call may succeed later."""


class StoreConflict(StoreError):
    """The call contradicts what is stored; nothing was written. Retrying the same
    call gives the same answer."""


class HistoryConflictError(StoreConflict):
    """The history a plan was computed from changed before it could be applied
    (a message it meant to delete is gone). Nothing was written."""


class TenantConflictError(StoreConflict):
    """A message claims a tenant other than its conversation's. Nothing was written."""


ApplyOutcome = Literal["applied", "already_applied"]


class ApplyResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: ApplyOutcome
    stats: AppliedStats | None = None  # None when already applied


class OutboxRecord(BaseModel):
    """An event to publish once the compaction that produced it has committed.

    ``topic`` is the service's logical name for the destination (it maps it to
    a real topic), so a change of topic prefix does not strand unpublished rows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    key: str
    payload: str


OutboxBuilder = Callable[[AppliedStats], Sequence[OutboxRecord]]
"""The outbox records of one compaction, made from the stats its transaction
measured (the completion carries the stored token counts it removed)."""


@dataclass(frozen=True)
class CompactionInputs:
    """What the processor needs before it plans, read from one snapshot."""

    applied: bool  # the compaction id is already recorded
    total: int  # the conversation's stored token total
    history: list[ConversationMessage]  # in model order, up to the command's cut


class OutboxRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    compaction_id: str
    topic: str
    key: str
    payload: str


@dataclass(frozen=True)
class IncomingMessage:
    """A message to store, with its token count and the tenant it claims."""

    message: ConversationMessage
    tokens: int
    tenant_id: str | None = None


SaveStatus = Literal["inserted", "duplicate", "tenant_conflict"]


@dataclass(frozen=True)
class SaveOutcome:
    status: SaveStatus
    seq: int | None = None  # the arrival number, when inserted


@dataclass(frozen=True)
class StoreTotals:
    """A conversation as the model would now see it, and its newest arrival."""

    tokens: int = 0
    rows: int = 0
    last_seq: int | None = None


SearchSources = Literal["both", "summaries", "raw"]
"""What ``memory_read`` ranks: archived summaries, archived raw turns, or both."""

QueryMode = Literal["plain", "websearch"]
"""``plain``: the query is text (any term matches, punctuation is ignored);
``websearch``: PostgreSQL's web-search syntax (quoted phrases, ``or``, ``-word``)."""


class TurnHit(BaseModel):
    """An archived raw turn that matched a ``memory_read`` query."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: str
    role: str
    created_at: AwareDatetime
    text: str  # the whole turn, or a snippet around the first match when it is long
    truncated: bool
    score: float  # fused reciprocal-rank score of the turn
    text_rank: int | None  # 1-based rank among matching raw turns (full text)
    vector_rank: int | None  # 1-based rank among raw turns (vectors)


class MemoryHit(BaseModel):
    """One archived batch: its summary and, when they matched, some of its raw turns.

    ``score`` fuses the summary's ranks with its best raw turn's; ``text_rank``
    and ``vector_rank`` are the summary's own (None when only raw turns matched).
    """

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
    turns: tuple[TurnHit, ...] = ()  # matching raw turns, best first


class ExpandedBatch(BaseModel):
    """A batch with every raw turn it covers, in conversation order (un-compacted).

    ``turns_missing`` counts covered turns no longer archived: removed by
    ``[archive].raw_retention_days``, or compacted before raw turns were kept.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: StoredBatch
    turns: tuple[ConversationMessage, ...]
    turns_missing: int


class MemorySearchResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    hits: tuple[MemoryHit, ...]
    mode: Literal["hybrid", "full_text"]  # full_text when no embedder is configured
    sources: SearchSources = "both"
    query_mode: QueryMode = "plain"


class MessageStore(Protocol):
    async def save_message(
        self, message: ConversationMessage, token_estimate: int, *, tenant_id: str | None = None
    ) -> bool:
        """Insert once; ``False`` when that message id was already stored.

        The first message of a conversation fixes its tenant (``tenant_id``, or
        none); a later one with a different ``tenant_id`` raises
        ``TenantConflictError`` and writes nothing.
        """
        ...

    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """``save_message`` for a group, in the group's order, in as few round trips
        as the store can: the accounting agent's hot path. A message whose
        conversation belongs to another tenant is ``tenant_conflict`` and is not
        written; the others are. Within the group, the first claim of a new
        conversation fixes its tenant; a repeated id is a ``duplicate``."""
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

    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> CompactionInputs:
        """Is the compaction applied, the conversation's stored total and its
        history up to ``up_to_seq``: every compaction asks all three, so a store
        answers them together (PostgreSQL: one round trip, one snapshot)."""
        ...

    async def apply_compaction(
        self, plan: CompactionPlan, outbox: OutboxBuilder | None = None
    ) -> ApplyResult:
        """Archive, supersede, delete, insert the clip-archive and write the
        outbox rows ``outbox`` makes from the measured stats, in one transaction.
        A compaction id already recorded writes nothing (``already_applied``).

        Raises ``HistoryConflictError`` (and writes nothing) when the plan's
        messages are no longer all there.
        """
        ...


class MemoryStore(Protocol):
    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        """Batches not superseded, oldest first: what the clip-archive shows."""
        ...

    async def memory_read(
        self,
        query: str,
        conversation_id: str | None = None,
        limit: int = 5,
        *,
        sources: SearchSources = "both",
        mode: QueryMode = "plain",
        tenant_id: str | None = None,
    ) -> MemorySearchResult:
        """Batches ranked by their summaries and their archived raw turns, fused by
        reciprocal rank; each hit carries its matching raw turns. ``tenant_id``
        limits the search to that tenant's conversations (with ``conversation_id``
        too: both must hold)."""
        ...

    async def expand_batch(self, conversation_id: str, batch_id: str) -> ExpandedBatch | None:
        """The batch with all its archived raw turns in order; None if unknown."""
        ...

    async def expire_raw_turns(self) -> int:
        """Remove archived raw turns older than the store's retention (none when it
        is 0 = forever); the number removed. Bounded per call and cheap, for a timer;
        a database error is logged and counts as 0."""
        ...


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

    async def mark_compaction_published(self, compaction_id: str) -> None:
        """Every row of one compaction published (a row published before keeps its
        first time): for a relay that sent the records the compaction built and
        never read their ids back."""
        ...


class TallySource(Protocol):
    """The store's own counts, which the token table caches."""

    async def conversation_totals(self, conversation_id: str) -> tuple[int, int]:
        """(estimated tokens, rows) of the conversation as the model would now see it."""
        ...

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        """``conversation_totals`` and ``last_seq`` of many conversations in one query;
        every id asked for is in the answer (an unknown one with zeros)."""
        ...

    async def conversation_token_total(self, conversation_id: str) -> int: ...

    async def last_seq(self, conversation_id: str) -> int | None:
        """The arrival number of the newest message: a compaction's as-of cut."""
        ...

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        """(conversation, tokens) of every conversation over ``threshold``, largest first:
        what reconciliation compares the table with."""
        ...


class PrivacyStore(Protocol):
    """Tenants and erasure."""

    async def conversation_tenant(self, conversation_id: str) -> str | None:
        """The conversation's tenant; None when it has none or is unknown."""
        ...

    async def erase_conversation(self, conversation_id: str) -> dict[str, int]:
        """Remove every row of the conversation from every table, in one transaction
        under the conversation's lock; rows removed per table. Idempotent."""
        ...


class WorkerStore(MessageStore, MemoryStore, OutboxStore, TallySource, PrivacyStore, Protocol):
    """Everything the streaming worker asks of storage."""

    async def close(self) -> None: ...
