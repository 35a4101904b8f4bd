"""The context a platform reads at every turn, in memory (``ContextReader``)."""

from __future__ import annotations

from core.domain.context_fit import Sized
from core.ports.storage import (
    ContextLook,
    ContextSnapshot,
    ContextVersion,
    ReadScope,
    Watermark,
)
from tests.support.memory_store.ingest import MemoryHistory
from tests.support.memory_store.tables import Tables


class MemoryContext:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def context_look(
        self,
        conversation_id: str,
        *,
        scope: ReadScope,
        through: str | None = None,
        known: tuple[int, int] | None = None,
    ) -> ContextLook:
        version = self._version(conversation_id, scope=scope, through=through)
        if not version.includes or version.version == known:
            return version
        self._t._call("context_history")
        if not version.exists:
            return ContextSnapshot(version, ())
        messages = MemoryHistory(self._t)._history(conversation_id, None, None)
        history = tuple(Sized(m, self._t.messages[conversation_id, m.id].tokens) for m in messages)
        return ContextSnapshot(version, history)

    def _version(
        self, conversation_id: str, *, scope: ReadScope, through: str | None
    ) -> ContextVersion:
        self._t._call("context_look")
        self._t.read_scopes.append(("context_look", scope))
        if not self._t._visible(scope, conversation_id):
            return ContextVersion((0, 0), Watermark(), exists=False, includes=through is None)
        rows = [r for (cid, _), r in self._t.messages.items() if cid == conversation_id]
        includes = through is None or any(
            (conversation_id, through) in table for table in (self._t.messages, self._t.archived)
        )
        return ContextVersion(
            version=(max((r.seq for r in rows), default=0), len(rows)),
            watermark=self._t.watermarks.get(conversation_id, Watermark()),
            exists=bool(rows),
            includes=includes,
        )
