"""Compaction domain types.

A compaction is planned purely (``CompactionPlan``) and applied by a store in
one transaction, so a crash or an LLM failure can never leave half a
compaction behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from core.domain.keep_rules import KeepVerbatim
from core.domain.messages import ConversationMessage
from core.domain.scoring import ImportanceScoringConfig
from core.domain.specifics import Specific
from core.domain.strategies import ReplacedMessage, StrategyConfig, StrategyFreed
from core.domain.tokens import estimate_message_tokens
from core.domain.usage import LlmUsage


class SummaryBatch(BaseModel):
    """One unit of compressed history."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    content: str
    depth: int = Field(ge=0)  # 0 = summary of raw messages, 1+ = re-summarised
    start_time: AwareDatetime
    end_time: AwareDatetime
    message_count: int = Field(ge=0)
    source_message_ids: tuple[str, ...] = ()
    # The UTC days its messages were written on, ascending (empty when unknown):
    # an importance-ordered chunk can span months but cover a few days.
    days: tuple[date, ...] = ()
    # The specifics ledger (core/domain/specifics.py): the specifics of the source
    # turns, ranked (what a re-summary carries forward), and those the summary
    # dropped that its "Specifics" section shows.
    specifics: tuple[Specific, ...] = ()
    ledger: tuple[Specific, ...] = ()

    @model_validator(mode="after")
    def _time_range_is_ordered(self) -> SummaryBatch:
        if self.end_time < self.start_time:
            raise ValueError("end_time precedes start_time")
        return self


class StoredBatch(BaseModel):
    """A batch as archival memory holds it.

    ``superseded_by`` is set when re-summarisation folded this batch into a
    deeper one: it leaves the clip-archive but stays searchable.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    label: str
    conversation_id: str
    batch: SummaryBatch
    compaction_id: str
    superseded_by: str | None = None


ChunkOrder = Literal["importance", "chronological"]


class CompactionTuning(BaseModel):
    """Every compaction setting but scoring; ``[summarization]`` inherits these
    fields (and their defaults) so each default is written once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chunk_size: int = Field(default=20, ge=1)
    # importance: chunks formed least important first (compaction-v2.AC3.4);
    # chronological: in conversation order, so each batch covers one stretch of time.
    chunk_order: ChunkOrder = "importance"
    keep_recent: int = Field(default=5, ge=0)
    max_summary_tokens: int = Field(default=1024, ge=1)
    # The specifics ledger's allowance per batch, a share of max_summary_tokens
    # (0: no ledger). Chosen by measurement: bench/specifics_bench.py, docs/memory.md.
    specifics_ratio: float = Field(default=0.25, ge=0, le=1)
    clip_first: int = Field(default=2, ge=0)
    clip_last: int = Field(default=2, ge=0)
    resummarize_buffer: int = Field(default=2, ge=0)
    prompt: str | None = None
    max_chunk_tokens: int | None = Field(default=None, ge=1)
    # A chunk of short turns grows past chunk_size until it carries this many
    # estimated tokens, so each request's fixed parts (system prompt, directive,
    # running summary) are amortised (issue 28; docs/memory.md, "What a
    # summarisation request costs"). 0: chunk_size alone.
    min_chunk_tokens: int = Field(default=6000, ge=0)
    timeout_seconds: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    retry_backoff_seconds: float = Field(default=1.0, ge=0)
    max_consecutive_failures: int = Field(default=3, ge=1)
    circuit_cooldown_seconds: float = Field(default=60.0, ge=0)
    # The provider guard (core/provider_guard.py), one per worker.
    max_concurrent_llm_calls: int = Field(default=64, ge=1)
    provider_failure_threshold: int = Field(default=5, ge=1)
    provider_cooldown_seconds: float = Field(default=5.0, ge=0)
    provider_max_cooldown_seconds: float = Field(default=15.0, ge=0)
    provider_max_wait_seconds: float = Field(default=10.0, ge=0)
    # The guard's call slots and the scheduler's compaction slots shared by tenant
    # (round robin, weighted by [[tenants]] weight); false: first come, first served.
    fair_share: bool = True


