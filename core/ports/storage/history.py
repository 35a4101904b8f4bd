"""A conversation's live history: as a reader pages it, as a compaction plans from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from core.domain.messages import ConversationMessage
from core.ports.storage.reads import MessageKey, ReadScope


@dataclass(frozen=True)
class CompactionInputs:
    """What the processor needs before it plans, read from one snapshot."""

    applied: bool  # the compaction id is already recorded
    total: int  # the conversation's stored token total
    history: list[ConversationMessage]  # in model order, up to the command's cut
    # message id → its stored token count, for each message of ``history``: what a
    # compaction that removes it takes off the total (``StoredTokens.of``)
    stored_tokens: dict[str, int] = field(default_factory=dict)


class HistoryReader(Protocol):
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
        """The conversation in model order: clip-archive first, then by time.

        ``after`` / ``limit`` read one page (keyset pagination): at most ``limit``
        messages strictly after ``after`` in that order (None: from the start /
        all of them).

        ``up_to_seq`` excludes messages stored after that arrival number, so a
        compaction never touches messages that arrived after its command;
        ``as_of`` does the same by ``created_at``. With a ``scope`` (a read on a
        caller's behalf) a conversation outside it reads as empty.
        """
        ...


class CompactionInputsReader(Protocol):
    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> CompactionInputs:
        """Is the compaction applied, the conversation's stored total and its
        history up to ``up_to_seq``: every compaction asks all three, so a store
        answers them together (PostgreSQL: one round trip, one snapshot)."""
        ...


class History(HistoryReader, CompactionInputsReader, Protocol):
    """The history role: what a store implements (``Storage.history``)."""
