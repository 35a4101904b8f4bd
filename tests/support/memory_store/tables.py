"""The in-memory store's tables, which its role objects share, and how a test breaks them.

``fail_next`` makes the next call of the named method raise; ``fail_times``
makes the next calls fail as if the database were away (``StoreUnavailable``):
to test the callers' error paths.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from core.domain.calibration import TokenRate
from core.domain.compaction import CompactionPlan, StoredBatch
from core.domain.erasure import EraseMark
from core.domain.messages import ConversationMessage
from core.domain.usage import LlmUsage
from core.ports.storage import (
    MessageKey,
    OutboxRow,
    ReadScope,
    RejectionRecord,
    StoreUnavailable,
    Watermark,
)


@dataclass(frozen=True)
class AuditEntry:
    """One row of ``erase_audit``: it survives the erase it records."""

    request_id: str
    conversation_id: str
    requester: str
    reason: str
    requested_at: datetime
    erased_at: datetime
    epoch: int
    counts: dict[str, int]


@dataclass
class Row:
    message: ConversationMessage
    tokens: int
    seq: int
    kind: str = "message"  # or "clip_archive": only apply_compaction stores one


@dataclass
class Archived:
    message: ConversationMessage
    batch_id: str | None
    archived_at: datetime
    tokens: int  # its stored token count, kept as archived_messages keeps it


@dataclass
class OutboxEntry:
    row: OutboxRow
    conversation_id: str
    created_at: datetime
    published: bool = False


@dataclass
class Tables:
    """The rows, as PostgreSQL's tables hold them."""

    # Keyed like the PostgreSQL tables: a message id is unique within its conversation.
    messages: dict[tuple[str, str], Row] = field(default_factory=dict)
    batches: dict[str, StoredBatch] = field(default_factory=dict)
    # archival_memory's seq (creation order) and archive_order (a re-summarised
    # batch's slot): live batches are ordered by (archive_order or seq, seq).
    batch_seq: dict[str, int] = field(default_factory=dict)
    archive_order: dict[str, int] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)  # the compactions table's ids
    compaction_owner: dict[str, str] = field(default_factory=dict)  # compaction → conversation
    # compaction → (when, plan) in apply order, for compaction_log (dropped with the owner).
    compaction_plans: dict[str, tuple[datetime, CompactionPlan]] = field(default_factory=dict)
    # compaction → (its tenant when it was applied, when, its LLM spend): the
    # compactions table's usage columns (migration 0012)
    compaction_usage: dict[str, tuple[str | None, datetime, LlmUsage]] = field(default_factory=dict)
    # usage_aggregates (migration 0014): failed compactions' spend, no conversation.
    failed_spend: list[tuple[str | None, date, LlmUsage]] = field(default_factory=list)
    # ... and the usage of erased conversations' compactions (tenant, when, spend).
    erased_usage: list[tuple[str | None, datetime, LlmUsage]] = field(default_factory=list)
    outbox_entries: list[OutboxEntry] = field(default_factory=list)
    # compaction_rejections: (conversation, compaction, summariser) → the refusal
    rejections: dict[tuple[str, str, str], RejectionRecord] = field(default_factory=dict)
    fail_next: dict[str, Exception] = field(default_factory=dict)
    outage: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    archived: dict[tuple[str, str], Archived] = field(default_factory=dict)
    raw_retention_days: int = 0
    tenants: dict[str, str | None] = field(default_factory=dict)  # the conversations table
    # the conversations table's watermark columns (migration 0013)
    watermarks: dict[str, Watermark] = field(default_factory=dict)
    erasures: dict[str, EraseMark] = field(default_factory=dict)  # kept after the erase
    audit: list[AuditEntry] = field(default_factory=list)  # erase_audit, kept too
    # (read, scope) of every read that takes a scope: the views must always pass one.
    read_scopes: list[tuple[str, ReadScope | None]] = field(default_factory=list)
    # (provider, model) → its measured tokens per character (token_calibration, 0016)
    token_rates: dict[tuple[str, str], TokenRate] = field(default_factory=dict)
    # conversations whose advisory lock a compaction being written holds: save_free leaves them
    held: set[str] = field(default_factory=set)
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _call(self, name: str) -> None:
        error = self.fail_next.pop(name, None)
        if error is not None:
            raise error
        remaining = self.outage.get(name, 0)
        if remaining:
            self.outage[name] = remaining - 1
            raise StoreUnavailable(f"{name}: the database is away")

    def message_ids(self, conversation_id: str | None = None) -> list[str]:
        """Live message ids in arrival order (of one conversation, or of all)."""
        return [
            message_id
            for cid, message_id in self.messages
            if conversation_id is None or cid == conversation_id
        ]

    def _visible(self, scope: ReadScope | None, conversation_id: str) -> bool:
        """Row-level security's rule (migration 0009): a scoped read sees only the
        conversations of its tenant (all, for ``ReadScope.everything()``; a
        conversation without a tenant, or unknown, only then)."""
        return scope is None or scope.sees(self.tenants.get(conversation_id))

    def fail_times(self, name: str, times: int) -> None:
        """The next ``times`` calls of ``name`` fail as if the database were away."""
        self.outage[name] = times

    def next_seq(self) -> int:
        """The next arrival number (``messages.seq``)."""
        return next(self._seq)


def terms_of(text: str) -> set[str]:
    return {w.strip(".,;:!?\"'()-").lower() for w in text.split()} - {""}


def page(
    ordered: list[ConversationMessage], after: MessageKey | None, limit: int | None
) -> list[ConversationMessage]:
    """Keyset pagination as PostgreSQL's: the messages after ``after``, at most ``limit``."""
    rest = [m for m in ordered if after is None or MessageKey.of(m).order() > after.order()]
    return rest if limit is None else rest[:limit]
