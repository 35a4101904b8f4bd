"""``POST /conversations/{id}/messages/{message_id}/pin`` and ``/unpin``: an
operator keeps a stored message verbatim through every compaction (or stops
keeping it) without re-sending it; ``compactor pin`` does the same from a shell.

Admin scope only and no body, like the redo routes (``streams.http.redo``). Unlike
them it is not a request on the control topic: the pin is one row written under
the conversation's lock (``Pins.set_pinned``), so any worker answers it and the
answer says it is stored. A compaction planned before the pin that would compress
the message is refused by the gate. Answered 404 when the conversation has no
such live message (compacted, erased, never stored).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import faust
from faust.web import Request, Response, View

from core.domain.tenancy import conversation_key
from core.ports.storage.compactions import Pins
from streams.events import MAX_ID_LENGTH
from streams.http.access import FORBIDDEN, Forbidden, bad_text, principal_of, requested_tenant
from streams.http.bodies import PinChanged
from streams.http.redo import StorePinnedBudget, register_redo
from streams.metrics import Metrics
from streams.worker.components import Components


class PinsRole(Protocol):
    @property
    def compactions(self) -> Pins: ...


AdminRuntime = PinsRole  # what the POST routes read at each call: the compactions role


def register_pins(app: faust.App, runtime: PinsRole, budget_tokens: int, metrics: Metrics) -> None:
    """The two POST routes (behind the guard: every POST needs the admin scope).
    ``runtime``'s role is looked up at each call, so a store not yet open answers
    503 like every view."""
    for action in ("pin", "unpin"):
        _register(app, runtime, action, budget_tokens, metrics)


def _register(
    app: faust.App,
    runtime: PinsRole,
    action: Literal["pin", "unpin"],
    budget_tokens: int,
    metrics: Metrics,
) -> None:
    @app.page(f"/conversations/{{conversation_id}}/messages/{{message_id}}/{action}")
    class PinView(View):
        async def post(self, request: Request, conversation_id: str, message_id: str) -> Response:
            for name, value in (("conversation_id", conversation_id), ("message_id", message_id)):
                problem = bad_text(name, value, MAX_ID_LENGTH)
                if problem is not None:
                    return self.json({"error": problem}, status=400)
            try:
                tenant = requested_tenant(request.query, principal_of(request))
            except Forbidden:
                return self.json(FORBIDDEN, status=403)
            except ValueError as error:
                return self.json({"error": str(error)}, status=400)
            key = conversation_key(tenant, conversation_id)
            pins = runtime.compactions
            if not await pins.set_pinned(key, message_id, action == "pin"):
                metrics.operator_requests.labels(action, "unknown_message").inc()
                return self.json(_no_such_message(key, message_id), status=404)
            metrics.operator_requests.labels(action, "applied").inc()
            changed = PinChanged(
                conversation_id=conversation_id,
                tenant_id=tenant,
                message_id=message_id,
                pinned=action == "pin",
                pinned_tokens=await pins.pinned_tokens(key),
                budget_tokens=budget_tokens,
            )
            return self.json(changed.model_dump(mode="json"))

    PinView.__name__ = f"{action.capitalize()}View"


def _no_such_message(key: str, message_id: str) -> dict[str, Any]:
    return {
        "error": f"conversation {key} has no live message {message_id!r} "
        "(compacted, erased, or never stored)"
    }


def register_admin_posts(
    app: faust.App, components: Components[Any], runtime: AdminRuntime, budget_tokens: int
) -> None:
    """Every POST route, all admin-only: recompact and restore (requests on the
    control topic, ``streams.http.redo``) and pin and unpin (stored here)."""
    register_redo(app, components, StorePinnedBudget(runtime, budget_tokens))
    register_pins(app, runtime, budget_tokens, components.metrics)