class CompactionConfig(CompactionTuning):
    scoring: ImportanceScoringConfig = ImportanceScoringConfig()
    # The strategy pipeline ([compaction], per tenant in [[tenants]]).
    strategies: StrategyConfig = StrategyConfig()
    # Tenant id → its must-survive rules ([[tenants]].keep_verbatim); pinned
    # messages are kept for every tenant (core.domain.keep_rules).
    keep_verbatim: dict[str, KeepVerbatim] = Field(default_factory=dict)


class PlanEmbeddings(BaseModel):
    """Vectors of what a compaction archives, made before anything is written
    (``core.compaction.embedding``): one per new batch, in order, and one per
    compressed raw turn by its id, all of one embedding ``model``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    batches: tuple[list[float], ...]
    turns: dict[str, list[float]] = Field(default_factory=dict)


class CompactionPlan(BaseModel):
    """Everything one compaction writes, computed before any write happens.

    A store applies it atomically and idempotently by ``compaction_id``.
    ``deleted_message_ids`` includes the prior clip-archive, which the new
    one replaces.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    compaction_id: str
    conversation_id: str
    new_batches: tuple[StoredBatch, ...]
    superseded: tuple[tuple[str, str], ...] = ()  # (existing batch id, replacing batch id)
    deleted_message_ids: tuple[str, ...]
    # None only for a restore that brought back every archived turn there was.
    clip_archive: ConversationMessage | None
    messages_compressed: int
    tokens_estimate_before: int
    tokens_estimate_after: int
    usage: LlmUsage = LlmUsage()
    # A restore: archived raw turns moved back into the live history (their batch
    # leaves the clip-archive, ``superseded`` by ``restored_by(compaction_id)`` or
    # by the batch that summarises the turns that did not fit).
    restored_message_ids: tuple[str, ...] = ()
    # Turns of a restored batch that did not fit the budget (they stay archived).
    not_restored_message_ids: tuple[str, ...] = ()
    # The stored token counts of the restored turns, summed (read with the batch).
    restored_tokens: int = 0
    # None: no embedder, or it failed (the batches and turns are stored without).
    embeddings: PlanEmbeddings | None = None
    # The clip-archive's token count as the compactor counted it (the calibrated
    # rate, core.domain.calibration): what it is stored with. None: characters / 4.
    clip_archive_tokens: int | None = None
    # Live messages a cheap strategy replaced in place (their full content archived
    # as raw turns in the same transaction), and what each strategy that ran freed.
    replaced: tuple[ReplacedMessage, ...] = ()
    strategies: tuple[StrategyFreed, ...] = ()
    # The target the compactor fitted the history under; the store's gate
    # (core.domain.gate) rejects a plan whose history after is over it. None: no
    # target, or the compactor already said the history stays over it.
    target_tokens: int | None = None
    # The system prompt and the directive its summaries were asked with (the
    # deployment's configured prompt, core.domain.prompts.instructions): the gate
    # refuses a summary that copies one of them.
    instructions: tuple[str, ...] = ()
    # Summaries of this plan the provider cut at ``max_tokens``: the gate refuses
    # the plan (``cut_off``) rather than apply a summary that stops mid-way.
    summaries_cut: int = Field(default=0, ge=0)

    @property
    def clip_tokens(self) -> int:
        """The clip-archive's stored token count (0 without one), counted once here
        so the completion and the store announce and check the same number."""
        if self.clip_archive is None:
            return 0
        if self.clip_archive_tokens is not None:
            return self.clip_archive_tokens
        return estimate_message_tokens(self.clip_archive)

    def check_consistent(self) -> None:
        """Raise ``ValueError`` for a plan that would write across conversations or
        collide with itself (a store checks before it writes anything)."""
        conversation = self.conversation_id
        foreign = [b.id for b in self.new_batches if b.conversation_id != conversation]
        clip_in = conversation if self.clip_archive is None else self.clip_archive.conversation_id
        if foreign or clip_in != conversation:
            raise ValueError(
                f"compaction {self.compaction_id} writes outside conversation {conversation}: "
                f"batches {foreign}, clip-archive in {clip_in}"
            )
        ids = [b.id for b in self.new_batches]
        if len(set(ids)) != len(ids):
            raise ValueError(f"compaction {self.compaction_id} has duplicate batch ids")
        existing = [old for old, _ in self.superseded]
        if len(set(existing)) != len(existing):
            raise ValueError(f"compaction {self.compaction_id} supersedes a batch twice")
        embeddings = self.embeddings
        if embeddings is not None and len(embeddings.batches) != len(self.new_batches):
            raise ValueError(f"compaction {self.compaction_id}: a vector per new batch, or none")

    @property
    def changes_nothing(self) -> bool:
        """Nothing compressed, archived or restored: only the clip-archive rebuilt."""
        return (
            self.messages_compressed == 0
            and not self.new_batches
            and not self.restored_message_ids
            and not self.replaced
            and self.clip_archive is not None
        )


