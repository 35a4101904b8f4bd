"""A compaction applied all-or-nothing, and its outbox, in memory (``Compactions``,
``OutboxStore``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from core.domain.compaction import CompactionPlan, StoredBatch, StoredTokens
from core.domain.gate import GateInput, Rejected, check_compaction, gate_applies
from core.domain.tenancy import tenant_of
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    ApplyOutcome,
    CompactionOutbox,
    HistoryConflictError,
    OutboxRow,
    RejectionRecord,
)
from tests.support.memory_store.tables import (
    Archived,
    OutboxEntry,
    Row,
    Tables,
)


class MemoryCompactions:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def apply_compaction(
        self, plan: CompactionPlan, outbox: CompactionOutbox | None = None
    ) -> ApplyOutcome:
        self._t._call("apply_compaction")
        plan.check_consistent()
        if plan.compaction_id in self._t.applied:
            return AlreadyApplied()
        self._check_applicable(plan)
        cid = plan.conversation_id
        clip = plan.clip_archive
        found = StoredTokens(
            removed=sum(self._t.messages[cid, i].tokens for i in plan.deleted_message_ids)
            + sum(self._t.messages[cid, r.id].tokens for r in plan.replaced),
            added=sum(self._t.archived[cid, i].tokens for i in plan.restored_message_ids)
            + plan.clip_tokens
            + sum(r.tokens for r in plan.replaced),
        )
        if outbox is not None and found != outbox.tokens:
            raise HistoryConflictError(
                f"compaction {plan.compaction_id}: {found} stored, {outbox.tokens} announced"
            )
        verdict = self._gate(plan)
        if verdict is not None:
            return verdict
        self._archive(plan)
        self._replace_in_place(plan)
        for message_id in plan.restored_message_ids:  # a restore: back in the history
            back = self._t.archived.pop((cid, message_id))
            self._t.messages[cid, message_id] = Row(back.message, back.tokens, self._t.next_seq())
        if clip is not None:
            self._t.messages[cid, clip.id] = Row(
                clip, plan.clip_tokens, self._t.next_seq(), "clip_archive"
            )
        self._t.applied.add(plan.compaction_id)
        self._t.compaction_owner[plan.compaction_id] = plan.conversation_id
        self._t.compaction_plans[plan.compaction_id] = (self._t.now(), plan)
        self._t.compaction_usage[plan.compaction_id] = (tenant_of(cid), self._t.now(), plan.usage)
        for record in outbox.records if outbox is not None else ():
            row = OutboxRow(
                id=len(self._t.outbox_entries) + 1,
                compaction_id=plan.compaction_id,
                topic=record.topic,
                key=record.key,
                payload=record.payload,
            )
            self._t.outbox_entries.append(OutboxEntry(row, plan.conversation_id, self._t.now()))
        return Applied()

    def _gate(self, plan: CompactionPlan) -> Rejected | None:
        """PostgreSQL's gate (``compaction_gate.run_gate``), on the same rows, before
        anything is touched; a refusal is recorded and nothing else written."""
        if not gate_applies(plan):
            return None
        cid, gone = plan.conversation_id, set(plan.deleted_message_ids)
        compressed = [
            row.message.as_clip_archive() if row.kind == "clip_archive" else row.message
            for row in (self._t.messages[cid, i] for i in plan.deleted_message_ids)
        ]
        kept = [
            row.message for (c, m), row in self._t.messages.items()
            if c == cid and m not in gone and row.kind == "message"
            and (row.message.tool_calls or row.message.tool_call_id)
        ]  # fmt: skip
        verdict = check_compaction(GateInput(plan, compressed, kept))
        if not isinstance(verdict, Rejected):
            return None
        key = (cid, plan.compaction_id, plan.usage.summarizer)
        self._t.rejections.setdefault(
            key,
            RejectionRecord(
                plan.compaction_id, plan.usage.summarizer, verdict.reason, verdict.detail,
                self._t.now(),
            ),
        )  # fmt: skip
        return verdict

    async def rejections(self, conversation_id: str, limit: int = 50) -> list[RejectionRecord]:
        self._t._call("rejections")
        found = [r for (c, _, _), r in self._t.rejections.items() if c == conversation_id]
        return sorted(found, key=lambda r: r.rejected_at, reverse=True)[:limit]

    async def set_pinned(self, conversation_id: str, message_id: str, pinned: bool) -> bool:
        self._t._call("set_pinned")
        row = self._t.messages.get((conversation_id, message_id))
        if row is None or row.kind != "message":
            return False
        row.message = row.message.model_copy(update={"pinned": pinned})
        return True

    async def pinned_tokens(self, conversation_id: str) -> int:
        self._t._call("pinned_tokens")
        return sum(
            row.tokens for (c, _), row in self._t.messages.items()
            if c == conversation_id and row.message.pinned
        )  # fmt: skip

    def _check_applicable(self, plan: CompactionPlan) -> None:
        cid = plan.conversation_id
        missing = [i for i in plan.deleted_message_ids if (cid, i) not in self._t.messages]
        missing += [
            r.id for r in plan.replaced
            if (cid, r.id) not in self._t.messages or self._t.messages[cid, r.id].kind != "message"
        ]  # fmt: skip
        stale = [old for old, _ in plan.superseded if self._live_batch(old) is None]
        unarchived = [i for i in plan.restored_message_ids if (cid, i) not in self._t.archived]
        if missing or stale or unarchived or self._clip_taken(plan):
            raise HistoryConflictError(
                f"compaction {plan.compaction_id}: gone {missing}, superseded {stale}, "
                f"not archived {unarchived}"
            )

    def _clip_taken(self, plan: CompactionPlan) -> bool:
        """PostgreSQL keeps one clip-archive per conversation: one the plan does not
        replace (or its id taken) conflicts."""
        if plan.clip_archive is None:
            return False
        cid, replaced = plan.conversation_id, set(plan.deleted_message_ids)
        kept = [
            m for (c, m), row in self._t.messages.items()
            if c == cid and row.kind == "clip_archive" and m not in replaced
        ]  # fmt: skip
        return bool(kept) or (cid, plan.clip_archive.id) in self._t.messages

    def _archive(self, plan: CompactionPlan) -> None:
        """The compressed messages into the archive, the batches written and linked."""
        cid = plan.conversation_id
        owner: dict[str, str] = {}
        for stored in sorted(plan.new_batches, key=lambda b: b.batch.depth):
            for message_id in stored.batch.source_message_ids:
                owner.setdefault(message_id, stored.id)
        gone = [self._t.messages.pop((cid, i)) for i in plan.deleted_message_ids]
        for old_row in gone:
            key = (cid, old_row.message.id)
            earlier = self._t.archived.get(key)  # a replaced turn: its full content stays
            if earlier is not None:
                batch = earlier.batch_id or owner.get(old_row.message.id)
                self._t.archived[key] = replace(earlier, batch_id=batch)
            elif old_row.kind != "clip_archive":
                self._t.archived[key] = Archived(
                    old_row.message, owner.get(old_row.message.id), self._t.now(), old_row.tokens
                )
        for old, new in plan.superseded:
            self._t.batches[old] = self._t.batches[old].model_copy(update={"superseded_by": new})
        for stored in plan.new_batches:
            if stored.id not in self._t.batches:
                self._t.batches[stored.id] = stored
                self._t.batch_seq[stored.id] = self._t.next_seq()
        self._place_resummarised(plan)
        for message_id, batch_id in owner.items():  # turns archived before: relinked
            entry = self._t.archived.get((cid, message_id))
            if entry is not None and message_id not in plan.deleted_message_ids:
                self._t.archived[cid, message_id] = replace(entry, batch_id=batch_id)

    def _replace_in_place(self, plan: CompactionPlan) -> None:
        """A strategy's replacements: the full turn archived (once), the live row's
        content and tokens replaced in place."""
        cid = plan.conversation_id
        for r in plan.replaced:
            row = self._t.messages[cid, r.id]
            if (cid, r.id) not in self._t.archived:
                self._t.archived[cid, r.id] = Archived(row.message, None, self._t.now(), row.tokens)
            shorter = row.message.model_copy(update={"content": r.content})
            self._t.messages[cid, r.id] = replace(row, message=shorter, tokens=r.tokens)

    def _place_resummarised(self, plan: CompactionPlan) -> None:
        """A re-summarised batch takes the earliest slot of the batches it folds in."""
        t = self._t
        for stored in plan.new_batches:
            folded = [
                t.archive_order.get(b.id, t.batch_seq[b.id])
                for b in t.batches.values()
                if b.conversation_id == plan.conversation_id and b.superseded_by == stored.id
            ]
            if folded:
                t.archive_order[stored.id] = min(folded)

    def _live_batch(self, batch_id: str) -> StoredBatch | None:
        batch = self._t.batches.get(batch_id)
        return batch if batch is not None and batch.superseded_by is None else None

    async def compaction_applied(self, compaction_id: str) -> bool:
        self._t._call("compaction_applied")
        return compaction_id in self._t.applied


class MemoryOutbox:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def pending_outbox(
        self, *, older_than_seconds: float = 0.0, limit: int = 100
    ) -> list[OutboxRow]:
        self._t._call("pending_outbox")
        written_by = self._t.now() - timedelta(seconds=older_than_seconds)
        rows = [
            o.row for o in self._t.outbox_entries if not o.published and o.created_at <= written_by
        ]
        return rows[:limit]

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        self._t._call("outbox_rows")
        return [
            o.row.model_copy(update={"published": o.published})
            for o in self._t.outbox_entries
            if o.row.compaction_id == compaction_id
        ]

    async def mark_published(self, ids: Sequence[int]) -> None:
        self._t._call("mark_published")
        for entry in self._t.outbox_entries:
            if entry.row.id in ids:
                entry.published = True

    async def mark_compaction_published(self, compaction_id: str) -> None:
        self._t._call("mark_compaction_published")
        for entry in self._t.outbox_entries:
            if entry.row.compaction_id == compaction_id:
                entry.published = True
