"""Storing incoming messages: the accounting agent's hot path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from core.domain.messages import ConversationMessage


@dataclass(frozen=True)
class IncomingMessage:
    """A message to store, with its token count and where it was read (the messages
    topic's partition and offset; None outside Kafka), which the store checks
    against the conversation's erase mark. Its ``conversation_id`` is the
    conversation key (``core.domain.tenancy``), which names its tenant."""

    message: ConversationMessage
    tokens: int
    partition: int | None = None
    offset: int | None = None


SaveStatus = Literal["inserted", "duplicate", "erased"]
"""``erased``: the conversation was erased and this message is covered by the
erase (read at or below the erase's offset mark, or created at or before its
cutoff); nothing of it is written."""


@dataclass(frozen=True)
class SaveOutcome:
    status: SaveStatus
    seq: int | None = None  # the arrival number, when inserted


@dataclass(frozen=True)
class FreeSaved:
    """What ``save_free`` stored: the outcome of each message stored, by its position
    in the group, and the positions of the messages it left (their conversations
    are held by a compaction being written), in order."""

    outcomes: Mapping[int, SaveOutcome]
    left: tuple[int, ...] = ()


class IngestStore(Protocol):
    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """Insert each message once, in the group's order, in as few round trips as
        the store can: the accounting agent's hot path. A repeated id is a
        ``duplicate``, and so is a message a compaction already archived (it must
        not come back on redelivery); a message an erase covers is ``erased``
        (not written).

        A message's ``conversation_id`` is the conversation key: its tenant (the
        key's, ``core.domain.tenancy``) is recorded with the conversation's
        first message, for the row-level security of reads.
        """
        ...

    async def save_free(self, batch: Sequence[IncomingMessage]) -> FreeSaved:
        """``save_messages`` of the conversations no one else is writing now, without
        waiting for the others: those are left, for ``save_messages``. A group's
        messages then never wait behind a compaction of another conversation, so
        the turn a platform waits for is stored (and its reader told) first. A
        store without such waits stores everything."""
        ...
