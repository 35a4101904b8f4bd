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

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from core.domain.compaction import CompactionPlan, StoredBatch, StoredTokens
from core.domain.messages import ConversationMessage
from core.domain.usage import LlmUsage, UsageDay


class StoreError(Exception):
    """Base of every error a store raises on purpose."""


class StoreUnavailable(StoreError):
    """The store could not be reached or is restarting (connection refused or lost,
    server shutting down or starting up, too many connections, a timeout).
    Nothing is known to have been written; the same call may succeed later."""


class StoreRejected(StoreError):
    """The store refuses this data (text it cannot hold, a value out of range, a
    string too long for its column); retrying gives the same answer. Nothing was
    written. The worker dead-letters the record at once."""


class StoreConflict(StoreError):
    """The call contradicts what is stored; nothing was written. Retrying the same
    call gives the same answer."""


class HistoryConflictError(StoreConflict):
    """The history a plan was computed from changed before it could be applied
    (a message it meant to delete is gone). Nothing was written."""


class TenantConflictError(StoreConflict):
    """A conversation cannot move to that tenant (it has one already, or the tenant
    has a conversation with that id). Nothing was written."""


@dataclass(frozen=True)
class Applied:
    """``apply_compaction`` wrote the compaction now."""


@dataclass(frozen=True)
class AlreadyApplied:
    """``apply_compaction`` found the compaction id recorded: a replay, nothing written."""


