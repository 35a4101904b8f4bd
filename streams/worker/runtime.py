"""What is open for the components: the store and the compactor.

Handed to each component once, when it is built. The worker's runtime
(``streams.runtime.WorkerRuntime``) is opened once at start-up; until it is,
``store`` raises ``StoreUnavailable``, which every component already treats as
a database outage. The offline CLI and the tests pass a ``StaticRuntime``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.ports.compactor import Compactor
from core.ports.storage import WorkerStore


class Runtime(Protocol):
    @property
    def store(self) -> WorkerStore: ...

    @property
    def compactor(self) -> Compactor: ...


@dataclass(frozen=True)
class StaticRuntime:
    """A ``Runtime`` whose store and compactor are already open."""

    store: WorkerStore
    compactor: Compactor
