"""Compaction domain types.

A compaction is planned purely (``CompactionPlan``) and applied by a store in
one transaction, so a crash or an LLM failure can never leave half a
compaction behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from core.domain.messages import ConversationMessage
from core.domain.scoring import ImportanceScoringConfig
from core.domain.specifics import Specific
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


def restored_by(compaction_id: str) -> str:
    """``superseded_by`` of a batch whose every turn a restore brought back: it
    leaves the clip-archive with no batch in its place (and stays searchable)."""
    return f"restored:{compaction_id}"


class AppliedStats(BaseModel):
    """What a compaction changed, measured inside its transaction.

    ``tokens_removed`` sums the stored token counts of the deleted rows (which
    may be provider-reported), so token accounting can subtract exactly that.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens_removed: int
    tokens_added: int


class CompactionResult(BaseModel):
    """What a compaction planned, and, once a store applied it, what it changed.

    ``plan`` is what to write (None when the history stays as it was: failed,
    or nothing to compress); ``history`` is the history as the model sees it
    once the plan is applied. ``tokens_removed`` / ``tokens_added`` are the
    store's measurements, zero until ``applied`` fills them in.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    history: tuple[ConversationMessage, ...]
    batches_created: int = 0
    messages_compressed: int = 0
    tokens_estimate_before: int = 0
    tokens_estimate_after: int = 0
    failed: bool = False
    reason: str | None = None
    compaction_id: str | None = None
    batches: tuple[StoredBatch, ...] = ()
    compressed_message_ids: tuple[str, ...] = ()
    already_applied: bool = False
    tokens_removed: int = 0
    tokens_added: int = 0
    llm_input_tokens: int = 0
    llm_output_tokens: int = 0
    usage: LlmUsage | None = None  # the LLM spend in full (None: no call was made)
    # The history this compaction left (or, when it could not compact, found)
    # is over the target; ``reason`` says why it could not do better.
    over_target: bool = False
    target_tokens: int | None = None
    plan: CompactionPlan | None = None
    # Failed because the provider was unavailable (refused by the guard, or failing
    # for everyone): the guard's answer count then, to try again once it answers.
    provider_down_at: int | None = None
    messages_restored: int = 0  # a restore: raw turns back in the live history

    @property
    def provider_down(self) -> bool:
        return self.provider_down_at is not None

    def applied(self, stats: AppliedStats) -> CompactionResult:
        """This result once a store has applied its plan and measured ``stats``."""
        return self.model_copy(
            update={"tokens_removed": stats.tokens_removed, "tokens_added": stats.tokens_added}
        )

    def unchanged(
        self,
        history: tuple[ConversationMessage, ...],
        reason: str,
        *,
        failed: bool,
        already_applied: bool = False,
    ) -> CompactionResult:
        """The plan was not applied: ``history`` stays as it was (LLM spend is kept)."""
        before = self.tokens_estimate_before
        return CompactionResult(
            history=history,
            tokens_estimate_before=before,
            tokens_estimate_after=before,
            failed=failed,
            reason=reason,
            compaction_id=self.compaction_id,
            already_applied=already_applied,
            llm_input_tokens=self.llm_input_tokens,
            llm_output_tokens=self.llm_output_tokens,
            usage=self.usage,
            target_tokens=self.target_tokens,
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
