"""How the service puts a record on a topic, and the errors that can say no.

``publish`` returns once the broker has acknowledged the record, so a caller
that goes on to commit an offset or mark an outbox row published knows the
record is durable. Topics are named by role (the service's ``streams.topics``);
the Kafka adapter maps its client's exceptions to the errors below, so the
worker's retry policy never sees a driver type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

Headers = Sequence[tuple[str, bytes]]


class PublishError(Exception):
    """Base of every error a publisher raises on purpose."""


class PublisherUnavailable(PublishError):
    """The broker could not be reached or did not acknowledge in time; the record
    may or may not be there, and sending it again is safe (consumers de-duplicate)."""


class PublishRejected(PublishError):
    """The broker refuses this record for good (unknown topic, not authorised):
    sending the same record again gives the same answer."""


class RecordTooLarge(PublishRejected):
    """The record is larger than the broker or the producer accepts."""


@dataclass(frozen=True)
class RecordPosition:
    """Where the broker put an acknowledged record."""

    partition: int
    offset: int


class Publisher(Protocol):
    async def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
    ) -> RecordPosition | None:
        """``None`` when the publisher cannot tell where it went (in memory, the CLI)."""
        ...
