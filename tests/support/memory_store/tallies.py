"""The stored counts, in memory (``TallySource``)."""

from __future__ import annotations

from collections.abc import Collection

from core.ports.storage import (
    StoreTotals,
)
from tests.support.memory_store.tables import (
    Tables,
)


class MemoryTallies:
    def __init__(self, tables: Tables) -> None:
        self._t = tables

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        self._t._call("totals_of")
        totals: dict[str, StoreTotals] = {}
        for conversation_id in conversation_ids:
            rows = [
                r for r in self._t.messages.values() if r.message.conversation_id == conversation_id
            ]
            mark = self._t.erasures.get(conversation_id)
            totals[conversation_id] = StoreTotals(
                sum(r.tokens for r in rows),
                len(rows),
                max((r.seq for r in rows), default=None),
                0 if mark is None else mark.epoch,
            )
        return totals

    async def last_seq(self, conversation_id: str) -> int | None:
        self._t._call("last_seq")
        seqs = [
            r.seq for r in self._t.messages.values() if r.message.conversation_id == conversation_id
        ]
        return max(seqs, default=None)

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        self._t._call("conversations_over")
        totals: dict[str, int] = {}
        for row in self._t.messages.values():
            cid = row.message.conversation_id
            totals[cid] = totals.get(cid, 0) + row.tokens
        over = [(cid, total) for cid, total in totals.items() if total > threshold]
        return sorted(over, key=lambda pair: (-pair[1], pair[0]))
