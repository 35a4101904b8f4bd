"""The token table, read and written as ``ConversationTally`` values.

The Faust table stores plain dicts (its changelog is JSON); this wrapper is
the only place that converts, so no other code reads raw entries. Anything
with ``get``/``__setitem__``/``__delitem__``/``items`` works underneath: a
Faust ``Table`` in the worker, a dict in tests and the offline CLI.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from core.accounting import ConversationTally


class TallyTable:
    def __init__(self, table: MutableMapping[str, Any]) -> None:
        self._table = table

    def get(self, conversation_id: str) -> ConversationTally | None:
        raw = self._table.get(conversation_id)
        return None if raw is None else ConversationTally.model_validate(raw)

    def put(self, tally: ConversationTally) -> None:
        self._table[tally.conversation_id] = tally.model_dump()

    def delete(self, conversation_id: str) -> None:
        self._table.pop(conversation_id, None)

    def items(self) -> Iterator[tuple[str, ConversationTally]]:
        """Every entry, over a snapshot of the keys (the agent may write meanwhile)."""
        for conversation_id, raw in list(self._table.items()):
            if raw is not None:
                yield conversation_id, ConversationTally.model_validate(raw)
