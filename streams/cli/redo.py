"""``compactor recompact`` and ``compactor restore``: ask the owning worker, optionally wait.

The request (``RecompactRequest`` / ``RestoreRequest``) goes on the control
topic keyed by the conversation id, so the accounting agent of the worker
that owns the conversation turns it into its next command (one command at a
time per conversation). ``--wait`` reads the clip-archive and control topics
from their ends (taken before the request is sent, so the answer cannot be
missed) until the clip-archive event carrying the request id arrives, or the
request's ``noop`` completion (nothing to do: no live batch, no raw turns).
``--request-id`` makes a retry the same request (the same compaction).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from core.domain.tally import request_compaction_id
from streams.events import (
    ClipArchiveEvent,
    CompactionCompleted,
    RecompactRequest,
    RestoreRequest,
)
from streams.kafka.producers import producer_config
from streams.worker.requests import operator_request

# The exit status of `--wait` when no answer came in time.
EXIT_TIMEOUT = 3
# After the request's completion, how long --wait still looks for its clip-archive
# (the two are sent together; a repeated request's replay sends the completion only).
SETTLE_SECONDS = 3.0


class RequestError(Exception):
    """The request could not be made or sent."""


class RequestTimeout(Exception):
    """The request was sent, but no answer arrived within the timeout."""


@dataclass(frozen=True)
class Answer:
    """What came back: the clip-archive event of the compaction, or a noop."""

    event: ClipArchiveEvent | None
    noop: bool = False
    # Applied before (a repeated request): its completion came again, its
    # clip-archive event was published the first time.
    applied_before: str | None = None


def build_request(
    action: Literal["recompact", "restore"],
    conversation_id: str,
    *,
    tenant_id: str | None,
    requester: str,
    request_id: str | None,
    batch_id: str | None,
) -> RecompactRequest | RestoreRequest:
    try:
        return operator_request(
            action,
            conversation_id,
            tenant_id=tenant_id,
            requester=requester,
            request_id=request_id,
            batch_id=batch_id,
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RequestError(f"invalid {action} request: {where}: {first['msg']}") from None
    except ValueError as error:
        raise RequestError(str(error)) from None


async def send_request(
    request: RecompactRequest | RestoreRequest,
    *,
    bootstrap: str,
    control_topic: str,
    clip_archives_topic: str,
    wait: bool = False,
    wait_seconds: float = 120.0,
    client_kwargs: Mapping[str, Any] | None = None,
) -> Answer | None:
    """Publish the request (acked by the broker); with ``wait``, its answer, or
    ``RequestTimeout`` after ``wait_seconds``."""
    kwargs = dict(client_kwargs or {})
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, **producer_config(kwargs, client_id="compactor-redo")
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        client_id="compactor-redo", **kwargs,
    )  # fmt: skip
    try:
        if wait:
            await consumer.start()
            await _from_the_end(consumer, [clip_archives_topic, control_topic])
        await producer.start()
        await producer.send_and_wait(
            control_topic,
            request.model_dump_json().encode(),
            key=request.conversation_id.encode(),
        )
        if not wait:
            return None
        return await _answer(consumer, request, clip_archives_topic, wait_seconds)
    except KafkaError as error:
        raise RequestError(f"could not send the request to {control_topic}: {error}") from None
    finally:
        await producer.stop()
        await consumer.stop()


async def _from_the_end(consumer: AIOKafkaConsumer, topics: list[str]) -> None:
    await consumer._client.force_metadata_update()
    partitions = []
    for topic in topics:
        found = consumer.partitions_for_topic(topic) or set()
        if not found:
            raise RequestError(f"topic {topic} does not exist (run `compactor topics`)")
        partitions += [TopicPartition(topic, p) for p in sorted(found)]
    consumer.assign(partitions)
    for tp, offset in (await consumer.end_offsets(partitions)).items():
        consumer.seek(tp, offset)


async def _answer(
    consumer: AIOKafkaConsumer,
    request: RecompactRequest | RestoreRequest,
    clip_archives_topic: str,
    wait_seconds: float,
) -> Answer:
    # The compaction id of an erased-and-restarted conversation differs (its epoch):
    # then only the clip-archive event (by request id) answers.
    compaction_id = request_compaction_id(request.conversation_key, request.request_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    completed = False
    while (remaining := deadline - loop.time()) > 0:
        batches = await consumer.getmany(timeout_ms=max(1, int(min(remaining, 1.0) * 1000)))
        for tp, records in batches.items():
            for record in records:
                answer = _read(record.value or b"", tp.topic == clip_archives_topic)
                if isinstance(answer, ClipArchiveEvent):
                    if answer.request_id == request.request_id:
                        return Answer(answer)
                elif answer is not None and answer.compaction_id == compaction_id:
                    if answer.status == "noop":
                        return Answer(None, noop=True)
                    completed = True  # its clip-archive may follow; a replay sends none
                    deadline = min(deadline, loop.time() + SETTLE_SECONDS)
    if completed:
        return Answer(None, applied_before=compaction_id)
    raise RequestTimeout(
        f"no answer to {request.type} request {request.request_id} within {wait_seconds:g}s"
    )


def _read(value: bytes, clip: bool) -> ClipArchiveEvent | CompactionCompleted | None:
    try:
        if clip:
            return ClipArchiveEvent.model_validate_json(value)
        return CompactionCompleted.model_validate_json(value)
    except ValidationError:
        return None


def describe(answer: Answer) -> str:
    """One line per outcome, for the operator."""
    event = answer.event
    if answer.applied_before is not None:
        return f"applied as compaction {answer.applied_before} before (the same request id)"
    if event is None:
        return "nothing to do (no live batch, or no raw turns archived for it); history unchanged"
    line = (
        f"applied as compaction {event.compaction_id}: {len(event.batches)} new batches, "
        f"tokens {event.tokens_before} → {event.tokens_after}"
    )
    if event.action == "restore":
        line += f"; {len(event.restored_message_ids)} turns restored"
        left = event.not_restored_message_ids
        if left:
            line += (
                f"; {len(left)} did not fit the budget and stay summarised: "
                + ", ".join(left[:10])
                + (" …" if len(left) > 10 else "")
            )
    return line
