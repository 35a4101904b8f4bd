"""The context a platform reads at every turn: the live history with its stored
token counts, and where it stands (its version, its watermark).

Two reads, because most turns find the context as it was: ``context_version``
answers in one small query whether anything changed (and whether a message
the caller just published is in), ``context_snapshot`` reads the whole
history only when it did. Both run on the caller's behalf, under its
``ReadScope``.
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


class ContextReader(Protocol):
    async def context_version(
        self, conversation_id: str, *, scope: ReadScope, through: str | None = None
    ) -> ContextVersion:
        """Where the conversation stands, in one round trip of a scoped read."""
        ...

    async def context_snapshot(
        self, conversation_id: str, *, scope: ReadScope, through: str | None = None
    ) -> ContextSnapshot:
        """The whole live history with each message's stored token count, and its
        version, from one snapshot."""
        ...
