"""What is open for the components: the store's roles and the compactor.

Handed to each component once, when it is built. A component is typed with a
protocol that names only the roles it calls (``processor.CompactionPorts``,
``outbox.OutboxPorts``, ...), so mypy proves it reaches no other part of the
store, and it asks for its role each time it calls it: the worker's runtime
(``streams.runtime.WorkerRuntime``) is opened once at start-up, and until it
is, every role raises ``StoreUnavailable``, which every component already
treats as a database outage. The offline CLI and the tests pass a
``StaticRuntime``.

Why properties rather than a store handed to each component: the store is
opened after the components are built (building the app needs no database),
so a component cannot be given its role object up front; a property per role
keeps that lazy look-up in one place and still hands out one role, typed by
its narrow protocol.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from core.domain.tokens import DEFAULT_COUNTER, TokenCounter
from core.ports.compactor import Compactor
from core.ports.storage import (
    Archive,
    Compactions,
    ContextReader,
    History,
    IngestStore,
    MemorySearch,
    OutboxStore,
    PrivacyStore,
    Storage,
    TallySource,
    UsageStore,
)


class StorePorts(ABC):
    """The store's roles, each looked up in the open store when it is asked for."""

    @abstractmethod
    def opened_store(self) -> Storage:
        """The store, once open; ``StoreUnavailable`` until then."""

    @property
    def ingest(self) -> IngestStore:
        return self.opened_store().ingest

    @property
    def history(self) -> History:
        return self.opened_store().history

    @property
    def context(self) -> ContextReader:
        return self.opened_store().context

    @property
    def compactions(self) -> Compactions:
        return self.opened_store().compactions

    @property
    def outbox(self) -> OutboxStore:
        return self.opened_store().outbox

    @property
    def archive(self) -> Archive:
        return self.opened_store().archive

    @property
    def memory(self) -> MemorySearch:
        return self.opened_store().memory

    @property
    def tallies(self) -> TallySource:
        return self.opened_store().tallies

    @property
    def privacy(self) -> PrivacyStore:
        return self.opened_store().privacy

    @property
    def usage(self) -> UsageStore:
        return self.opened_store().usage


class Runtime(StorePorts):
    """Every role and the compactor: what ``streams.worker.assembly.build_components``
    hands out, each component taking the part its protocol names."""

    @property
    @abstractmethod
    def compactor(self) -> Compactor: ...

    @property
    def token_counter(self) -> TokenCounter:
        """What ingest counts a message's tokens with: the calibrated counter the
        runtime opened (``[budget].token_estimate``), else characters / 4."""
        return DEFAULT_COUNTER


class StaticRuntime(Runtime):
    """A ``Runtime`` whose store and compactor are already open."""

    def __init__(
        self, store: Storage, compactor: Compactor, counter: TokenCounter = DEFAULT_COUNTER
    ) -> None:
        self.store = store
        self._compactor = compactor
        self._counter = counter

    def opened_store(self) -> Storage:
        return self.store

    @property
    def compactor(self) -> Compactor:
        return self._compactor

    @property
    def token_counter(self) -> TokenCounter:
        return self._counter
