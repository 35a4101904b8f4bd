"""Operators' recompact and restore requests, sent to the control topic.

Sent keyed by the producer's conversation id, like everything on the control
topic, so the accounting agent of the worker that owns the conversation gets
it, whichever worker (or CLI) sent it. Idempotent by ``request_id``: the
compaction a request becomes derives from it (``request_compaction_id``), so
sending it again, or a redelivery, is the same compaction.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Literal

from core.ports.publisher import Publisher
from streams.events import RecompactRequest, RestoreRequest

RequestAction = Literal["recompact", "restore"]


def operator_request(
    action: RequestAction,
    conversation_id: str,
    *,
    tenant_id: str | None,
    requester: str,
    request_id: str | None = None,
    batch_id: str | None = None,
    now: datetime | None = None,
) -> RecompactRequest | RestoreRequest:
    """The request event (pydantic validates the ids: ValidationError names them)."""
    fields = {
        "request_id": request_id or str(uuid.uuid4()),
        "conversation_id": conversation_id,
        "tenant_id": tenant_id,
        "requester": requester,
        "requested_at": now or datetime.now(UTC),
    }
    if action == "recompact":
        if batch_id is not None:
            raise ValueError("a recompact rebuilds every live batch: it takes no batch id")
        return RecompactRequest.model_validate(fields)
    return RestoreRequest.model_validate({**fields, "batch_id": batch_id})


class OperatorRequests:
    """What the HTTP routes send requests with (the worker's own producer)."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher

    async def send(self, request: RecompactRequest | RestoreRequest) -> None:
        """Returns once the broker has the request (at least once)."""
        await self._publisher.publish(
            "control", request.conversation_id.encode(), request.model_dump_json().encode()
        )
