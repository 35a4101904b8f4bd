"""The store's own counts, which the worker's token table caches."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StoreTotals:
    """A conversation as the model would now see it, and its newest arrival."""

    tokens: int = 0
    rows: int = 0
    last_seq: int | None = None
    epoch: int = 0  # erases of this conversation id so far (salts its compaction ids)


class TallySource(Protocol):
    """The store's own counts, which the token table caches."""

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        """The stored tokens, rows, ``last_seq`` and erase epoch of many conversations
        in one query; every id asked for is in the answer (an unknown one with zeros)."""
        ...

    async def last_seq(self, conversation_id: str) -> int | None:
        """The arrival number of the newest message: a compaction's as-of cut."""
        ...

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        """(conversation, tokens) of every conversation over ``threshold``, largest first:
        what reconciliation compares the table with."""
        ...
