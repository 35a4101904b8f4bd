"""Where this worker's outstanding commands went on the commands topic.

Why: reconciliation must tell a late command (still queued behind a backlog)
from a lost one. The issue time alone cannot: accounting issues a whole batch
of commands at one instant, so the broker's offsets-by-time lookup finds only
the batch's first record. The offset the broker acknowledged is exact; it is
kept here, in memory, for the commands this process sent (after a restart or
a rebalance the time is all there is, and ``CommandBacklog`` falls back to it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from core.ports.publisher import RecordPosition

# Safety bound: entries leave on completion; this only caps what lost ones keep.
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class IssuedCommand:
    """An outstanding command: when it was (last) issued and, if this process
    sent it, where the broker put it."""

    at: float
    position: RecordPosition | None = None


class IssuedCommands:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._max = max_entries
        self._sent: OrderedDict[str, tuple[str, RecordPosition]] = OrderedDict()

    def sent(self, conversation_key: str, compaction_id: str, position: RecordPosition) -> None:
        self._sent[conversation_key] = (compaction_id, position)
        self._sent.move_to_end(conversation_key)
        while len(self._sent) > self._max:
            self._sent.popitem(last=False)

    def finished(self, conversation_key: str) -> None:
        self._sent.pop(conversation_key, None)

    def position(self, conversation_key: str, compaction_id: str) -> RecordPosition | None:
        """Where the last copy of this command went, if this process sent it."""
        entry = self._sent.get(conversation_key)
        return entry[1] if entry is not None and entry[0] == compaction_id else None

    def __len__(self) -> int:
        return len(self._sent)
