"""Storing messages and reading the history, in memory (``IngestStore``, ``History``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from core.domain.messages import ConversationMessage
from core.domain.tenancy import tenant_of
from core.ports.storage import (
    CompactionInputs,
    FreeSaved,
    IncomingMessage,
    MessageKey,
    ReadScope,
    SaveOutcome,
    Watermark,
)
from tests.support.memory_store.tables import (
    Row,
    Tables,
    page,
)


def _check_tokens(batch: Sequence[IncomingMessage]) -> None:
    if any(incoming.tokens < 0 for incoming in batch):
        raise ValueError("token counts must be >= 0")


class MemoryIngest:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def save_free(self, batch: Sequence[IncomingMessage]) -> FreeSaved:
        """As ``PostgresIngest``: the conversations in ``Tables.held`` (a compaction
        being written, as a test sets it) are left, the rest stored at once."""
        self._t._call("save_free")
        _check_tokens(batch)
        free = [
            (n, i) for n, i in enumerate(batch) if i.message.conversation_id not in self._t.held
        ]
        left = tuple(n for n, i in enumerate(batch) if i.message.conversation_id in self._t.held)
        return FreeSaved({n: self._save(incoming) for n, incoming in free}, left)

    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """All or nothing, like the one transaction ``PostgresStore`` uses."""
        self._t._call("save_messages")
        _check_tokens(batch)
        return [self._save(incoming) for incoming in batch]

    def _save(self, incoming: IncomingMessage) -> SaveOutcome:
        message = incoming.message
        if self._erased(incoming):
            return SaveOutcome("erased")
        # The conversations table: the tenant the key names, for row-level security,
        # and the newest record processed for the conversation, never moved back.
        self._t.tenants.setdefault(message.conversation_id, tenant_of(message.conversation_id))
        self._advance(incoming)
        compacted = any(
            message.id in b.batch.source_message_ids
            for b in self._t.batches.values()
            if b.conversation_id == message.conversation_id
        )
        if (message.conversation_id, message.id) in self._t.messages or compacted:
            return SaveOutcome("duplicate")
        row = Row(message, incoming.tokens, self._t.next_seq())
        self._t.messages[message.conversation_id, message.id] = row
        return SaveOutcome("inserted", row.seq)

    def _advance(self, incoming: IncomingMessage) -> None:
        if incoming.offset is None:
            return
        key = incoming.message.conversation_id
        now = self._t.watermarks.get(key)
        if (
            now is None
            or now.offset is None
            or now.partition != incoming.partition
            or incoming.offset > now.offset
        ):
            self._t.watermarks[key] = Watermark(
                incoming.message.id, incoming.partition, incoming.offset
            )

    def _erased(self, incoming: IncomingMessage) -> bool:
        mark = self._t.erasures.get(incoming.message.conversation_id)
        return mark is not None and mark.covers(
            incoming.partition, incoming.offset, incoming.message.created_at
        )


class MemoryHistory:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

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
        self._t._call("load_history")
        self._t.read_scopes.append(("load_history", scope))
        if as_of is not None and as_of.utcoffset() is None:  # as PostgresHistory
            raise ValueError("as_of must be timezone-aware")
        if not self._t._visible(scope, conversation_id):
            return []
        return page(self._history(conversation_id, as_of, up_to_seq), after, limit)

    def _history(
        self, conversation_id: str, as_of: datetime | None, up_to_seq: int | None
    ) -> list[ConversationMessage]:
        # Like PostgreSQL's rows: a clip-archive is what the store stored as one (kind),
        # never a message that looks like one.
        rows = [
            r for r in self._t.messages.values() if r.message.conversation_id == conversation_id
        ]
        clips = [r.message.as_clip_archive() for r in rows if r.kind == "clip_archive"]
        body = [
            r.message.as_clip_archive(False) if r.message.stored_clip_archive else r.message
            for r in rows
            if r.kind != "clip_archive"
            and (as_of is None or r.message.created_at <= as_of)
            and (up_to_seq is None or r.seq <= up_to_seq)
        ]
        return [*clips, *sorted(body, key=lambda m: (m.created_at, m.id))]

    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> CompactionInputs:
        self._t._call("compaction_inputs")
        rows = [
            r for r in self._t.messages.values() if r.message.conversation_id == conversation_id
        ]
        history = self._history(conversation_id, None, up_to_seq)
        return CompactionInputs(
            applied=compaction_id in self._t.applied,
            total=sum(r.tokens for r in rows),
            history=history,
            stored_tokens={m.id: self._t.messages[conversation_id, m.id].tokens for m in history},
        )
