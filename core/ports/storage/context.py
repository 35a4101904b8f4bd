"""The context a platform reads at every turn: the live history with its stored
token counts, and where it stands (its version, its watermark).

One read, ``context_look``, in one round trip: where the conversation stands
(its version, whether a message the caller just published is in) and, only
when the caller does not already hold that version, the whole history. Most
turns find the context as they left it and read one small row. It runs on the
caller's behalf, under its ``ReadScope``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.domain.context_fit import Sized
from core.ports.storage.reads import ReadScope


@dataclass(frozen=True)
class Watermark:
    """The newest record of the messages topic processed for the conversation: its
    message id, partition and offset (None outside Kafka, or before migration 0013
    for conversations not written to since). Every record of that partition up to
    ``offset`` that belongs to the conversation is in its history (or summarised)."""

    message_id: str | None = None
    partition: int | None = None
    offset: int | None = None

    def covers(self, partition: int, offset: int) -> bool:
        """Whether the record at ``partition``:``offset`` (the conversation's) is in."""
        return self.partition == partition and self.offset is not None and self.offset >= offset


@dataclass(frozen=True)
class ContextVersion:
    """``version`` changes whenever the history does (a message stored, a compaction
    applied, an erase): (newest arrival number, rows). ``exists``: the conversation
    has a history the scope sees. ``includes``: the message asked about is stored,
    live or archived (summarised); True when none was asked about."""

    version: tuple[int, int]
    watermark: Watermark
    exists: bool
    includes: bool = True


@dataclass(frozen=True)
class ContextSnapshot:
    version: ContextVersion
    history: tuple[Sized, ...]  # in model order: the clip-archive first, then by time


ContextLook = ContextSnapshot | ContextVersion
"""A snapshot, or the version alone: the caller already holds that version's
history, or the message it asked about is not stored yet."""


class ContextReader(Protocol):
    async def context_look(
        self,
        conversation_id: str,
        *,
        scope: ReadScope,
        through: str | None = None,
        known: tuple[int, int] | None = None,
    ) -> ContextLook:
        """Where the conversation stands, and its whole live history with each
        message's stored token count (from the same snapshot) unless its version
        is ``known`` or ``through`` is not stored yet. One round trip."""
        ...
