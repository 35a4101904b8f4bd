"""``GET /conversations/{id}/context``: the context a platform sends its model, in one
call, within the window, never waiting for a compaction (``streams.worker.turn_context``).

Answers: 200 with the context (``bodies.ContextBody``; ``ETag``, and 304 to an
``If-None-Match`` that still holds); 409 with ``Retry-After`` when the message
named by ``through`` / ``after`` is not stored within ``wait_ms`` (never an older
context in its place); 404 for a conversation the caller's scope does not see.
Any worker answers (the store is shared); the one that ingests the conversation
answers a waiting read the moment the message is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast, get_args

import faust
from faust.web import Request, Response, View

from core.ports.storage import ContextReader
from core.settings import Settings
from streams.events import MAX_ID_LENGTH
from streams.http import bodies
from streams.http.access import addressed, bad_text, principal_of, problem_response, read_scope
from streams.worker.components import Components
from streams.worker.turn_context import (
    ContextAnswer,
    ContextRequest,
    Fit,
    NotYet,
    Served,
    Shape,
    TurnContexts,
    Unknown,
)


class ContextViewPorts(Protocol):
    @property
    def context(self) -> ContextReader: ...


def context_options(
    query: Mapping[str, str], max_wait_ms: int
) -> tuple[Shape, Fit, str | None, tuple[int, int] | None, float]:
    """(format, fit, through, after, wait in seconds); ValueError names a bad one."""
    shape, fit = query.get("format", "messages"), query.get("fit", "budget")
    for name, value, allowed in (
        ("format", shape, get_args(Shape)),
        ("fit", fit, get_args(Fit)),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    through = query.get("through")
    if through is not None and (problem := bad_text("through", through, MAX_ID_LENGTH)):
        raise ValueError(problem)
    after = _position(query.get("after"))
    raw_wait = query.get("wait_ms", "0")
    if len(raw_wait) > 6 or not raw_wait.isdigit() or int(raw_wait) > max_wait_ms:
        raise ValueError(f"wait_ms must be a whole number from 0 to {max_wait_ms}")
    return cast(Shape, shape), cast(Fit, fit), through, after, int(raw_wait) / 1000


def _position(raw: str | None) -> tuple[int, int] | None:
    if raw is None:
        return None
    partition, _, offset = raw.partition(":")
    if not (partition.isdigit() and offset.isdigit() and len(partition) < 10 and len(offset) < 20):
        raise ValueError("after must be partition:offset, e.g. 3:18211")
    return int(partition), int(offset)


def register_context(
    app: faust.App, settings: Settings, components: Components[Any], runtime: ContextViewPorts
) -> None:
    service = settings.service
    table = components.table
    contexts = TurnContexts(
        runtime,
        settings.budget,
        components.notices,
        components.metrics,
        pending=lambda key: None if (tally := table.get(key)) is None else tally.outstanding,
        cache_bytes=service.context_cache_bytes,
    )

    @app.page("/conversations/{conversation_id}/context")
    class Context(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            if not isinstance(key := addressed(self, request, conversation_id), str):
                return key
            try:
                shape, fit, through, after, wait = context_options(
                    request.query, service.context_max_wait_ms
                )
            except ValueError as error:
                return problem_response(self, str(error), 400)
            scope = read_scope(principal_of(request))
            asked = ContextRequest(key, scope, shape, fit, through, after, wait)
            return context_response(self, request, await contexts.answer(asked), key)


def context_response(view: View, request: Request, answer: ContextAnswer, key: str) -> Response:
    """The HTTP answer: 200 (or 304), 409 with Retry-After, 404."""
    match answer:
        case Served(body=body, etag=etag, provisional=provisional):
            headers = {"ETag": etag, "X-Compactor-Provisional": str(provisional).lower()}
            if request.headers.get("If-None-Match") == etag:
                return view.bytes(b"", status=304, headers=headers)
            return view.bytes(body, content_type="application/json", headers=headers)
        case NotYet(version=version):
            mark = version.watermark
            problem = bodies.Problem(
                error="the message asked for is not stored yet (through/after); "
                f"the context holds up to {mark.message_id or 'nothing'} "
                f"(partition {mark.partition}, offset {mark.offset})"
            )
            response = problem_response(view, problem, 409)
            response.headers["Retry-After"] = "1"
            return response
        case Unknown():
            return problem_response(view, bodies.unknown_conversation(key), 404)
    raise AssertionError(answer)  # pragma: no cover
