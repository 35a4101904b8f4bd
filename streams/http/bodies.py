"""What the HTTP views take and answer, as pydantic models: the API's contract.

The views build every JSON body through these models (``*.of`` builders), so a
body cannot grow a field its model does not declare; ``streams.http.openapi``
generates the OpenAPI document from the same models, and ``streams.client``
parses the answers with them. A client reads a body leniently (an unknown
field is ignored, ``extra="ignore"``), so a newer worker that adds a field does
not break an older client.

No Faust or aiohttp here: the client imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from core.domain.budget import BudgetConfig, over_budget
from core.domain.clip_archive import is_clip_archive
from core.domain.messages import ConversationMessage, Text, ToolCall
from core.domain.specifics import Specific
from core.domain.strategies import StrategyFreed
from core.domain.tally import ConversationTally
from core.domain.tenancy import ConversationRef
from core.domain.tokens import estimate_history_tokens
from core.domain.usage import LlmUsage, UsageDay
from core.ports.storage import (
    CompactionRecord,
    ExpandedBatch,
    MemoryHit,
    MemorySearchResult,
    RejectionRecord,
    TurnHit,
)
from streams.events import public_message


class Body(BaseModel):
    """A response body: ignores unknown fields when read (forward compatible)."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Problem(Body):
    """Every 4xx and 5xx answer: what is wrong, naming the parameter when one is."""

    error: str


def _absent(value: object) -> bool:
    return value is None


class Message(ConversationMessage):
    """A message as the views show it: under the producer's conversation id (its tenant
    is the body's ``tenant_id``), fields without a value left out."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tool_calls: tuple[ToolCall, ...] | None = Field(default=None, exclude_if=_absent)
    tool_call_id: Text | None = Field(default=None, exclude_if=_absent)

    @classmethod
    def of(cls, message: ConversationMessage) -> Message:
        return cls.model_validate(public_message(message).model_dump())


class Identity(Body):
    """How a body names a conversation: the producer's id and its tenant."""

    conversation_id: str
    tenant_id: str | None

    @staticmethod
    def fields(conversation_key: str) -> dict[str, str | None]:
        ref = ConversationRef.of_key(conversation_key)
        return {"conversation_id": ref.conversation_id, "tenant_id": ref.tenant_id}


class ConversationStatus(Identity):
    """``GET /conversations/{id}``: the worker's token tally of the conversation."""

    token_total: int
    message_count: int
    budget_tokens: int
    over_budget: bool
    compactions: int
    generation: int
    compaction_outstanding: str | None = Field(
        description="The id of the compaction asked for and not completed yet, if any"
    )
    stalled: bool = Field(
        default=False,
        description="Over its trigger but not compacted until a new message or an operator's "
        "recompact: its last compaction found nothing to compress, or its command was sent "
        "5 times without a completion (compactor_compactions_given_up_total)",
    )

    @classmethod
    def of(cls, tally: ConversationTally, budget: BudgetConfig) -> ConversationStatus:
        return cls(
            **Identity.fields(tally.conversation_id),
            token_total=tally.token_total,
            message_count=tally.message_count,
            budget_tokens=budget.budget_tokens,
            over_budget=over_budget(tally.token_total, budget),
            compactions=tally.compactions,
            generation=tally.generation,
            compaction_outstanding=tally.outstanding,
            stalled=tally.stalled,
        )


class Watermark(Body):
    message_id: str | None = Field(description="The newest message processed for the conversation")
    partition: int | None = Field(description="Its record's partition of the messages topic")
    offset: int | None = Field(
        description="Its record's offset: every record of the "
        "conversation up to it is in this context"
    )
    seq: int = Field(description="The newest arrival number the history holds")


