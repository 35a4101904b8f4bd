"""What the compactor and the service need from storage, one port per role.

Writes are idempotent by message id or compaction id, because every caller
upstream (Kafka) delivers at least once. A store is a set of role objects
(``Storage``): each role's protocol lives in its module (``ingest``,
``history``, ``context``, ``compactions``, ``outbox``, ``archive``, ``memory``,
``tallies``, ``privacy``, ``usage``, ``calibration``), its errors in ``errors``. A component
is handed only the narrow protocol it calls (``streams.worker.runtime``), so
mypy proves what each one may touch, and its call lands in the role's
implementation directly. ``core.adapters.postgres.store.PostgresStore`` holds
PostgreSQL's role objects, ``tests.support.memory_store.InMemoryStore`` the
in-memory ones, and ``tests/contract/`` runs one suite of each port's
behaviour over both.

Every name is importable from this package as well as from its module.
"""

from __future__ import annotations

from typing import Protocol

from core.ports.storage.archive import (
    Archive,
    CompactedBatch,
    CompactionLogReader,
    CompactionRecord,
    ExpandedBatch,
    MemoryReader,
    RawTurnRetention,
)
from core.ports.storage.calibration import TokenRates
from core.ports.storage.compactions import (
    AlreadyApplied,
    Applied,
    ApplyOutcome,
    CompactionLedger,
    Compactions,
    CompactionStore,
    RejectionRecord,
)
from core.ports.storage.context import (
    ContextLook,
    ContextReader,
    ContextSnapshot,
    ContextVersion,
    Watermark,
)
from core.ports.storage.errors import (
    HistoryConflictError,
    StoreConflict,
    StoreError,
    StoreReadTimedOut,
    StoreRejected,
    StoreUnavailable,
    TenantConflictError,
)
from core.ports.storage.history import (
    CompactionInputs,
    CompactionInputsReader,
    History,
    HistoryReader,
)
from core.ports.storage.ingest import (
    FreeSaved,
    IncomingMessage,
    IngestStore,
    SaveOutcome,
    SaveStatus,
)
from core.ports.storage.memory import (
    MatchList,
    MatchReason,
    MemoryHit,
    MemorySearch,
    MemorySearchResult,
    QueryMode,
    SearchSources,
    TurnHit,
)
from core.ports.storage.outbox import CompactionOutbox, OutboxRecord, OutboxRow, OutboxStore
from core.ports.storage.privacy import EraseOutcome, Erasure, PrivacyStore
from core.ports.storage.reads import MessageKey, ReadScope
from core.ports.storage.tallies import StoreTotals, TallySource
from core.ports.storage.usage import UsageStore


class Storage(Protocol):
    """One store's role objects, which share its connections; opened and closed as one.

    Only the composition root and the runtime hold a ``Storage``: a component
    gets the role it calls, typed as that role's narrow protocol.
    """

    @property
    def ingest(self) -> IngestStore: ...

    @property
    def history(self) -> History: ...

    @property
    def context(self) -> ContextReader: ...

    @property
    def compactions(self) -> Compactions: ...

    @property
    def outbox(self) -> OutboxStore: ...

    @property
    def archive(self) -> Archive: ...

    @property
    def memory(self) -> MemorySearch: ...

    @property
    def tallies(self) -> TallySource: ...

    @property
    def privacy(self) -> PrivacyStore: ...

    @property
    def usage(self) -> UsageStore: ...

    @property
    def calibration(self) -> TokenRates: ...

    async def close(self) -> None: ...


__all__ = [
    "AlreadyApplied",
    "Applied",
    "ApplyOutcome",
    "Archive",
    "CompactedBatch",
    "CompactionInputs",
    "CompactionInputsReader",
    "CompactionLedger",
    "CompactionLogReader",
    "CompactionOutbox",
    "CompactionRecord",
    "CompactionStore",
    "Compactions",
    "ContextLook",
    "ContextReader",
    "ContextSnapshot",
    "ContextVersion",
    "EraseOutcome",
    "Erasure",
    "ExpandedBatch",
    "FreeSaved",
    "History",
    "HistoryConflictError",
    "HistoryReader",
    "IncomingMessage",
    "IngestStore",
    "MatchList",
    "MatchReason",
    "MemoryHit",
    "MemoryReader",
    "MemorySearch",
    "MemorySearchResult",
    "MessageKey",
    "OutboxRecord",
    "OutboxRow",
    "OutboxStore",
    "PrivacyStore",
    "QueryMode",
    "RawTurnRetention",
    "ReadScope",
    "RejectionRecord",
    "SaveOutcome",
    "SaveStatus",
    "SearchSources",
    "Storage",
    "StoreConflict",
    "StoreError",
    "StoreReadTimedOut",
    "StoreRejected",
    "StoreTotals",
    "StoreUnavailable",
    "TallySource",
    "TenantConflictError",
    "TokenRates",
    "TurnHit",
    "UsageStore",
    "Watermark",
]
