"""``compactor erase``: ask the workers to erase a conversation.

The request is an ``EraseRequest`` on the control topic, keyed by the
conversation id, so the worker that owns the conversation's table entry (the
accounting component, its only writer) applies it: every row in PostgreSQL,
the table entry (a tombstone in the changelog), and a tombstone on the
clip-archive topic. See docs/security.md for what erase cannot reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from streams.events import MAX_ID_LENGTH, EraseRequest


class EraseError(Exception):
    """The erase request could not be sent."""


def erase_request(conversation_id: str, now: datetime | None = None) -> EraseRequest:
    if not 1 <= len(conversation_id) <= MAX_ID_LENGTH:
        raise EraseError(f"a conversation id has 1 to {MAX_ID_LENGTH} characters")
    return EraseRequest(conversation_id=conversation_id, requested_at=now or datetime.now(UTC))


async def send_erase(
    conversation_id: str,
    *,
    bootstrap: str,
    topic: str,
    client_kwargs: Mapping[str, Any] | None = None,
) -> EraseRequest:
    """Publish the request and wait for the broker's acknowledgement."""
    request = erase_request(conversation_id)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        client_id="compactor-erase",
        **dict(client_kwargs or {}),
    )
    try:
        await producer.start()
        await producer.send_and_wait(
            topic, request.model_dump_json().encode(), key=conversation_id.encode()
        )
    except KafkaError as error:
        raise EraseError(f"could not publish the erase request to {topic}: {error}") from None
    finally:
        await producer.stop()
    return request