def restored_by(compaction_id: str) -> str:
    """``superseded_by`` of a batch whose every turn a restore brought back: it
    leaves the clip-archive with no batch in its place (and stays searchable)."""
    return f"restored:{compaction_id}"


FailureKind = Literal[
    "circuit_open",
    "provider_unavailable",
    "rate_limited",
    "model_auth",
    "model_timeout",
    "model_server",
    "model_response",
    "model_error",
    "history_conflict",
    "gate_rejected",
    "store_unavailable",
    "error",
]
"""Why a compaction failed, in a word: the ``reason`` label of
``compactor_compactions_failed_total`` (``core.compaction.attempt.failure_kind``)."""


@dataclass(frozen=True)
class Planned:
    """A compaction to write: ``plan``, and ``history`` as the model sees it once
    the plan is applied. ``over_target`` says why that history stays over the
    target, when it does."""

    plan: CompactionPlan
    history: tuple[ConversationMessage, ...]
    over_target: str | None = None
    llm_input_tokens: int = 0  # what the provider reported (the extractive one too)
    llm_output_tokens: int = 0


@dataclass(frozen=True)
class Unchanged:
    """Nothing to write, and why (nothing to compress, recompact or restore).
    ``over_target``: the history is over the target all the same."""

    reason: str
    over_target: bool = False


@dataclass(frozen=True)
class Failed:
    """The compaction failed and wrote nothing. ``provider_down_at``: failed because
    the provider was down, the guard's answer count then, to go again once it
    answers (``Compactor.provider_answers``)."""

    kind: FailureKind
    detail: str
    provider_down_at: int | None = None
    #: What its LLM calls spent before it failed (a plan the store then refused),
    #: recorded as a content-free usage row and counted against the tenant's budget.
    usage: LlmUsage | None = None


PlanOutcome = Planned | Unchanged | Failed
"""What a compactor answers for one compaction."""


@dataclass(frozen=True)
class StoredTokens:
    """What a compaction changes in the conversation's stored token total: the
    stored counts of the rows it removes and of those it adds. Its completion
    announces them, and the store checks them against the rows it touches, so
    the tally and the store move by the same amount."""

    removed: int
    added: int

    @classmethod
    def of(cls, plan: CompactionPlan, stored: Mapping[str, int]) -> StoredTokens:
        """``stored``: the stored token count of each message of the history the
        plan was made from (``CompactionInputs.stored_tokens``). The clip-archive
        is stored with its count (``CompactionPlan.clip_tokens``), the restored turns
        with their own counts."""
        replaced = plan.replaced
        return cls(
            removed=sum(stored[message_id] for message_id in plan.deleted_message_ids)
            + sum(stored[r.id] for r in replaced),
            added=plan.clip_tokens + plan.restored_tokens + sum(r.tokens for r in replaced),
        )


def merged_batch(sources: Sequence[StoredBatch], content: str) -> SummaryBatch:
    """The batch that re-summarising ``sources`` into ``content`` makes."""
    return SummaryBatch(
        content=content,
        depth=max(s.batch.depth for s in sources) + 1,
        start_time=min(s.batch.start_time for s in sources),
        end_time=max(s.batch.end_time for s in sources),
        message_count=sum(s.batch.message_count for s in sources),
        source_message_ids=tuple(i for s in sources for i in s.batch.source_message_ids),
        days=tuple(sorted({d for s in sources for d in s.batch.days})),
    )


def longest_fitting_prefix(length: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``0..length`` with ``fits(n)``, by binary search:
    ``fits`` must be monotone (a shorter prefix fits when a longer one does),
    and ``fits(0)`` is taken for granted."""
    low, high = 0, length
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low
