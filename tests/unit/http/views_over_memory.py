"""The worker's components over an in-memory store, for the HTTP views' unit tests
(the security, token, probe and audit tests serve the real views over these)."""

from __future__ import annotations

from core.adapters.llm.extractive import ExtractiveProvider
from core.compaction.factory import create_compactor
from core.settings import Settings
from streams.bootstrap import build_components
from streams.worker.components import Components
from streams.worker.runtime import StaticRuntime
from tests.support.memory_store import InMemoryStore, RecordingPublisher


async def _no_ack(_: int) -> None:
    return None


def components_over(
    store: InMemoryStore, config: Settings, publisher: RecordingPublisher | None = None
) -> Components[int]:
    """``build_components`` with the extractive summariser and a recording publisher."""
    compactor = create_compactor(
        model=ExtractiveProvider(),
        memory_store=store,
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
