"""The worker's components wired against in-memory ports: no Kafka, no PostgreSQL.

``harness()`` builds them the way ``streams.bootstrap`` does and drives each one
the way its Faust agent does (one ``Record`` at a time); the tests in this
folder check what it stored, what the table holds and what it sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from core.adapters.llm.extractive import ExtractiveProvider
from core.compaction.calibration import Calibration
from core.compaction.factory import create_compactor
from core.domain.tally import ConversationTally
from core.domain.tokens import DEFAULT_COUNTER
from core.ports.model import ModelAuthError, ModelRequest, ModelResponse
from core.settings import Settings, parse_settings
from streams.events import (
    CompactionCommand,
    CompactionCompleted,
    EraseCompleted,
    EraseRequest,
    MessageEvent,
    ReconcileRequest,
)
from streams.topics import TopicNames
from streams.worker.assembly import build_components
from streams.worker.components import Components
from streams.worker.records import Record
from streams.worker.runtime import StaticRuntime
from tests.support.builders import T0
from tests.support.memory_store import InMemoryStore, RecordingPublisher

BUDGET_TOKENS = 200  # 0.5 x 400
NAMES = TopicNames.with_prefix("t.")


def settings(
    tenancy: dict[str, Any] | None = None,
    tenants: list[dict[str, Any]] | None = None,
    **service: Any,
) -> Settings:
    return parse_settings(
        {
            "budget": {"context_budget": 0.5, "model_max_tokens": 400},
            # The dead letters' bytes are what these tests look at (the default,
            # "redacted", has none: test_erase_holds.py).
            "kafka": {"topic_prefix": "t.", "dead_letter_content": "full"},
            # min_chunk_tokens 0: chunks of chunk_size turns, however short.
            "summarization": {
                "keep_recent": 2,
                "chunk_size": 4,
                "min_chunk_tokens": 0,
                "retry_backoff_seconds": 0,
            },
            "service": {"command_timeout_seconds": 60, "reconcile_interval_seconds": 10, **service},
            "tenancy": tenancy or {},
            "tenants": tenants or [],
        }
    )


class FailingModel:
    name = "failing"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelAuthError("bad key", provider=self.name)


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    store: InMemoryStore
    publisher: RecordingPublisher
    table: dict[str, Any]
    clock: Clock
    components: Components[int]
    acked: list[int] = field(default_factory=list)
    slept: list[float] = field(default_factory=list)
    assigned: bool = True
    offsets: Iterator[int] = field(default_factory=lambda: iter(range(10**9)))
    # Called at each of accounting's waits, before the clock moves on.
    while_sleeping: Callable[[], None] = lambda: None
    # The model's measured tokens per character ([budget].token_estimate), if any.
    calibration: Calibration | None = None

    def record(self, topic: str, key: str | bytes | None, value: bytes | str) -> Record:
        raw_key = key.encode() if isinstance(key, str) else key
        raw_value = value.encode() if isinstance(value, str) else value
        return Record(topic, 0, next(self.offsets), raw_key, raw_value)

    async def message(
        self, index: int, content: str, conversation: str = "c1", tenant: str | None = None
    ) -> None:
        event = MessageEvent(
            message_id=f"{conversation}-m{index:04d}",
            conversation_id=conversation,
            tenant_id=tenant,
            role="user" if index % 2 == 0 else "assistant",
            content=content,
            created_at=T0 + timedelta(seconds=index),
        )
        await self.components.accounting.handle(
            self.record(NAMES.messages, conversation, event.model_dump_json())
        )

    async def control(self, event: CompactionCompleted | ReconcileRequest) -> None:
        await self.components.accounting.handle(
            self.record(NAMES.control, event.conversation_id, event.model_dump_json())
        )

    async def erase(
        self,
        conversation: str = "c1",
        *,
        request_id: str = "req-1",
        end_offsets: dict[int, int] | None = None,
        topic: str = NAMES.erasures,
        tenant: str | None = None,
    ) -> None:
        """An erase request as ``compactor erase`` sends it, on the erase topic."""
        request = EraseRequest(
            request_id=request_id,
            conversation_id=conversation,
            tenant_id=tenant,
            requester="ops",
            reason="user asked",
            requested_at=datetime.fromtimestamp(self.clock.now, UTC),
            messages_end_offsets=end_offsets or {},
        )
        await self.components.accounting.handle(
            self.record(topic, conversation, request.model_dump_json())
        )

    def erase_completions(self) -> list[EraseCompleted]:
        return [
            EraseCompleted.model_validate_json(p.value or b"")
            for p in self.publisher.on("erase_completions")
        ]

    def tally(self, conversation: str = "c1") -> ConversationTally:
        tally = self.components.table.get(conversation)
        assert tally is not None
        return tally

    def commands(self) -> list[CompactionCommand]:
        return [
            CompactionCommand.model_validate_json(p.value or b"")
            for p in self.publisher.on("commands")
        ]

    def completions(self) -> list[CompactionCompleted]:
        return [
            CompactionCompleted.model_validate_json(p.value or b"")
            for p in self.publisher.on("control")
            if b'"completed"' in (p.value or b"")
        ]


def harness(
    model: Any = None,
    tenancy: dict[str, Any] | None = None,
    tenants: list[dict[str, Any]] | None = None,
    calibrated: bool = False,
    **service: Any,
) -> Harness:
    """``calibrated``: the model's calls measured into a ``Calibration`` whose
    counter ingest counts with, as ``streams.bootstrap.open_all`` wires it."""
    config = settings(tenancy, tenants=tenants, **service)
    store = InMemoryStore()
    clock = Clock()
    store.now = lambda: datetime.fromtimestamp(clock.now, UTC)
    calibration = Calibration("anthropic", "test", store.calibration) if calibrated else None
    compactor = create_compactor(
        model=model or ExtractiveProvider(),
        memory=store.archive,
        config=config.summarization.compaction(),
        model_name="test",
        fallback=ExtractiveProvider() if model is not None else None,
        prices=config.usage.prices,
        calibration=calibration,
    )
    publisher = RecordingPublisher()
    table: dict[str, Any] = {}
    acked: list[int] = []

    async def ack(token: int) -> None:
        acked.append(token)

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        harness.while_sleeping()
        slept.append(seconds)
        clock.now += seconds

    harness: Harness

    components: Components[int] = build_components(
        config,
        table=table,
        publisher=publisher,
        runtime=StaticRuntime(
            store, compactor, DEFAULT_COUNTER if calibration is None else calibration.counter
        ),
        ack=ack,
        clock=clock,
        sleep=sleep,
        still_assigned=lambda _: harness.assigned,
    )
    harness = Harness(store, publisher, table, clock, components, acked, slept)
    harness.calibration = calibration
    return harness


def backed_off(slept: Sequence[float]) -> bool:
    """Each wait within its full-jitter bound: the n-th (from 0) between 0 and
    0.2 × 2^n seconds, at most 10 (``streams.worker.retry``)."""
    return all(0.0 <= s <= min(10.0, 0.2 * 2**n) for n, s in enumerate(slept))


def compacted(compaction_id: str, generation: int) -> CompactionCompleted:
    """Two messages of 100 tokens replaced by a 20-token clip-archive."""
    return CompactionCompleted(
        compaction_id=compaction_id,
        conversation_id="c1",
        generation=generation,
        status="compacted",
        messages_compressed=2,
        rows_removed=2,
        rows_added=1,
        tokens_removed=200,
        tokens_added=20,
        completed_at=T0,
    )


def words(n: int, seed: str = "word") -> str:
    return " ".join(f"{seed}{i}." for i in range(n))


async def over_budget(h: Harness, n: int = 8) -> CompactionCommand:
    for i in range(n):
        await h.message(i, words(20, f"topic{i}-"))
    (command,) = h.commands()
    return command
