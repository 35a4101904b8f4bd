"""Wire events: JSON on Kafka, validated by pydantic, versioned.

Producers outside this service write ``MessageEvent``; everything else is
written by the service itself. ``schema_version`` lets a consumer reject what
it does not understand instead of misreading it.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from core.domain.gate import RejectionReason as GateReason
from core.domain.messages import ConversationMessage, Role, Text, ToolCall
from core.domain.specifics import Specific
from core.domain.strategies import StrategyFreed
from core.domain.tenancy import TENANT_ID_PATTERN, ConversationRef, conversation_key
from core.domain.usage import LlmUsage

MAX_ID_LENGTH = 256
DEFAULT_MAX_CONTENT_CHARS = 1_000_000

EVENT_CONFIG = ConfigDict(frozen=True, extra="ignore")
"""Every event's: a field this version does not know is ignored, never an error, so a
producer (or a newer worker, mid-upgrade) may add one without its records being
dead-lettered. A change that is not an added optional field is a new
``schema_version`` (docs/events/README.md, "Schema evolution")."""

TenantId = Annotated[str, Field(pattern=TENANT_ID_PATTERN)]
"""Letters, digits and ``._:@-`` (1 to 256): never ``/``, which separates the
tenant from the conversation id in a conversation key."""


class _Identified(Protocol):
    @property
    def conversation_id(self) -> str: ...

    @property
    def tenant_id(self) -> str | None: ...


class Scoped:
    """An event about one conversation: (``tenant_id``, ``conversation_id``) is its
    identity (``core.domain.tenancy``). The Kafka key is ``conversation_id`` alone,
    so every co-partitioned topic routes a conversation to the same partition."""

    @property
    def conversation_key(self: _Identified) -> str:
        """The key the store, the table and the locks know the conversation by."""
        return conversation_key(self.tenant_id, self.conversation_id)


class MessageEvent(Scoped, BaseModel):
    """One chat message, keyed on Kafka by ``conversation_id``.

    The conversation is (``tenant_id``, ``conversation_id``): two tenants using the
    same id have two conversations, and neither can reach the other's."""

    model_config = EVENT_CONFIG

    schema_version: Literal[1] = 1
    # Unique within the conversation: a redelivery (same conversation, same id)
    # is stored once; another conversation may use the same id.
    message_id: Text = Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Unique within the conversation. Ids starting with clip-archive- or "
        "provisional- are the service's own (dead-lettered reserved_id)",
    )
    conversation_id: Text = Field(min_length=1, max_length=MAX_ID_LENGTH)
    role: Role
    content: Text  # Text: no NUL, no lone surrogate (dead-lettered as invalid_text)
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: Text | None = Field(default=None, max_length=MAX_ID_LENGTH)
    created_at: AwareDatetime
    token_count: int | None = Field(
        default=None,
        ge=0,
        description="Provider-reported token count; preferred over the estimate, kept within "
        "[ceil(estimate/4), 64 x estimate + 256] of the service's own estimate",
    )
    pinned: bool = Field(
        default=False,
        description="Keep this message verbatim: no compaction compresses it (it counts "
        "against the budget). Optional; an operator may pin or unpin it later",
    )
    tenant_id: TenantId | None = Field(
        default=None,
        description="The conversation's tenant: part of its identity, so the same "
        "conversation_id under two tenants is two conversations. With [tenancy] signing keys "
        "the record must carry the tenant's signature (dead-lettered bad_signature otherwise)",
    )

    def to_message(self) -> ConversationMessage:
        """The message as the store keeps it: under its conversation key.

        Not validated a second time: every field was validated as this event's, by
        rules at least as strict as the message's (ids and text ``Text``, the same
        ``Role`` and ``ToolCall``, an aware ``created_at``, the key built from a
        valid tenant and id). Validating again cost ~20 µs a message, a tenth of
        accounting's time per event (docs/performance.md, section 2)."""
        return ConversationMessage.model_construct(
            id=self.message_id,
            conversation_id=self.conversation_key,
            role=self.role,
            content=self.content,
            tool_calls=self.tool_calls or None,
            tool_call_id=self.tool_call_id,
            created_at=self.created_at,
            pinned=self.pinned,
        )


