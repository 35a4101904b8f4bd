"""In-memory implementations of the storage ports and the worker's other edges.

``InMemoryStore`` follows ``PostgresStore``'s contract (the adapter tests in
``tests/integration/test_postgres_store.py`` pin that contract on the real
database): idempotent writes by message id and compaction id, a compaction
applied all-or-nothing, ``HistoryConflictError`` when its messages are gone or
its stored token counts are not what its outbox announces, and a compacted
message that never comes back on redelivery. Search is a plain term-overlap ranking: good
enough for components, not a model of PostgreSQL's full-text search.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from core.domain.compaction import CompactionPlan, StoredBatch, StoredTokens
from core.domain.erasure import EraseMark, merged_offsets
from core.domain.messages import ConversationMessage
from core.domain.tenancy import conversation_key, tenant_of
from core.domain.tokens import estimate_message_tokens
from core.domain.usage import LlmUsage, UsageDay
from core.ports.publisher import RecordPosition
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    CompactedBatch,
    CompactionInputs,
    CompactionOutbox,
    CompactionRecord,
    EraseOutcome,
    Erasure,
    ExpandedBatch,
    HistoryConflictError,
    IncomingMessage,
    MemoryHit,
    MemorySearchResult,
    MessageKey,
    OutboxRow,
    QueryMode,
    ReadScope,
    SaveOutcome,
    SearchSources,
    StoreTotals,
    StoreUnavailable,
    TenantConflictError,
    TurnHit,
    WorkerStore,
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
class _Row:
    message: ConversationMessage
    tokens: int
    seq: int
    kind: str = "message"  # or "clip_archive": only apply_compaction stores one


@dataclass
class _Archived:
    message: ConversationMessage
    batch_id: str | None
    archived_at: datetime
    tokens: int  # its stored token count, kept as archived_messages keeps it


def _terms(text: str) -> set[str]:
    return {w.strip(".,;:!?\"'()-").lower() for w in text.split()} - {""}


@dataclass
class _Outbox:
    row: OutboxRow
    conversation_id: str
    created_at: datetime
    published: bool = False


@dataclass
class InMemoryStore:
    """Every storage port (``WorkerStore``) over dicts.

    ``fail_next`` makes the next call of the named method raise, to test the
    callers' error paths.
    """

    # Keyed like the PostgreSQL tables: a message id is unique within its conversation.
    messages: dict[tuple[str, str], _Row] = field(default_factory=dict)
    batches: dict[str, StoredBatch] = field(default_factory=dict)
    compactions: set[str] = field(default_factory=set)
    compaction_owner: dict[str, str] = field(default_factory=dict)  # compaction → conversation
    # compaction → (when, plan) in apply order, for compaction_log (dropped with the owner).
    compaction_plans: dict[str, tuple[datetime, CompactionPlan]] = field(default_factory=dict)
    # compaction → (its tenant when it was applied, when, its LLM spend): the
    # compactions table's usage columns (migration 0012)
    compaction_usage: dict[str, tuple[str | None, datetime, LlmUsage]] = field(default_factory=dict)
    outbox: list[_Outbox] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    fail_next: dict[str, Exception] = field(default_factory=dict)
    outage: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    archived: dict[tuple[str, str], _Archived] = field(default_factory=dict)
    raw_retention_days: int = 0
    tenants: dict[str, str | None] = field(default_factory=dict)  # the conversations table
    erasures: dict[str, EraseMark] = field(default_factory=dict)  # kept after the erase
    audit: list[AuditEntry] = field(default_factory=list)  # erase_audit, kept too
    # (read, scope) of every read that takes a scope: the views must always pass one.
    read_scopes: list[tuple[str, ReadScope | None]] = field(default_factory=list)
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _call(self, name: str) -> None:
        self.calls.append(name)
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

    # -- MessageStore ---------------------------------------------------------

    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """All or nothing, like the one transaction ``PostgresStore`` uses."""
        self._call("save_messages")
        if any(incoming.tokens < 0 for incoming in batch):
            raise ValueError("token counts must be >= 0")
        return [self._save(incoming) for incoming in batch]

    def _save(self, incoming: IncomingMessage) -> SaveOutcome:
        message = incoming.message
        if self._erased(incoming):
            return SaveOutcome("erased")
        # The conversations table: the tenant the key names, for row-level security.
        self.tenants.setdefault(message.conversation_id, tenant_of(message.conversation_id))
        compacted = any(
            message.id in b.batch.source_message_ids
            for b in self.batches.values()
            if b.conversation_id == message.conversation_id
        )
        if (message.conversation_id, message.id) in self.messages or compacted:
            return SaveOutcome("duplicate")
        row = _Row(message, incoming.tokens, next(self._seq))
        self.messages[message.conversation_id, message.id] = row
        return SaveOutcome("inserted", row.seq)

    def _erased(self, incoming: IncomingMessage) -> bool:
        mark = self.erasures.get(incoming.message.conversation_id)
        return mark is not None and mark.covers(
            incoming.partition, incoming.offset, incoming.message.created_at
        )

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
        self._call("load_history")
        self.read_scopes.append(("load_history", scope))
        if not self._visible(scope, conversation_id):
            return []
        return _page(self._history(conversation_id, as_of, up_to_seq), after, limit)

    def _history(
        self, conversation_id: str, as_of: datetime | None, up_to_seq: int | None
    ) -> list[ConversationMessage]:
        # Like PostgreSQL's rows: a clip-archive is what the store stored as one (kind),
        # never a message that looks like one.
        rows = [r for r in self.messages.values() if r.message.conversation_id == conversation_id]
        clips = [r.message.as_clip_archive() for r in rows if r.kind == "clip_archive"]
        body = [
            r.message.as_clip_archive(False) if r.message.stored_clip_archive else r.message
            for r in rows
            if r.kind != "clip_archive"
            and (as_of is None or r.message.created_at <= as_of)
            and (up_to_seq is None or r.seq <= up_to_seq)
        ]
        return [*clips, *sorted(body, key=lambda m: (m.created_at, m.id))]

    async def compaction_applied(self, compaction_id: str) -> bool:
        self._call("compaction_applied")
        return compaction_id in self.compactions

    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> CompactionInputs:
        self._call("compaction_inputs")
        rows = [r for r in self.messages.values() if r.message.conversation_id == conversation_id]
        history = self._history(conversation_id, None, up_to_seq)
        return CompactionInputs(
            applied=compaction_id in self.compactions,
            total=sum(r.tokens for r in rows),
            history=history,
            stored_tokens={m.id: self.messages[conversation_id, m.id].tokens for m in history},
        )

    async def apply_compaction(
        self, plan: CompactionPlan, outbox: CompactionOutbox | None = None
    ) -> Applied | AlreadyApplied:
        self._call("apply_compaction")
        if plan.compaction_id in self.compactions:
            return AlreadyApplied()
        self._check_applicable(plan)
        cid = plan.conversation_id
        clip = plan.clip_archive
        found = StoredTokens(
            removed=sum(self.messages[cid, i].tokens for i in plan.deleted_message_ids),
            added=sum(self.archived[cid, i].tokens for i in plan.restored_message_ids)
            + (0 if clip is None else estimate_message_tokens(clip)),
        )
        if outbox is not None and found != outbox.tokens:
            raise HistoryConflictError(
                f"compaction {plan.compaction_id}: {found} stored, {outbox.tokens} announced"
            )
        self._archive(plan)
        for message_id in plan.restored_message_ids:  # a restore: back in the history
            back = self.archived.pop((cid, message_id))
            self.messages[cid, message_id] = _Row(back.message, back.tokens, next(self._seq))
        if clip is not None:
            tokens = estimate_message_tokens(clip)
            self.messages[cid, clip.id] = _Row(clip, tokens, next(self._seq), "clip_archive")
        self.compactions.add(plan.compaction_id)
        self.compaction_owner[plan.compaction_id] = plan.conversation_id
        self.compaction_plans[plan.compaction_id] = (self.now(), plan)
        self.compaction_usage[plan.compaction_id] = (tenant_of(cid), self.now(), plan.usage)
        for record in outbox.records if outbox is not None else ():
            row = OutboxRow(
                id=len(self.outbox) + 1,
                compaction_id=plan.compaction_id,
                topic=record.topic,
                key=record.key,
                payload=record.payload,
            )
            self.outbox.append(_Outbox(row, plan.conversation_id, self.now()))
        return Applied()

    def _check_applicable(self, plan: CompactionPlan) -> None:
        cid = plan.conversation_id
        missing = [i for i in plan.deleted_message_ids if (cid, i) not in self.messages]
        stale = [old for old, _ in plan.superseded if self._live_batch(old) is None]
        clip = plan.clip_archive
        unarchived = [i for i in plan.restored_message_ids if (cid, i) not in self.archived]
        if missing or stale or unarchived or (clip is not None and (cid, clip.id) in self.messages):
            raise HistoryConflictError(
                f"compaction {plan.compaction_id}: gone {missing}, superseded {stale}, "
                f"not archived {unarchived}"
            )

    def _archive(self, plan: CompactionPlan) -> None:
        """The compressed messages into the archive, the batches written and linked."""
        cid = plan.conversation_id
        owner: dict[str, str] = {}
        for stored in sorted(plan.new_batches, key=lambda b: b.batch.depth):
            for message_id in stored.batch.source_message_ids:
                owner.setdefault(message_id, stored.id)
        gone = [self.messages.pop((cid, i)) for i in plan.deleted_message_ids]
        for old_row in gone:
            if old_row.kind != "clip_archive":
                self.archived[cid, old_row.message.id] = _Archived(
                    old_row.message, owner.get(old_row.message.id), self.now(), old_row.tokens
                )
        for old, new in plan.superseded:
            self.batches[old] = self.batches[old].model_copy(update={"superseded_by": new})
        for stored in plan.new_batches:
            self.batches.setdefault(stored.id, stored)
        for message_id, batch_id in owner.items():  # turns archived before: relinked
            entry = self.archived.get((cid, message_id))
            if entry is not None and message_id not in plan.deleted_message_ids:
                self.archived[cid, message_id] = replace(entry, batch_id=batch_id)

    def _live_batch(self, batch_id: str) -> StoredBatch | None:
        batch = self.batches.get(batch_id)
        return batch if batch is not None and batch.superseded_by is None else None

    # -- MemoryStore ------------------------------------------------------------

    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        self._call("live_batches")
        return [
            b
            for b in self.batches.values()
            if b.conversation_id == conversation_id and b.superseded_by is None
        ]

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
        self._call("memory_read")
        self.read_scopes.append(("memory_read", scope))
        terms = _terms(query)
        if not query.strip():
            raise ValueError("memory_read needs a non-empty query")

        def outside(cid: str) -> bool:
            wrong_tenant = tenant_id is not None and self.tenants.get(cid) != tenant_id
            hidden = not self._visible(scope, cid)
            return hidden or wrong_tenant or conversation_id not in (None, cid)

        scores: dict[str, float] = {}
        turns: dict[str, list[tuple[int, ConversationMessage]]] = {}
        for stored in self.batches.values():
            if outside(stored.conversation_id):
                continue
            overlap = len(terms & _terms(stored.batch.content)) if sources != "raw" else 0
            if overlap:
                scores[stored.id] = overlap
        for entry in self.archived.values() if sources != "summaries" else ():
            message = entry.message
            if outside(message.conversation_id):
                continue
            overlap = len(terms & _terms(message.content))
            if overlap and entry.batch_id is not None:
                turns.setdefault(entry.batch_id, []).append((overlap, message))
                scores[entry.batch_id] = scores.get(entry.batch_id, 0) + overlap
        ranked = sorted(scores, key=lambda batch_id: -scores[batch_id])[:limit]
        hits = tuple(
            self._hit(self.batches[b], rank, sorted(turns.get(b, []), key=lambda t: -t[0]))
            for rank, b in enumerate(ranked)
        )
        return MemorySearchResult(hits=hits, mode="full_text", sources=sources, query_mode=mode)

    @staticmethod
    def _hit(s: StoredBatch, rank: int, turns: list[tuple[int, ConversationMessage]]) -> MemoryHit:
        return MemoryHit(
            batch_id=s.id,
            label=s.label,
            conversation_id=s.conversation_id,
            content=s.batch.content,
            depth=s.batch.depth,
            start_time=s.batch.start_time,
            end_time=s.batch.end_time,
            message_count=s.batch.message_count,
            score=1.0 / (rank + 1),
            text_rank=rank + 1,
            vector_rank=None,
            superseded=s.superseded_by is not None,
            turns=tuple(
                TurnHit(
                    message_id=m.id,
                    role=m.role,
                    created_at=m.created_at,
                    text=m.content,
                    truncated=False,
                    score=float(overlap),
                    text_rank=index + 1,
                    vector_rank=None,
                )
                for index, (overlap, m) in enumerate(turns[:3])
            ),
        )

    async def expand_batch(
        self,
        conversation_id: str,
        batch_id: str,
        *,
        scope: ReadScope | None = None,
        after: MessageKey | None = None,
        limit: int | None = None,
    ) -> ExpandedBatch | None:
        self._call("expand_batch")
        self.read_scopes.append(("expand_batch", scope))
        stored = self.batches.get(batch_id)
        if stored is None or stored.conversation_id != conversation_id:
            return None
        if not self._visible(scope, conversation_id):
            return None
        covered = set(stored.batch.source_message_ids)
        turns = sorted(
            (
                a.message
                for (cid, message_id), a in self.archived.items()
                if cid == conversation_id and message_id in covered
            ),
            key=lambda m: (m.created_at, m.id),
        )
        page = tuple(_page(turns, after, limit))
        return ExpandedBatch(
            batch=stored,
            turns=page,
            turns_missing=len(covered) - len(turns),
            turn_tokens={m.id: self.archived[conversation_id, m.id].tokens for m in page},
        )

    async def compaction_log(
        self, conversation_id: str, *, scope: ReadScope | None = None
    ) -> list[CompactionRecord]:
        self._call("compaction_log")
        self.read_scopes.append(("compaction_log", scope))
        if not self._visible(scope, conversation_id):
            return []
        return [
            CompactionRecord(
                compaction_id=compaction_id,
                created_at=when,
                messages_compressed=plan.messages_compressed,
                batches_created=len(plan.new_batches),
                tokens_before=plan.tokens_estimate_before,
                tokens_after=plan.tokens_estimate_after,
                usage=plan.usage,
                batches=tuple(self._compacted(b.id) for b in plan.new_batches),
            )
            for compaction_id, (when, plan) in self.compaction_plans.items()
            if self.compaction_owner.get(compaction_id) == conversation_id
        ]

    def _compacted(self, batch_id: str) -> CompactedBatch:
        stored = self.batches[batch_id]
        return CompactedBatch(
            batch_id=stored.id,
            label=stored.label,
            depth=stored.batch.depth,
            start_time=stored.batch.start_time,
            end_time=stored.batch.end_time,
            message_count=stored.batch.message_count,
            superseded_by=stored.superseded_by,
        )

    async def expire_raw_turns(self) -> int:
        self._call("expire_raw_turns")
        if self.raw_retention_days == 0:
            return 0
        cutoff = self.now() - timedelta(days=self.raw_retention_days)
        expired = [i for i, a in self.archived.items() if a.archived_at < cutoff]
        for message_id in expired:
            del self.archived[message_id]
        return len(expired)

    # -- PrivacyStore -------------------------------------------------------------

    async def move_to_tenant(self, conversation_id: str, tenant_id: str) -> bool:
        self._call("move_to_tenant")
        source, target = (
            conversation_key(None, conversation_id),
            conversation_key(tenant_id, conversation_id),
        )
        moving, there = self._has_rows(source), self._has_rows(target)
        if not moving:
            if there:
                return False
            raise TenantConflictError(f"no conversation {conversation_id!r} without a tenant")
        if there:
            raise TenantConflictError(f"{tenant_id} has a conversation {conversation_id!r}")
        self._rekey(source, target)
        self.tenants.pop(source, None)
        self.tenants[target] = tenant_id
        return True

    def _has_rows(self, conversation_id: str) -> bool:
        return any(cid == conversation_id for cid, _ in self.messages) or any(
            b.conversation_id == conversation_id for b in self.batches.values()
        )

    def _rekey(self, source: str, target: str) -> None:
        def moved(message: ConversationMessage) -> ConversationMessage:
            return message.model_copy(update={"conversation_id": target})

        for (cid, mid), row in list(self.messages.items()):
            if cid == source:
                del self.messages[cid, mid]
                self.messages[target, mid] = _Row(moved(row.message), row.tokens, row.seq, row.kind)
        for (cid, mid), entry in list(self.archived.items()):
            if cid == source:
                del self.archived[cid, mid]
                self.archived[target, mid] = replace(entry, message=moved(entry.message))
        for batch_id, batch in list(self.batches.items()):
            if batch.conversation_id == source:
                self.batches[batch_id] = batch.model_copy(update={"conversation_id": target})
        for compaction_id, owner in list(self.compaction_owner.items()):
            if owner == source:
                self.compaction_owner[compaction_id] = target
        for item in self.outbox:
            if item.conversation_id == source:
                item.conversation_id = target
        if source in self.erasures:
            self.erasures[target] = self.erasures.pop(source)

    async def erase_conversation(self, conversation_id: str, erasure: Erasure) -> EraseOutcome:
        self._call("erase_conversation")
        removed = self._delete(conversation_id)
        for entry in self.audit:
            if (entry.request_id, entry.conversation_id) == (erasure.request_id, conversation_id):
                return EraseOutcome(entry.counts, entry.epoch, entry.erased_at, repeated=True)
        before = self.erasures.get(conversation_id)
        mark = EraseMark(
            cutoff=erasure.requested_at
            if before is None
            else max(before.cutoff, erasure.requested_at),
            offsets=merged_offsets(before.offsets if before else {}, erasure.offsets),
            epoch=1 if before is None else before.epoch + 1,
        )
        self.erasures[conversation_id] = mark
        self.audit.append(
            AuditEntry(
                request_id=erasure.request_id,
                conversation_id=conversation_id,
                requester=erasure.requester,
                reason=erasure.reason,
                requested_at=erasure.requested_at,
                erased_at=erasure.erased_at,
                epoch=mark.epoch,
                counts=removed,
            )
        )
        return EraseOutcome(removed, mark.epoch, erasure.erased_at)

    def _delete(self, conversation_id: str) -> dict[str, int]:

        def mine(message: ConversationMessage) -> bool:
            return message.conversation_id == conversation_id

        messages = [i for i, row in self.messages.items() if mine(row.message)]
        archived = [i for i, entry in self.archived.items() if mine(entry.message)]
        batches = [i for i, b in self.batches.items() if b.conversation_id == conversation_id]
        owned = {c for c, owner in self.compaction_owner.items() if owner == conversation_id}
        outbox = [o for o in self.outbox if o.conversation_id == conversation_id]
        for key in messages:
            del self.messages[key]
        for key in archived:
            del self.archived[key]
        for i in batches:
            del self.batches[i]
        for c in owned:
            self.compactions.discard(c)
            del self.compaction_owner[c]
            self.compaction_plans.pop(c, None)
            self.compaction_usage.pop(c, None)
        self.outbox = [o for o in self.outbox if o.conversation_id != conversation_id]
        known = conversation_id in self.tenants
        self.tenants.pop(conversation_id, None)
        return {
            "outbox": len(outbox),
            "compactions": len(owned),
            "archived_messages": len(archived),
            "archival_memory": len(batches),
            "messages": len(messages),
            "conversations": int(known),
        }

    # -- OutboxStore ------------------------------------------------------------

    async def pending_outbox(
        self, *, older_than_seconds: float = 0.0, limit: int = 100
    ) -> list[OutboxRow]:
        self._call("pending_outbox")
        written_by = self.now() - timedelta(seconds=older_than_seconds)
        rows = [o.row for o in self.outbox if not o.published and o.created_at <= written_by]
        return rows[:limit]

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        self._call("outbox_rows")
        return [
            o.row.model_copy(update={"published": o.published})
            for o in self.outbox
            if o.row.compaction_id == compaction_id
        ]

    async def mark_published(self, ids: Sequence[int]) -> None:
        self._call("mark_published")
        for entry in self.outbox:
            if entry.row.id in ids:
                entry.published = True

    async def mark_compaction_published(self, compaction_id: str) -> None:
        self._call("mark_compaction_published")
        for entry in self.outbox:
            if entry.row.compaction_id == compaction_id:
                entry.published = True

    # -- TallySource --------------------------------------------------------------

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        self._call("totals_of")
        totals: dict[str, StoreTotals] = {}
        for conversation_id in conversation_ids:
            rows = [
                r for r in self.messages.values() if r.message.conversation_id == conversation_id
            ]
            mark = self.erasures.get(conversation_id)
            totals[conversation_id] = StoreTotals(
                sum(r.tokens for r in rows),
                len(rows),
                max((r.seq for r in rows), default=None),
                0 if mark is None else mark.epoch,
            )
        return totals

    async def last_seq(self, conversation_id: str) -> int | None:
        self._call("last_seq")
        seqs = [
            r.seq for r in self.messages.values() if r.message.conversation_id == conversation_id
        ]
        return max(seqs, default=None)

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        self._call("conversations_over")
        totals: dict[str, int] = {}
        for row in self.messages.values():
            cid = row.message.conversation_id
            totals[cid] = totals.get(cid, 0) + row.tokens
        over = [(cid, total) for cid, total in totals.items() if total > threshold]
        return sorted(over, key=lambda pair: (-pair[1], pair[0]))

    async def tenant_llm_tokens(self, tenant_id: str, since: datetime) -> int:
        self._call("tenant_llm_tokens")
        return sum(
            usage.total_tokens
            for tenant, at, usage in self.compaction_usage.values()
            if tenant == tenant_id and at >= since and usage.summarizer != "extractive"
        )

    async def usage_by_day(
        self, *, scope: ReadScope, tenant_id: str | None = None, since: date | None = None
    ) -> list[UsageDay]:
        self._call("usage_by_day")
        self.read_scopes.append(("usage_by_day", scope))
        days: dict[tuple[str | None, date], list[LlmUsage]] = {}
        for compaction_id, (tenant, at, usage) in self.compaction_usage.items():
            conversation = self.compaction_owner[compaction_id]
            if not self._visible(scope, conversation):
                continue
            day = at.astimezone(UTC).date()
            if (tenant_id is None or tenant == tenant_id) and (since is None or day >= since):
                days.setdefault((tenant, day), []).append(usage)
        return [
            UsageDay(
                tenant_id=tenant,
                day=day,
                compactions=len(spent),
                llm_calls=sum(u.calls for u in spent),
                input_tokens=sum(u.input_tokens for u in spent),
                output_tokens=sum(u.output_tokens for u in spent),
                cache_read_tokens=sum(u.cache_read_tokens for u in spent),
                cache_write_tokens=sum(u.cache_write_tokens for u in spent),
                cost_usd=round(sum(u.cost_usd or 0.0 for u in spent), 9),
                fallback_compactions=sum(u.fallback for u in spent),
            )
            for (tenant, day), spent in sorted(
                days.items(),
                key=lambda item: (item[0][1], item[0][0] is not None, item[0][0] or ""),
            )
        ]

    async def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class Published:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class RecordingPublisher:
    """``core.ports.publisher.Publisher`` that keeps what was sent, in order."""

    sent: list[Published] = field(default_factory=list)
    fail_next: Exception | None = None

    async def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> RecordPosition:
        """Where it went: one partition per topic, offsets counting from 0."""
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        offset = len(self.on(topic))
        self.sent.append(Published(topic, key, value, tuple(headers or ())))
        return RecordPosition(0, offset)

    def on(self, topic: str) -> list[Published]:
        return [p for p in self.sent if p.topic == topic]


if TYPE_CHECKING:

    def _implements_ports(store: InMemoryStore) -> WorkerStore:
        """Never called: makes mypy prove the in-memory store satisfies every port."""
        return store


def _page(
    ordered: list[ConversationMessage], after: MessageKey | None, limit: int | None
) -> list[ConversationMessage]:
    """Keyset pagination as PostgreSQL's: the messages after ``after``, at most ``limit``."""
    rest = [m for m in ordered if after is None or MessageKey.of(m).order() > after.order()]
    return rest if limit is None else rest[:limit]
