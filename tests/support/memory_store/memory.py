"""The archive and ``memory_read``, in memory (``Archive``, ``MemorySearch``).

Search is a plain term-overlap ranking: good enough for components, not a
model of PostgreSQL's full-text search."""

from __future__ import annotations

from datetime import timedelta

from core.domain.compaction import StoredBatch
from core.domain.messages import ConversationMessage
from core.ports.storage import (
    CompactedBatch,
    CompactionRecord,
    ExpandedBatch,
    MemoryHit,
    MemorySearchResult,
    MessageKey,
    QueryMode,
    ReadScope,
    SearchSources,
    TurnHit,
)
from tests.support.memory_store.tables import (
    Tables,
    page,
    terms_of,
)


class MemoryArchive:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        self._t._call("live_batches")
        t = self._t
        live = [
            b
            for b in t.batches.values()
            if b.conversation_id == conversation_id and b.superseded_by is None
        ]
        return sorted(
            live, key=lambda b: (t.archive_order.get(b.id, t.batch_seq[b.id]), t.batch_seq[b.id])
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
        self._t._call("expand_batch")
        self._t.read_scopes.append(("expand_batch", scope))
        stored = self._t.batches.get(batch_id)
        if stored is None or stored.conversation_id != conversation_id:
            return None
        if not self._t._visible(scope, conversation_id):
            return None
        covered = set(stored.batch.source_message_ids)
        turns = sorted(
            (
                a.message
                for (cid, message_id), a in self._t.archived.items()
                if cid == conversation_id and message_id in covered
            ),
            key=lambda m: (m.created_at, m.id),
        )
        shown = tuple(page(turns, after, limit))
        return ExpandedBatch(
            batch=stored,
            turns=shown,
            turns_missing=len(covered) - len(turns),
            turn_tokens={m.id: self._t.archived[conversation_id, m.id].tokens for m in shown},
        )

    async def compaction_log(
        self, conversation_id: str, *, scope: ReadScope | None = None
    ) -> list[CompactionRecord]:
        self._t._call("compaction_log")
        self._t.read_scopes.append(("compaction_log", scope))
        if not self._t._visible(scope, conversation_id):
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
                strategies=plan.strategies,
            )
            for compaction_id, (when, plan) in self._t.compaction_plans.items()
            if self._t.compaction_owner.get(compaction_id) == conversation_id
        ]

    def _compacted(self, batch_id: str) -> CompactedBatch:
        stored = self._t.batches[batch_id]
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
        self._t._call("expire_raw_turns")
        if self._t.raw_retention_days == 0:
            return 0
        cutoff = self._t.now() - timedelta(days=self._t.raw_retention_days)
        expired = [i for i, a in self._t.archived.items() if a.archived_at < cutoff]
        for message_id in expired:
            del self._t.archived[message_id]
        return len(expired)


class MemoryRead:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

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
        self._t._call("memory_read")
        self._t.read_scopes.append(("memory_read", scope))
        terms = terms_of(query)
        if not query.strip():
            raise ValueError("memory_read needs a non-empty query")

        def outside(cid: str) -> bool:
            wrong_tenant = tenant_id is not None and self._t.tenants.get(cid) != tenant_id
            hidden = not self._t._visible(scope, cid)
            return hidden or wrong_tenant or conversation_id not in (None, cid)

        scores: dict[str, float] = {}
        turns: dict[str, list[tuple[int, ConversationMessage]]] = {}
        every_turn: list[tuple[int, ConversationMessage]] = []
        for stored in self._t.batches.values():
            if outside(stored.conversation_id):
                continue
            overlap = len(terms & terms_of(stored.batch.content)) if sources != "raw" else 0
            if overlap:
                scores[stored.id] = overlap
        for entry in self._t.archived.values() if sources != "summaries" else ():
            message = entry.message
            if outside(message.conversation_id):
                continue
            overlap = len(terms & terms_of(message.content))
            if overlap:  # a turn a strategy archived has no batch, and is found all the same
                every_turn.append((overlap, message))
            if overlap and entry.batch_id is not None:
                turns.setdefault(entry.batch_id, []).append((overlap, message))
                scores[entry.batch_id] = scores.get(entry.batch_id, 0) + overlap
        ranked = sorted(scores, key=lambda batch_id: -scores[batch_id])[:limit]
        hits = tuple(
            self._hit(self._t.batches[b], rank, sorted(turns.get(b, []), key=lambda t: -t[0]))
            for rank, b in enumerate(ranked)
        )
        best = sorted(every_turn, key=lambda t: -t[0])[:limit]
        found = tuple(_turn_hit(overlap, m, index) for index, (overlap, m) in enumerate(best))
        return MemorySearchResult(
            hits=hits, mode="full_text", sources=sources, query_mode=mode, turns=found
        )

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
                _turn_hit(overlap, m, index) for index, (overlap, m) in enumerate(turns[:3])
            ),
        )


def _turn_hit(overlap: int, message: ConversationMessage, index: int) -> TurnHit:
    return TurnHit(
        message_id=message.id,
        role=message.role,
        created_at=message.created_at,
        text=message.content,
        truncated=False,
        score=float(overlap),
        text_rank=index + 1,
        vector_rank=None,
    )