class CompactionCommand(Scoped, BaseModel):
    """Ask the processor to compact one conversation.

    ``compaction_id`` derives from the conversation and its generation, so a
    re-issued command is the same compaction. ``up_to_seq`` is the arrival
    number of the last message counted when it was issued: later messages are
    never touched.
    """

    model_config = EVENT_CONFIG

    schema_version: Literal[1] = 1
    compaction_id: str
    conversation_id: str
    tenant_id: TenantId | None = None
    generation: int = Field(ge=0)
    up_to_seq: int | None = None
    issued_at: AwareDatetime
    reason: Literal["over_budget", "reconcile", "request"] = "over_budget"
    # An operator's request (RecompactRequest, RestoreRequest) the command carries;
    # "compact" (the default, left out of the record) is the ordinary compaction.
    action: Literal["compact", "recompact", "restore"] = "compact"
    request_id: str | None = Field(default=None, max_length=MAX_ID_LENGTH)
    batch_id: str | None = Field(default=None, max_length=MAX_ID_LENGTH)

    def to_json(self) -> bytes:
        """The record's value. An ordinary compaction's leaves the request fields
        out, so a worker of the release before them reads it as it always did."""
        if self.action == "compact":
            return self.model_dump_json(exclude={"action", "request_id", "batch_id"}).encode()
        return self.model_dump_json().encode()


class CompactionCompleted(Scoped, BaseModel):
    """The processor's answer, consumed by the accounting agent (internal)."""

    model_config = EVENT_CONFIG

    type: Literal["completed"] = "completed"
    schema_version: Literal[1] = 1
    compaction_id: str
    conversation_id: str
    tenant_id: TenantId | None = None
    generation: int = Field(ge=0)
    status: Literal["compacted", "noop"]
    messages_compressed: int = Field(ge=0)
    rows_removed: int = Field(ge=0)
    rows_added: int = Field(ge=0)
    tokens_removed: int = Field(ge=0)
    tokens_added: int = Field(ge=0)
    completed_at: AwareDatetime


class ReconcileRequest(Scoped, BaseModel):
    """Sent by the reconciliation timer so that all table changes happen in the agent."""

    model_config = EVENT_CONFIG

    type: Literal["reconcile"] = "reconcile"
    schema_version: Literal[1] = 1
    conversation_id: str
    tenant_id: TenantId | None = None
    requested_at: AwareDatetime


class RecompactRequest(Scoped, BaseModel):
    """Re-summarise the conversation's live batches from their archived raw turns
    with the current prompt, model and settings, as one new compaction
    (``compactor recompact``, ``POST /conversations/{id}/recompact``). On the
    control topic, keyed by ``conversation_id``, so the worker that owns the
    conversation does it; idempotent by ``request_id`` (its compaction id derives
    from it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["recompact"] = "recompact"
    schema_version: Literal[1] = 1
    request_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    conversation_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    tenant_id: TenantId | None = None
    requester: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    requested_at: AwareDatetime


class RestoreRequest(Scoped, BaseModel):
    """Bring the raw turns of an archived batch (``batch_id``; None: the newest
    live one) back into the live history, as many of the newest as the budget's
    target allows; the rest stay summarised, and the clip-archive event names
    both (``compactor restore``, ``POST /conversations/{id}/restore``). Like
    ``RecompactRequest``: control topic, one compaction, idempotent by
    ``request_id``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["restore"] = "restore"
    schema_version: Literal[1] = 1
    request_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    conversation_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    tenant_id: TenantId | None = None
    batch_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    requester: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    requested_at: AwareDatetime


OperatorRequestEvent = RecompactRequest | RestoreRequest


class EraseRequest(Scoped, BaseModel):
    """Erase one conversation everywhere (``compactor erase``), on the erase-requests
    topic only (``{prefix}erase-requests``; the control topic no longer erases):
    every table row, its table entry, a tombstone on the clip-archive topic, an
    erase mark that keeps the conversation erased, and an audit entry. Idempotent
    by ``request_id``. ``messages_end_offsets`` are the messages topic's end
    offsets when it was asked (partition → next offset): every message below
    them stays erased, however often it is redelivered or replayed."""

    model_config = EVENT_CONFIG

    type: Literal["erase"] = "erase"
    schema_version: Literal[2] = 2
    request_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    conversation_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    tenant_id: TenantId | None = None
    requester: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    reason: str = Field(min_length=1, max_length=1000, description="Why; never content")
    requested_at: AwareDatetime
    messages_end_offsets: dict[int, int] = Field(default_factory=dict)


class EraseCompleted(Scoped, BaseModel):
    """Published on ``{prefix}erase-completions`` once an erase is applied (again for a
    redelivered request, with the first application's counts). Ids and counts only."""

    model_config = EVENT_CONFIG

    type: Literal["erase_completed"] = "erase_completed"
    schema_version: Literal[1] = 1
    request_id: str
    conversation_id: str
    tenant_id: TenantId | None = None
    requester: str
    counts: dict[str, int]  # rows removed per table
    epoch: int = Field(ge=1)  # erases of this conversation id so far
    requested_at: AwareDatetime
    erased_at: AwareDatetime


# What the control topic carries. Not EraseRequest: an erase comes only from the
# erase-requests topic, which only operators may write (docs/security.md).
AnyControl = CompactionCompleted | ReconcileRequest | RecompactRequest | RestoreRequest
ControlEvent = Annotated[AnyControl, Field(discriminator="type")]
CONTROL_EVENT: TypeAdapter[AnyControl] = TypeAdapter(ControlEvent)


