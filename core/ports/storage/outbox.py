"""The transactional outbox: events written with a compaction, published after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from core.domain.compaction import StoredTokens


class OutboxRecord(BaseModel):
    """An event to publish once the compaction that produced it has committed.

    ``topic`` is the service's logical name for the destination (it maps it to
    a real topic), so a change of topic prefix does not strand unpublished rows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    key: str
    payload: str


@dataclass(frozen=True)
class CompactionOutbox:
    """What a compaction publishes once committed, written in its transaction: the
    ``records`` in order, and the stored token counts its completion announces
    (``tokens``), which the store checks against the rows it removes and adds."""

    records: tuple[OutboxRecord, ...]
    tokens: StoredTokens


class OutboxRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    compaction_id: str
    topic: str
    key: str
    payload: str
    published: bool = False  # the broker acknowledged it once already


class OutboxStore(Protocol):
    """The transactional outbox: events written with a compaction, published after it."""

    async def pending_outbox(
        self, *, older_than_seconds: float = 0.0, limit: int = 100
    ) -> list[OutboxRow]:
        """Unpublished rows written at least ``older_than_seconds`` ago (by the
        store's clock), oldest first."""
        ...

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        """Every row of one compaction, published or not (``published`` says), in order."""
        ...

    async def mark_published(self, ids: Sequence[int]) -> None:
        """A row published before keeps its first time."""
        ...

    async def mark_compaction_published(self, compaction_id: str) -> None:
        """Every row of one compaction published (a row published before keeps its
        first time): for a relay that sent the records the compaction built and
        never read their ids back."""
        ...
