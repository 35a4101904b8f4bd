"""The one way components put a record on a topic.

``publish`` returns once the broker has acknowledged the record (acks=all),
so a caller that goes on to commit an offset or mark an outbox row published
knows the record is durable. Topics are named by role (``streams.topics``),
the same names outbox rows carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from streams.topics import TopicRole

Headers = Sequence[tuple[str, bytes]]


class Publisher(Protocol):
    async def publish(
        self,
        topic: TopicRole | str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
    ) -> None: ...


class FaustPublisher:
    """``Publisher`` over the app's Faust topics (``faust.TopicT`` by role)."""

    def __init__(self, topics: Mapping[str, Any]) -> None:
        self._topics = topics

    async def publish(
        self,
        topic: TopicRole | str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
    ) -> None:
        try:
            target = self._topics[topic]
        except KeyError:
            raise KeyError(f"no topic with role {topic!r}") from None
        # force=True: send now rather than at the end of the current event's
        # processing, so the ack below is for this record.
        pending = await target.send(
            key=key, value=value, headers=list(headers) if headers else None, force=True
        )
        await pending