class BatchInfo(BaseModel):
    model_config = EVENT_CONFIG

    id: str
    label: str
    depth: int
    start_time: AwareDatetime
    end_time: AwareDatetime
    message_count: int
    superseded_by: str | None = None
    specifics: tuple[Specific, ...] = Field(
        default=(),
        description="The batch's specifics ledger: the specifics of its source turns that its "
        "summary dropped, most important first, each with the id of the message that stated it "
        "(`expand` fetches the turn); the clip-archive shows them in the batch's Specifics section",
    )


class ClipArchiveEvent(Scoped, BaseModel):
    """Published once per compaction (at least once: de-duplicate by ``compaction_id``).

    Its record key is the conversation key (``core.domain.tenancy``: ``tenant/id``,
    or the id for a conversation without a tenant), so the log-compacted topic
    keeps one latest event per conversation, and two tenants' conversations with
    the same id never replace (or, by an erase's tombstone, delete) each other's.

    ``clip_archive`` plus the messages named in ``kept_message_ids`` (and any
    that arrived later) is what the model should see now.
    """

    model_config = EVENT_CONFIG

    schema_version: Literal[1] = 1
    compaction_id: str
    conversation_id: str
    tenant_id: TenantId | None = None
    generation: int = Field(ge=0)
    # None only after a restore that brought back every archived turn there was.
    clip_archive: ConversationMessage | None
    kept_message_ids: tuple[str, ...]
    compressed_message_ids: tuple[str, ...]
    batches: tuple[BatchInfo, ...]
    tokens_before: int
    tokens_after: int
    created_at: AwareDatetime
    usage: LlmUsage | None = Field(
        default=None,
        description="What the compaction's LLM calls cost: calls, input/output/cache tokens, the "
        "summariser and model (extractive when the tenant's LLM budget for the day was spent: "
        "fallback true), the estimated cost in USD from [usage].prices (null: no price)",
    )
    # What made it: an ordinary compaction, or an operator's recompact / restore
    # (with its request id). A restore's raw turns back in the live history, and
    # those that did not fit the budget (they stay archived and summarised).
    action: Literal["compact", "recompact", "restore"] = "compact"
    request_id: str | None = None
    restored_message_ids: tuple[str, ...] = ()
    not_restored_message_ids: tuple[str, ...] = ()
    strategies: tuple[StrategyFreed, ...] = Field(
        default=(),
        description="The strategies that ran, in order, each with the messages it touched and "
        "the tokens it freed (clear_tool_results and offload_oversized make no LLM call)",
    )
    replaced_messages: tuple[ConversationMessage, ...] = Field(
        default=(),
        description="Kept messages whose content a strategy replaced (a placeholder or a "
        "preview; the full content is archived): the model sees these instead",
    )

    def to_json(self) -> str:
        """The record's value; an ordinary compaction's leaves the request fields out
        (as before they existed), and one without strategies their fields."""
        left_out = set() if self.strategies else set(_STRATEGY_FIELDS)
        if self.action == "compact":
            left_out |= _REQUEST_FIELDS
        return self.model_dump_json(exclude=left_out or None)


_REQUEST_FIELDS = {"action", "request_id", "restored_message_ids", "not_restored_message_ids"}
_STRATEGY_FIELDS = {"strategies", "replaced_messages"}


class CompactionRejected(Scoped, BaseModel):
    """A compaction the gate refused before it took effect (``core.domain.gate``):
    nothing of it was written. On the clip-archives topic, keyed like a
    ``ClipArchiveEvent`` (at least once: de-duplicate by ``compaction_id`` and
    ``summarizer``); a consumer that reads only ``ClipArchiveEvent`` tells them apart
    by ``type``, which a clip-archive event does not carry."""

    model_config = EVENT_CONFIG

    type: Literal["compaction_rejected"] = "compaction_rejected"
    schema_version: Literal[1] = 1
    compaction_id: str
    conversation_id: str
    tenant_id: TenantId | None = None
    summarizer: str = Field(description="Who wrote the refused summary (llm, extractive)")
    reason: GateReason = Field(description="The gate's check that failed")
    detail: str = Field(description="What the check found (counts and ids, never content)")
    fallback: str | None = Field(
        default=None,
        description="What the conversation falls back to: extractive; null: none left, "
        "the command fails and the history stays as it was",
    )
    rejected_at: AwareDatetime


def public_message(message: ConversationMessage) -> ConversationMessage:
    """``message`` as events and views show it: under the producer's conversation id
    (its tenant is the event's or the body's ``tenant_id``), not the store's key."""
    ref = ConversationRef.of_key(message.conversation_id)
    if ref.conversation_id == message.conversation_id:
        return message
    return message.model_copy(update={"conversation_id": ref.conversation_id})