class ContextBody(Identity):
    """``GET /conversations/{id}/context``: the whole context to send the model now, in
    the provider's request shape, never over the limit ``fit`` names."""

    format: Literal["messages", "openai", "anthropic"]
    fit: Literal["budget", "window", "none"]
    request: dict[str, Any] = Field(
        description="The provider request's part: messages (and anthropic's system); "
        "pass it as keyword arguments to the SDK's create call"
    )
    token_estimate: int = Field(description="Estimated tokens of this context")
    stored_tokens: int = Field(description="Tokens of the history as stored")
    limit: int | None = Field(description="The limit fit applied (null: none)")
    budget: int
    model_max_tokens: int
    provisional: bool = Field(
        description="Fitted at read time: the oldest part is a "
        "provisional clip-archive until its compaction lands"
    )
    folded_messages: int = Field(description="Messages the provisional clip-archive stands for")
    shortened: bool = Field(
        description="The newest message alone was over the limit: its head and tail are shown"
    )
    pending_compaction: str | None = Field(description="The compaction in flight, when known")
    watermark: Watermark


class HistoryPage(Identity):
    """``GET /conversations/{id}/history``: what the model should see now, a page at a
    time: the clip-archive first (on the first page), then the kept messages."""

    token_estimate: int = Field(description="Estimated tokens of this page's messages")
    clip_archive: ConversationMessage | None = Field(
        description="The clip-archive system message when this page starts with it"
    )
    messages: list[Message]
    next_cursor: str | None = Field(description="The next page's cursor; null after the last")

    @classmethod
    def of(
        cls, conversation_key: str, page: Sequence[ConversationMessage], next_cursor: str | None
    ) -> HistoryPage:
        shown = [public_message(m) for m in page]
        first = shown[0] if shown else None
        return cls(
            **Identity.fields(conversation_key),
            token_estimate=estimate_history_tokens(page),
            clip_archive=first if first is not None and is_clip_archive(first) else None,
            messages=[Message.of(m) for m in page],
            next_cursor=next_cursor,
        )


class BatchPage(Identity):
    """``GET /conversations/{id}/batches/{batch_id}``: one archived batch, its summary
    and a page of the raw turns it covers, in conversation order."""

    batch_id: str
    label: str
    depth: int = Field(description="0: a summary of raw messages; 1+: re-summarised batches")
    start_time: AwareDatetime
    end_time: AwareDatetime
    message_count: int
    superseded_by: str | None = Field(
        description="The deeper batch that replaced it in the clip-archive (still searchable)"
    )
    summary: str
    specifics: list[Specific] = Field(
        description="The specifics of the batch's source turns, ranked (docs/memory.md)"
    )
    ledger: list[Specific] = Field(
        description="Those the summary dropped, which its Specifics section shows"
    )
    turns: list[Message]
    turns_missing: int = Field(
        description="Covered turns no longer archived ([archive].raw_retention_days)"
    )
    next_cursor: str | None

    @classmethod
    def of(cls, expanded: ExpandedBatch, next_cursor: str | None) -> BatchPage:
        stored = expanded.batch
        return cls(
            batch_id=stored.id,
            label=stored.label,
            **Identity.fields(stored.conversation_id),
            depth=stored.batch.depth,
            start_time=stored.batch.start_time,
            end_time=stored.batch.end_time,
            message_count=stored.batch.message_count,
            superseded_by=stored.superseded_by,
            summary=stored.batch.content,
            specifics=list(stored.batch.specifics),
            ledger=list(stored.batch.ledger),
            turns=[Message.of(m) for m in expanded.turns],
            turns_missing=expanded.turns_missing,
            next_cursor=next_cursor,
        )


class SearchHit(MemoryHit):
    """A ``memory_read`` hit (``core.ports.storage.MemoryHit``, every field of it) naming
    its conversation by the producer's id and ``tenant_id``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tenant_id: str | None


class SearchTurn(TurnHit):
    """One of the best raw turns of the scope (``core.ports.storage.TurnHit``, every
    field of it) naming its conversation by the producer's id and ``tenant_id``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tenant_id: str | None = None


