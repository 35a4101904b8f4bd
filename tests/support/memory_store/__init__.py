"""In-memory implementations of the storage ports and the worker's other edges.

``InMemoryStore`` holds one object per role, as ``PostgresStore`` does, over
shared tables (``tables``), and follows PostgreSQL's behaviour: the contract
suite (``tests/contract/``) runs the same tests over both. Idempotent writes
by message id and compaction id, a compaction applied all-or-nothing,
``HistoryConflictError`` when its messages are gone or its stored token counts
are not what its outbox announces, and a compacted message that never comes
back on redelivery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.ports.publisher import RecordPosition
from core.ports.storage import Storage
from tests.support.memory_store.calibration import MemoryTokenRates
from tests.support.memory_store.compactions import MemoryCompactions, MemoryOutbox
from tests.support.memory_store.context import MemoryContext
from tests.support.memory_store.ingest import MemoryHistory, MemoryIngest
from tests.support.memory_store.memory import MemoryArchive, MemoryRead
from tests.support.memory_store.privacy import MemoryPrivacy
from tests.support.memory_store.tables import AuditEntry, Tables
from tests.support.memory_store.tallies import MemoryTallies
from tests.support.memory_store.usage import MemoryUsage

__all__ = ["AuditEntry", "InMemoryStore", "Published", "RecordingPublisher"]


@dataclass
class InMemoryStore(Tables):
    """Every storage role (``Storage``) over one set of tables, which tests read and
    break directly (``messages``, ``outbox_entries``, ``fail_next``, ...)."""

    def __post_init__(self) -> None:
        self.ingest = MemoryIngest(self)
        self.history = MemoryHistory(self)
        self.context = MemoryContext(self)
        self.compactions = MemoryCompactions(self)
        self.outbox = MemoryOutbox(self)
        self.archive = MemoryArchive(self)
        self.memory = MemoryRead(self)
        self.tallies = MemoryTallies(self)
        self.privacy = MemoryPrivacy(self)
        self.usage = MemoryUsage(self)
        self.calibration = MemoryTokenRates(self)

    async def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class Published:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class RecordingPublisher:
    """``core.ports.publisher.Publisher`` that keeps what was sent, in order."""

    sent: list[Published] = field(default_factory=list)
    fail_next: Exception | None = None

    async def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> RecordPosition:
        """Where it went: one partition per topic, offsets counting from 0."""
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        offset = len(self.on(topic))
        self.sent.append(Published(topic, key, value, tuple(headers or ())))
        return RecordPosition(0, offset)

    def on(self, topic: str) -> list[Published]:
        return [p for p in self.sent if p.topic == topic]


if TYPE_CHECKING:

    def _implements(store: InMemoryStore) -> Storage:
        """Never called: makes mypy prove the in-memory store holds every role."""
        return store
