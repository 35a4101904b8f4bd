"""What the components need opened for them: the store and the compactor.

Asked for on each use rather than passed in, because the worker opens them
lazily (``streams.bootstrap.LazyRuntime``); tests pass ready-made ones.
"""

from __future__ import annotations

from typing import Protocol

from core.domain.compaction import Compactor
from core.ports.storage import WorkerStore


class Resources(Protocol):
    async def store(self) -> WorkerStore: ...

    async def compactor(self) -> Compactor: ...


class Opened:
    """``Resources`` that are already open (the offline CLI, tests)."""

    def __init__(self, store: WorkerStore, compactor: Compactor) -> None:
        self._store = store
        self._compactor = compactor

    async def store(self) -> WorkerStore:
        return self._store

    async def compactor(self) -> Compactor:
        return self._compactor