class SearchResult(MemorySearchResult):
    """``GET /memory/search``: ``core.ports.storage.MemorySearchResult`` as served:
    conversations named by id and tenant, never by the store's key."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    hits: tuple[SearchHit, ...]
    turns: tuple[SearchTurn, ...] = ()

    @classmethod
    def of(cls, result: MemorySearchResult) -> SearchResult:
        data = result.model_dump()
        data["hits"] = [{**hit, **Identity.fields(hit["conversation_id"])} for hit in data["hits"]]
        data["turns"] = [
            turn if turn["conversation_id"] is None
            else {**turn, **Identity.fields(turn["conversation_id"])}
            for turn in data["turns"]
        ]  # fmt: skip
        return cls.model_validate(data)


class CompactionBatch(Body):
    """A batch a compaction archived (expand it with the batch view)."""

    batch_id: str
    label: str
    depth: int
    start_time: AwareDatetime
    end_time: AwareDatetime
    message_count: int
    superseded_by: str | None


class Compaction(Body):
    """One applied compaction of the conversation."""

    compaction_id: str
    created_at: AwareDatetime
    messages_compressed: int
    batches_created: int
    tokens_before: int
    tokens_after: int
    usage: LlmUsage | None = Field(
        description="Its LLM spend: summariser, model, calls, tokens, estimated cost "
        "(null for compactions recorded before usage was)"
    )
    batches: list[CompactionBatch]
    strategies: list[StrategyFreed] = Field(
        default_factory=list,
        description="The strategies that ran, in order, and the tokens each freed "
        "(empty for compactions recorded before they were)",
    )


class Rejection(Body):
    """A compaction the gate refused before it took effect (nothing of it written)."""

    compaction_id: str
    summarizer: str
    reason: str
    detail: str
    rejected_at: AwareDatetime


class CompactionLog(Identity):
    """``GET /conversations/{id}/compactions``: its compactions, oldest first."""

    compactions: list[Compaction]
    rejections: list[Rejection] = Field(
        default_factory=list, description="Compactions the gate refused, newest first"
    )

    @classmethod
    def of(
        cls, key: str, records: Sequence[CompactionRecord], rejected: Sequence[RejectionRecord] = ()
    ) -> CompactionLog:
        return cls(
            **Identity.fields(key),
            compactions=[Compaction.model_validate(r.model_dump()) for r in records],
            rejections=[Rejection.model_validate(r, from_attributes=True) for r in rejected],
        )


class UsageTotals(Body):
    compactions: int
    llm_calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    fallback_compactions: int
    failed_compactions: int
    cost_usd: float

    @classmethod
    def of(cls, days: Sequence[UsageDay]) -> UsageTotals:
        counted = {
            name: sum(getattr(d, name) for d in days)
            for name in cls.model_fields
            if name != "cost_usd"
        }
        return cls(**counted, cost_usd=round(sum(d.cost_usd for d in days), 9))


class UsageReport(Body):
    """``GET /tenants/{tenant}/usage``: the tenant's compactions and their LLM spend,
    by UTC day, oldest first, and their total."""

    tenant_id: str | None
    since: date | None
    days: list[UsageDay]
    total: UsageTotals

    @classmethod
    def of(cls, tenant: str | None, since: date | None, days: Sequence[UsageDay]) -> UsageReport:
        return cls(tenant_id=tenant, since=since, days=list(days), total=UsageTotals.of(days))


class RedoAccepted(Body):
    """``POST .../recompact`` and ``.../restore``: the request is on the control topic."""

    action: Literal["recompact", "restore"]
    request_id: str
    conversation_id: str
    tenant_id: str | None
    status: str = Field(
        default="accepted: the conversation's worker does it; its clip-archive event "
        "carries this request_id"
    )


class PinChanged(Body):
    """``POST .../messages/{message_id}/pin`` and ``/unpin``: stored, at once."""

    conversation_id: str
    tenant_id: str | None
    message_id: str
    pinned: bool
    pinned_tokens: int  # the conversation's pinned messages, after the change
    budget_tokens: int


def unknown_conversation(conversation_key: str) -> Problem:
    ref = ConversationRef.of_key(conversation_key)
    where = "" if ref.tenant_id is None else f" of tenant {ref.tenant_id!r}"
    return Problem(error=f"unknown conversation {ref.conversation_id!r}{where}")


FORBIDDEN = Problem(error="forbidden: this token cannot read that")
UNAUTHORIZED = Problem(error="unauthorized: a valid bearer token is required")
