"""Erasure and moving a conversation into a tenant, in memory (``PrivacyStore``)."""

from __future__ import annotations

from dataclasses import replace

from core.domain.erasure import EraseMark, merged_offsets
from core.domain.messages import ConversationMessage
from core.domain.tenancy import conversation_key
from core.ports.storage import (
    EraseOutcome,
    Erasure,
    TenantConflictError,
)
from tests.support.memory_store.tables import (
    AuditEntry,
    Row,
    Tables,
)


class MemoryPrivacy:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def move_to_tenant(self, conversation_id: str, tenant_id: str) -> bool:
        self._t._call("move_to_tenant")
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
        self._t.tenants.pop(source, None)
        if source in self._t.watermarks:
            self._t.watermarks[target] = self._t.watermarks.pop(source)
        self._t.tenants[target] = tenant_id
        return True

    def _has_rows(self, conversation_id: str) -> bool:
        return any(cid == conversation_id for cid, _ in self._t.messages) or any(
            b.conversation_id == conversation_id for b in self._t.batches.values()
        )

    def _rekey(self, source: str, target: str) -> None:
        def moved(message: ConversationMessage) -> ConversationMessage:
            return message.model_copy(update={"conversation_id": target})

        for (cid, mid), row in list(self._t.messages.items()):
            if cid == source:
                del self._t.messages[cid, mid]
                self._t.messages[target, mid] = Row(
                    moved(row.message), row.tokens, row.seq, row.kind
                )
        for (cid, mid), entry in list(self._t.archived.items()):
            if cid == source:
                del self._t.archived[cid, mid]
                self._t.archived[target, mid] = replace(entry, message=moved(entry.message))
        for batch_id, batch in list(self._t.batches.items()):
            if batch.conversation_id == source:
                self._t.batches[batch_id] = batch.model_copy(update={"conversation_id": target})
        for compaction_id, owner in list(self._t.compaction_owner.items()):
            if owner == source:
                self._t.compaction_owner[compaction_id] = target
        for (cid, *rest), refusal in list(self._t.rejections.items()):
            if cid == source:
                del self._t.rejections[cid, *rest]
                self._t.rejections[target, rest[0], rest[1]] = refusal
        for item in self._t.outbox_entries:
            if item.conversation_id == source:
                item.conversation_id = target
                if item.row.topic == "clip_archives":  # keyed by the conversation key
                    item.row = item.row.model_copy(update={"key": target})
        self._t.audit = [
            replace(e, conversation_id=target) if e.conversation_id == source else e
            for e in self._t.audit
        ]
        self._merge_marks(source, target)

    def _merge_marks(self, source: str, target: str) -> None:
        """The moved conversation's erase mark: what either covered, both's erases."""
        moving, there = self._t.erasures.pop(source, None), self._t.erasures.get(target)
        if moving is None:
            return
        if there is None:
            self._t.erasures[target] = moving
            return
        self._t.erasures[target] = EraseMark(
            cutoff=max(moving.cutoff, there.cutoff),
            offsets=merged_offsets(moving.offsets, there.offsets),
            epoch=moving.epoch + there.epoch,
        )

    async def erase_conversation(self, conversation_id: str, erasure: Erasure) -> EraseOutcome:
        self._t._call("erase_conversation")
        removed = self._delete(conversation_id)
        for entry in self._t.audit:
            if (entry.request_id, entry.conversation_id) == (erasure.request_id, conversation_id):
                return EraseOutcome(entry.counts, entry.epoch, entry.erased_at, repeated=True)
        before = self._t.erasures.get(conversation_id)
        mark = EraseMark(
            cutoff=erasure.requested_at
            if before is None
            else max(before.cutoff, erasure.requested_at),
            offsets=merged_offsets(before.offsets if before else {}, erasure.offsets),
            epoch=1 if before is None else before.epoch + 1,
        )
        self._t.erasures[conversation_id] = mark
        self._t.audit.append(
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

        messages = [i for i, row in self._t.messages.items() if mine(row.message)]
        archived = [i for i, entry in self._t.archived.items() if mine(entry.message)]
        batches = [i for i, b in self._t.batches.items() if b.conversation_id == conversation_id]
        owned = {c for c, owner in self._t.compaction_owner.items() if owner == conversation_id}
        outbox = [o for o in self._t.outbox_entries if o.conversation_id == conversation_id]
        refused = [k for k in self._t.rejections if k[0] == conversation_id]
        for key in refused:
            del self._t.rejections[key]
        for key in messages:
            del self._t.messages[key]
        for key in archived:
            del self._t.archived[key]
        for i in batches:
            del self._t.batches[i]
        for c in owned:
            self._t.applied.discard(c)
            del self._t.compaction_owner[c]
            self._t.compaction_plans.pop(c, None)
            spent = self._t.compaction_usage.pop(c, None)
            if spent is not None:  # kept as a content-free aggregate (migration 0014)
                self._t.erased_usage.append(spent)
        self._t.outbox_entries = [
            o for o in self._t.outbox_entries if o.conversation_id != conversation_id
        ]
        known = conversation_id in self._t.tenants
        self._t.tenants.pop(conversation_id, None)
        self._t.watermarks.pop(conversation_id, None)
        return {
            "outbox": len(outbox),
            "compaction_rejections": len(refused),
            "compactions": len(owned),
            "archived_messages": len(archived),
            "archival_memory": len(batches),
            "messages": len(messages),
            "conversations": int(known),
        }
