"""The worker's own components, run in one process without Kafka.

``compactor compact`` replays a transcript through the same accounting and
processor the streaming worker runs, so an offline run triggers compactions
at the same point, with the same token counts, and writes the same rows. The
topics are replaced by a queue that is drained after every message: each
command runs to completion before the next message is accounted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from core.domain.compaction import Failed
from core.ports.compactor import Compactor
from core.ports.publisher import Headers
from core.ports.storage import Storage
from core.settings import Settings
from streams.events import MessageEvent
from streams.worker.assembly import build_components
from streams.worker.components import Components
from streams.worker.processor import Compacted
from streams.worker.records import Record, decode_command
from streams.worker.runtime import StaticRuntime


class OfflineCompactionError(RuntimeError):
    """A compaction failed or a record was dead-lettered; history is left as it was."""


@dataclass
class LoopbackPublisher:
    """A ``Publisher`` whose topics are one in-process queue (clip-archives are
    dropped by the driver: offline, the history in PostgreSQL is the output)."""

    queue: deque[tuple[str, bytes | None, bytes | None]] = field(default_factory=deque)

    async def publish(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> None:
        self.queue.append((topic, key, value))


async def _no_ack(_: object) -> None:
    return None


@dataclass
class OfflineRun:
    """One transcript replay; ``on_compaction`` hears of each compaction as it commits."""

    settings: Settings
    store: Storage
    compactor: Compactor
    on_compaction: Callable[[str, Compacted], None] = lambda *_: None
    publisher: LoopbackPublisher = field(default_factory=LoopbackPublisher)
    _offset: int = 0

    def __post_init__(self) -> None:
        self.components: Components[object] = build_components(
            self.settings,
            table={},
            publisher=self.publisher,
            runtime=StaticRuntime(self.store, self.compactor),
            ack=_no_ack,
        )

    async def replay(self, events: Iterable[MessageEvent]) -> None:
        names = self.components.names
        for event in events:
            await self._deliver(names.messages, event.conversation_id, event.model_dump_json())
            await self._drain()

    async def _deliver(self, topic: str, key: str | bytes | None, value: str | bytes) -> None:
        raw_key = key.encode() if isinstance(key, str) else key
        raw_value = value.encode() if isinstance(value, str) else value
        self._offset += 1
        await self.components.accounting.handle(Record(topic, 0, self._offset, raw_key, raw_value))

    async def _drain(self) -> None:
        names = self.components.names
        while self.publisher.queue:
            role, key, value = self.publisher.queue.popleft()
            if role == "commands":
                command = decode_command(Record(names.commands, 0, 0, key, value))
                match await self.components.processor.compact(command):
                    case Failed(detail=detail):
                        raise OfflineCompactionError(
                            f"compaction of {command.conversation_key} failed: {detail}"
                        )
                    case Compacted() as compacted:
                        self.on_compaction(command.conversation_key, compacted)
            elif role == "control":
                await self._deliver(names.control, key, value or b"")
            elif role == "dead_letters":
                raise OfflineCompactionError(f"a record was dead-lettered (key {key!r})")


def conversations_in(events: Sequence[MessageEvent]) -> dict[str, list[MessageEvent]]:
    """Events by conversation key ((tenant, id)), each in its original order."""
    grouped: dict[str, list[MessageEvent]] = {}
    for event in events:
        grouped.setdefault(event.conversation_key, []).append(event)
    return grouped
