"""Storing incoming messages: the accounting agent's hot path."""

from __future__ import annotations

from collections.abc import Sequence
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
