"""The worker's components over an in-memory store, for the HTTP views' unit tests
(the security, token, probe and audit tests serve the real views over these)."""

from __future__ import annotations

from core.adapters.llm.extractive import ExtractiveProvider
from core.compaction.factory import create_compactor
from core.ports.storage import StoreUnavailable
from core.settings import ResolvedModel, Settings
from streams.worker.assembly import build_components
from streams.worker.components import Components
from streams.worker.runtime import StaticRuntime, StorePorts
from tests.support.memory_store import InMemoryStore, RecordingPublisher


async def _no_ack(_: int) -> None:
    return None


def components_over(
    store: InMemoryStore, config: Settings, publisher: RecordingPublisher | None = None
) -> Components[int]:
    """``build_components`` with the extractive summariser and a recording publisher."""
    compactor = create_compactor(
        model=ExtractiveProvider(),
        memory=store.archive,
        config=config.summarization.compaction(),
        model_name="test",
    )
    return build_components(
        config,
        table={},
        publisher=RecordingPublisher() if publisher is None else publisher,
        runtime=StaticRuntime(store, compactor),
        ack=_no_ack,
    )


class ViewRuntime(StorePorts):
    """The part of ``WorkerRuntime`` the views and probes read, over an in-memory
    store; ``is_open`` settable (until it is, every role raises ``StoreUnavailable``)."""

    def __init__(self, store: InMemoryStore, *, is_open: bool = True) -> None:
        self.store = store
        self.is_open = is_open
        self.resolved_model = ResolvedModel(kind="extractive", model="x", reason="test")

    def opened_store(self) -> InMemoryStore:
        if not self.is_open:
            raise StoreUnavailable("the worker has not opened PostgreSQL yet")
        return self.store
