"""``POST /conversations/{id}/recompact`` and ``/restore``: the admin's redo and undo.

Why POST, in an API that was GET-only: these ask for a change (a compaction),
and a GET that changes something is cached, prefetched and retried by
clients and proxies as if it did not. They stay as narrow as the reads:

* **admin scope only** (``guard.required_scope``: every POST needs it), so a
  tenant-bound token, which never has it, cannot ask;
* **no body**: the guard still refuses every request body (413) before
  authentication; the parameters are the path and the query (``tenant_id``,
  ``request_id``, ``batch_id``), checked like the reads' (400 otherwise);
* **answered 202 once the request is on the control topic** (the broker
  acked it), with its ``request_id``: the worker that owns the conversation
  does it, and the clip-archive event that results carries the request id.
  The same ``request_id`` again is the same compaction (idempotent); without
  one a new id is made, so a client that retries should send its own.

Any worker can take the request: it is published keyed by the conversation
id, so it reaches the owner without forwarding. Kept apart from
``streams.http.views`` (the reads) on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import faust
from faust.web import Request, Response, View
from pydantic import ValidationError

from core.ports.storage.compactions import Pins
from streams.events import MAX_ID_LENGTH
from streams.http.access import (
    FORBIDDEN,
    Forbidden,
    bad_text,
    principal_of,
    requested_tenant,
)
from streams.http.bodies import RedoAccepted
from streams.worker.components import Components
from streams.worker.requests import operator_request


class PinnedBudget(Protocol):
    """What a recompact checks first: the pinned tokens against the budget."""

    @property
    def budget_tokens(self) -> int: ...

    async def pinned_tokens(self, conversation_id: str) -> int: ...


class _PinsRole(Protocol):
    @property
    def compactions(self) -> Pins: ...


@dataclass(frozen=True)
class StorePinnedBudget:
    """``PinnedBudget`` from the worker's runtime (its role looked up at each call,
    so a runtime not yet open answers ``StoreUnavailable`` like every view)."""

    runtime: _PinsRole
    budget_tokens: int

    async def pinned_tokens(self, conversation_id: str) -> int:
        return await self.runtime.compactions.pinned_tokens(conversation_id)


def register_redo(
    app: faust.App, components: Components[Any], pinned: PinnedBudget | None = None
) -> None:
    """The two POST routes (registered by ``streams.app.register``, behind the guard).
    ``pinned``: a recompact of a conversation whose pinned messages alone exceed
    the budget is answered 409 (no recompact can fit it), not sent."""
    for action in ("recompact", "restore"):
        _register(app, components, action, pinned if action == "recompact" else None)


def _register(
    app: faust.App,
    components: Components[Any],
    action: Literal["recompact", "restore"],
    pinned: PinnedBudget | None,
) -> None:
    @app.page(f"/conversations/{{conversation_id}}/{action}")
    class Redo(View):
        async def post(self, request: Request, conversation_id: str) -> Response:
            principal = principal_of(request)
            query = request.query
            for name, value in (
                ("conversation_id", conversation_id),
                *((key, query[key]) for key in ("request_id", "batch_id") if key in query),
            ):
                problem = bad_text(name, value, MAX_ID_LENGTH)
                if problem is not None:
                    return self.json({"error": problem}, status=400)
            try:
                tenant = requested_tenant(query, principal)
                event = operator_request(
                    action,
                    conversation_id,
                    tenant_id=tenant,
                    requester=f"http:{principal.token_id}",
                    request_id=query.get("request_id") or None,
                    batch_id=query.get("batch_id") or None,
                )
            except Forbidden:
                return self.json(FORBIDDEN, status=403)
            except (ValueError, ValidationError) as error:
                return self.json({"error": _first_error(error)}, status=400)
            if pinned is not None and (over := await _pinned_over(pinned, event)) is not None:
                return self.json({"error": over}, status=409)
            await components.requests.send(event)
            components.metrics.operator_requests.labels(action, "requested").inc()
            accepted = RedoAccepted(
                action=action,
                request_id=event.request_id,
                conversation_id=event.conversation_id,
                tenant_id=event.tenant_id,
            )
            return self.json(accepted.model_dump(mode="json"), status=202)

    Redo.__name__ = f"{action.capitalize()}View"


async def _pinned_over(pinned: PinnedBudget, event: Any) -> str | None:
    """Why no recompact can fit the conversation (its pinned messages alone exceed
    the budget), or None."""
    tokens = await pinned.pinned_tokens(event.conversation_key)
    if tokens <= pinned.budget_tokens:
        return None
    return (
        f"the conversation's pinned messages alone ({tokens} tokens) exceed the "
        f"budget ({pinned.budget_tokens}): unpin some first (compactor unpin)"
    )


def _first_error(error: ValueError | ValidationError) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}"
    return str(error)
