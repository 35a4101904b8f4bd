"""``compactor erase``: ask the workers to erase a conversation, and optionally wait.

The request is an ``EraseRequest`` on the erase-requests topic (the only topic
whose records erase; only operators may write it, docs/security.md), naming
the conversation by its tenant and id, keyed by the id, so the worker that
owns the conversation's partition (the accounting component, the table's
only writer) applies it: every row in
PostgreSQL, an erase mark that keeps the conversation erased, an audit entry,
the table entry (a tombstone in the changelog), a tombstone on the
clip-archive topic, then an ``EraseCompleted`` on the erase-completions topic.

The request carries the messages topic's end offsets, read just before it is
sent: every message already on the topic stays erased, whenever it is read.
``--wait`` reads the erase-completions topic (from its end, taken before the
request is sent, so the answer cannot be missed) until the completion with
the request's id arrives.
"""

from __future__ import annotations

import asyncio
import getpass
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from streams.events import MAX_ID_LENGTH, EraseCompleted, EraseRequest
from streams.kafka.producers import producer_config

# The exit status of `compactor erase --wait` when no completion came in time.
EXIT_TIMEOUT = 3


class EraseError(Exception):
    """The erase request could not be sent."""


class EraseTimeout(Exception):
    """The request was sent, but no completion arrived within the timeout."""


def default_requester() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def erase_request(
    conversation_id: str,
    *,
    tenant_id: str | None = None,
    reason: str,
    requester: str | None = None,
    end_offsets: Mapping[int, int] | None = None,
    now: datetime | None = None,
    request_id: str | None = None,
) -> EraseRequest:
    if not 1 <= len(conversation_id) <= MAX_ID_LENGTH:
        raise EraseError(f"a conversation id has 1 to {MAX_ID_LENGTH} characters")
    if not reason.strip():
        raise EraseError("--reason must say why (it is audited; never put message content in it)")
    try:
        return EraseRequest(
            request_id=request_id or str(uuid.uuid4()),
            conversation_id=conversation_id,
            tenant_id=tenant_id,
            requester=requester or default_requester(),
            reason=reason.strip(),
            requested_at=now or datetime.now(UTC),
            messages_end_offsets=dict(end_offsets or {}),
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EraseError(f"invalid erase request: {where}: {first['msg']}") from None


async def _assigned(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    await consumer._client.force_metadata_update()
    partitions = consumer.partitions_for_topic(topic) or set()
    if not partitions:
        raise EraseError(f"topic {topic} does not exist (run `compactor topics`)")
    return [TopicPartition(topic, p) for p in sorted(partitions)]


async def send_erase(
    conversation_id: str,
    *,
    tenant_id: str | None = None,
    bootstrap: str,
    topic: str,
    messages_topic: str,
    completions_topic: str,
    reason: str,
    requester: str | None = None,
    wait: bool = False,
    wait_seconds: float = 60.0,
    client_kwargs: Mapping[str, Any] | None = None,
) -> tuple[EraseRequest, EraseCompleted | None]:
    """Publish the request (acked by the broker); with ``wait``, return its completion
    too, or raise ``EraseTimeout`` after ``timeout`` seconds."""
    kwargs = dict(client_kwargs or {})
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, **producer_config(kwargs, client_id="compactor-erase")
    )
    consumer = AIOKafkaConsumer(  # no group: it reads the completions, commits nothing
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        client_id="compactor-erase", **kwargs,
    )  # fmt: skip
    try:
        await consumer.start()
        ends = await _messages_ends(consumer, messages_topic, completions_topic if wait else None)
        request = erase_request(
            conversation_id, tenant_id=tenant_id, reason=reason, requester=requester,
            end_offsets=ends,
        )  # fmt: skip
        await producer.start()
        await producer.send_and_wait(
            topic, request.model_dump_json().encode(), key=conversation_id.encode()
        )
        if not wait:
            return request, None
        return request, await _completion(consumer, request.request_id, wait_seconds)
    except KafkaError as error:
        raise EraseError(f"could not send the erase request to {topic}: {error}") from None
    finally:
        await producer.stop()
        await consumer.stop()


async def _messages_ends(
    consumer: AIOKafkaConsumer, messages_topic: str, completions_topic: str | None
) -> dict[int, int]:
    """The messages topic's end offsets (what the request keeps erased); with a
    completions topic, the consumer is placed at its end first, so the answer to a
    request sent after this cannot be missed."""
    messages = await _assigned(consumer, messages_topic)
    ends = await consumer.end_offsets(messages)
    completions = await _assigned(consumer, completions_topic) if completions_topic else []
    if completions:
        consumer.assign(completions)
        for tp, offset in (await consumer.end_offsets(completions)).items():
            consumer.seek(tp, offset)
    return {tp.partition: offset for tp, offset in ends.items()}


async def _completion(
    consumer: AIOKafkaConsumer, request_id: str, wait_seconds: float
) -> EraseCompleted:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while (remaining := deadline - loop.time()) > 0:
        batches = await consumer.getmany(timeout_ms=max(1, int(min(remaining, 1.0) * 1000)))
        for records in batches.values():
            for record in records:
                try:
                    completed = EraseCompleted.model_validate_json(record.value or b"")
                except ValidationError:
                    continue
                if completed.request_id == request_id:
                    return completed
    raise EraseTimeout(f"no erase completion for request {request_id} within {wait_seconds:g}s")