class OutboxRecord(BaseModel):
    """An event to publish once the compaction that produced it has committed.

    ``topic`` is the service's logical name for the destination (it maps it to
    a real topic), so a change of topic prefix does not strand unpublished rows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    key: str
    payload: str


@dataclass(frozen=True)
class CompactionOutbox:
    """What a compaction publishes once committed, written in its transaction: the
    ``records`` in order, and the stored token counts its completion announces
    (``tokens``), which the store checks against the rows it removes and adds."""

    records: tuple[OutboxRecord, ...]
    tokens: StoredTokens


@dataclass(frozen=True)
class CompactionInputs:
    """What the processor needs before it plans, read from one snapshot."""

    applied: bool  # the compaction id is already recorded
    total: int  # the conversation's stored token total
    history: list[ConversationMessage]  # in model order, up to the command's cut
    # message id → its stored token count, for each message of ``history``: what a
    # compaction that removes it takes off the total (``StoredTokens.of``)
    stored_tokens: dict[str, int] = field(default_factory=dict)


class OutboxRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    compaction_id: str
    topic: str
    key: str
    payload: str
    published: bool = False  # the broker acknowledged it once already


@dataclass(frozen=True)
class IncomingMessage:
    """A message to store, with its token count and where it was read (the messages
    topic's partition and offset; None outside Kafka), which the store checks
    against the conversation's erase mark. Its ``conversation_id`` is the
    conversation key (``core.domain.tenancy``), which names its tenant."""

    message: ConversationMessage
    tokens: int
    partition: int | None = None
    offset: int | None = None


SaveStatus = Literal["inserted", "duplicate", "erased"]
"""``erased``: the conversation was erased and this message is covered by the
erase (read at or below the erase's offset mark, or created at or before its
cutoff); nothing of it is written."""


@dataclass(frozen=True)
class Erasure:
    """What an erase records besides deleting: ids, offsets and times, never content."""

    request_id: str
    requester: str
    reason: str
    requested_at: datetime  # also the cutoff: messages created at or before it stay erased
    erased_at: datetime
    # messages-topic partition → the highest offset the erase covers (-1: none)
    offsets: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EraseOutcome:
    """Rows removed per table, the conversation's erase epoch (erases so far) and
    whether this request id had been applied before (``repeated``: then
    ``removed`` and ``erased_at`` are the first application's, from the audit)."""

    removed: dict[str, int]
    epoch: int
    erased_at: datetime
    repeated: bool = False


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
    epoch: int = 0  # erases of this conversation id so far (salts its compaction ids)


@dataclass(frozen=True)
class ReadScope:
    """Whose rows a read on a caller's behalf may see: one tenant's, or every
    tenant's (``ReadScope.everything()``, for a token that is not tenant-bound).

    The HTTP views pass one to every read; a store enforces it beneath the
    query's own filters (PostgreSQL: row-level security, migration 0009), so a
    query that forgets its tenant filter still sees only this scope's rows.
    A conversation without a tenant is visible to ``everything()`` only.
    """

    tenant: str | None = None
    all_tenants: bool = False

    def __post_init__(self) -> None:
        if (self.tenant is None) != self.all_tenants:
            raise ValueError("a ReadScope is one tenant or all tenants, exactly one")

    @classmethod
    def of_tenant(cls, tenant: str) -> ReadScope:
        return cls(tenant=tenant)

    @classmethod
    def everything(cls) -> ReadScope:
        return cls(all_tenants=True)

    def sees(self, tenant: str | None) -> bool:
        """Whether a conversation of ``tenant`` (None: none) is in this scope."""
        return self.all_tenants or (tenant is not None and tenant == self.tenant)


SearchSources = Literal["both", "summaries", "raw"]
"""What ``memory_read`` ranks: archived summaries, archived raw turns, or both."""

QueryMode = Literal["plain", "websearch"]
"""``plain``: the query is text (any term matches, punctuation is ignored);
``websearch``: PostgreSQL's web-search syntax (quoted phrases, ``or``, ``-word``)."""


MatchList = Literal["summary_text", "summary_vector", "raw_text", "raw_vector"]
"""The candidate lists ``memory_read`` fuses: summaries or raw turns, by full text
(ts_rank_cd for summaries, BM25 for raw turns) or by vector (cosine distance)."""


class MatchReason(BaseModel):
    """Why a row matched: one list it is in, its rank there and what matched.

    So a caller can trust or discard a hit: a raw turn at ``raw_text`` rank 1
    holding every query word is strong evidence; one found only by vector at
    rank 40 is a guess.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    via: MatchList
    rank: int  # 1-based, within that list
    score: float  # the list's own: BM25, ts_rank_cd, or cosine distance (lower is closer)
    terms: tuple[str, ...] = ()  # query words the row holds (full-text lists; stemmed match)


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
    conversation_id: str | None = None
    batch_id: str | None = None  # the depth-0 batch that summarised it
    matches: tuple[MatchReason, ...] = ()  # why it matched, one entry per list
    duplicates: int = 0  # other matching turns of its conversation with the same text


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
    matches: tuple[MatchReason, ...] = ()  # the summary's lists (empty: found by its turns)


@dataclass(frozen=True)
class MessageKey:
    """A message's place in a read's order, for keyset pagination (``after=``).

    History order is the clip-archive first, then ``created_at``, then ``id``;
    a batch's turns are ordered by ``created_at``, then ``id`` (``clip_archive``
    False). A page starts strictly after its key.
    """

    created_at: datetime
    id: str
    clip_archive: bool = False

    @classmethod
    def of(cls, message: ConversationMessage) -> MessageKey:
        """The key of a message a read returned (a page's last, for the next page)."""
        return cls(message.created_at, message.id, message.stored_clip_archive)

    def order(self) -> tuple[bool, datetime, str]:
        """What sorts in read order (a clip-archive first)."""
        return (not self.clip_archive, self.created_at, self.id)


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


class MemorySearchResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    hits: tuple[MemoryHit, ...]
    mode: Literal["hybrid", "full_text"]  # full_text when no embedder is configured
    # The best-matching raw turns of the whole scope, ranked on their own (not
    # inside their batches), best first, at most ``limit``.
    turns: tuple[TurnHit, ...] = ()
    sources: SearchSources = "both"
    query_mode: QueryMode = "plain"


class MessageStore(Protocol):
    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """Insert each message once, in the group's order, in as few round trips as
        the store can: the accounting agent's hot path. A repeated id is a
        ``duplicate``, and so is a message a compaction already archived (it must
        not come back on redelivery); a message an erase covers is ``erased``
        (not written).

        A message's ``conversation_id`` is the conversation key: its tenant (the
        key's, ``core.domain.tenancy``) is recorded with the conversation's
        first message, for the row-level security of reads.
        """
        ...

    async def load_history(
        self,
        conversation_id: str,
        *,
        as_of: datetime | None = None,
        up_to_seq: int | None = None,
        scope: ReadScope | None = None,
        after: MessageKey | None = None,
        limit: int | None = None,
    ) -> list[ConversationMessage]:
        """The conversation in model order: clip-archive first, then by time.

        ``after`` / ``limit`` read one page (keyset pagination): at most ``limit``
        messages strictly after ``after`` in that order (None: from the start /
        all of them).

        ``up_to_seq`` excludes messages stored after that arrival number, so a
        compaction never touches messages that arrived after its command;
        ``as_of`` does the same by ``created_at``. With a ``scope`` (a read on a
        caller's behalf) a conversation outside it reads as empty.
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
        scope: ReadScope | None = None,
    ) -> MemorySearchResult:
        """Batches ranked by their summaries and their archived raw turns, fused by
        reciprocal rank; each hit carries its matching raw turns. ``tenant_id``
        limits the search to that tenant's conversations (with ``conversation_id``
        too: both must hold); ``scope`` limits what the search can see at all."""
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

    async def compaction_log(
        self, conversation_id: str, *, scope: ReadScope | None = None
    ) -> list[CompactionRecord]:
        """The conversation's applied compactions, oldest first, each with the batches
        it archived (empty when unknown, or outside ``scope``): read-only, for the
        inspector page."""
        ...

    async def expire_raw_turns(self) -> int:
        """Remove archived raw turns older than the store's retention (none when it
        is 0 = forever); the number removed. Bounded per call and cheap, for a timer;
        a database error is logged and counts as 0."""
        ...


class OutboxStore(Protocol):
    """The transactional outbox: events written with a compaction, published after it."""

    async def pending_outbox(
        self, *, older_than_seconds: float = 0.0, limit: int = 100
    ) -> list[OutboxRow]:
        """Unpublished rows written at least ``older_than_seconds`` ago (by the
        store's clock), oldest first."""
        ...

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        """Every row of one compaction, published or not (``published`` says), in order."""
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

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        """The stored tokens, rows, ``last_seq`` and erase epoch of many conversations
        in one query; every id asked for is in the answer (an unknown one with zeros)."""
        ...

    async def last_seq(self, conversation_id: str) -> int | None:
        """The arrival number of the newest message: a compaction's as-of cut."""
        ...

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        """(conversation, tokens) of every conversation over ``threshold``, largest first:
        what reconciliation compares the table with."""
        ...


class PrivacyStore(Protocol):
    """Tenants and erasure."""

    async def erase_conversation(self, conversation_id: str, erasure: Erasure) -> EraseOutcome:
        """Remove every row of the conversation from every table, in one transaction
        under the conversation's lock, and in the same transaction record the
        erase (the ``erasures`` mark, its epoch raised once per request id) and
        its audit entry; both survive the erase. Idempotent."""
        ...

    async def move_to_tenant(self, conversation_id: str, tenant_id: str) -> bool:
        """Move the conversation without a tenant ``conversation_id`` (a producer's
        id) into ``tenant_id``: every row, its erase mark and audit, re-keyed in
        one transaction under both keys' locks. ``True`` when moved now, ``False``
        when it was moved before (nothing left without a tenant, the tenant's
        conversation there). Raises ``TenantConflictError`` (and writes nothing)
        when both have rows: two histories are never merged."""
        ...


class UsageStore(Protocol):
    """What compactions cost (their LLM spend, recorded with each compaction)."""

    async def tenant_llm_tokens(self, tenant_id: str, since: datetime) -> int:
        """LLM tokens (input, output, cache reads and writes) of the tenant's
        compactions since ``since``, the extractive summariser's not counted:
        what its ``llm_tokens_per_day`` is compared with."""
        ...

    async def usage_by_day(
        self, *, scope: ReadScope, tenant_id: str | None = None, since: date | None = None
    ) -> list[UsageDay]:
        """Compactions and their spend summed by tenant and UTC day (from ``since``),
        oldest day first; only what ``scope`` sees. ``tenant_id``: that tenant's only."""
        ...


class WorkerStore(
    MessageStore, MemoryStore, OutboxStore, TallySource, PrivacyStore, UsageStore, Protocol
):
    """Everything the streaming worker asks of storage."""

    async def close(self) -> None: ...
