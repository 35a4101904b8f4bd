"""``Publisher`` (``core.ports.publisher``) over the app's Faust topics.

``publish`` returns once the broker has acknowledged the record (acks=all);
the client's exceptions leave as the port's errors (``streams.kafka.errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.ports.publisher import Headers, RecordPosition
from streams.kafka.errors import mapped


class FaustPublisher:
    """Records by topic role (``streams.topics``) to the app's ``faust.TopicT``."""

    def __init__(self, topics: Mapping[str, Any]) -> None:
        self._topics = topics

    async def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
    ) -> RecordPosition | None:
        try:
            target = self._topics[topic]
        except KeyError:
            raise KeyError(f"no topic with role {topic!r}") from None
        # force=True: send now rather than at the end of the current event's
        # processing, so the ack below is for this record.
        pending = await mapped(
            target.send(
                key=key, value=value, headers=list(headers) if headers else None, force=True
            )
        )
        metadata = await mapped(pending)
        return RecordPosition(metadata.partition, metadata.offset)
