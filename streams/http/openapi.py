"""The worker's OpenAPI 3.1 document, generated from ``streams.http.bodies``.

``ROUTES`` lists every route the worker serves besides Faust's own and the
inspector's static files, with its parameters and answers; ``document`` turns
it into OpenAPI 3.1 (pydantic's JSON Schema is 2020-12, which 3.1 uses as is).
``compactor openapi`` prints it, the worker serves it at ``/openapi.json``
(with the bounds of its own ``[service]``), ``docs/openapi.json`` is the
committed copy at the defaults, and ``tests/unit/http/test_openapi.py`` fails
when a route or a field is added to the views without the document or the other
way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from core.domain.tenancy import TENANT_ID_PATTERN
from core.settings import ServiceSettings
from streams.events import MAX_ID_LENGTH
from streams.http import bodies, params, probe_bodies
from streams.http.params import Params

API_TITLE = "context-compactor worker"
OPENAPI_PATH = "/openapi.json"  # where the worker serves the document
REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Route:
    path: str
    operation_id: str
    summary: str
    ok: type[BaseModel] | None  # None: not JSON (``media`` says what)
    params: type[Params] | None = None
    path_params: tuple[str, ...] = ()
    refusals: tuple[int, ...] = (400, 401, 403, 404, 429, 503)
    scope: str = "read"
    media: str = "application/json"
    secured: bool = True
    notes: str = ""
    extra_ok: dict[int, str] = field(default_factory=dict)  # another success: its meaning
    method: str = "get"
    ok_status: int = 200


CONVERSATION_READS = (400, 401, 403, 404, 413, 429, 503)

ROUTES: tuple[Route, ...] = (
    Route(
        "/conversations/{conversation_id}",
        "getConversation",
        "The conversation's token tally, budget and compactions so far",
        bodies.ConversationStatus,
        params.TenantParams,
        ("conversation_id",),
        CONVERSATION_READS,
        notes="Read from the worker that owns the conversation (forwarded when needed).",
    ),
    Route(
        "/conversations/{conversation_id}/history",
        "getHistory",
        "What the model should see now: the clip-archive, then the kept messages, a page at a time",
        bodies.HistoryPage,
        params.PageParams,
        ("conversation_id",),
        CONVERSATION_READS,
    ),
    Route(
        "/conversations/{conversation_id}/context",
        "getContext",
        "The whole context to send the model now, in the provider's request shape, never "
        "over the limit: fitted at read time while a compaction is pending",
        bodies.ContextBody,
        params.ContextParams,
        ("conversation_id",),
        (*CONVERSATION_READS, 409),
        notes="409 (with Retry-After) when the message named by through or after is not "
        "stored within wait_ms; 304 to an If-None-Match naming the current ETag.",
    ),
    Route(
        "/conversations/{conversation_id}/compactions",
        "getCompactions",
        "The conversation's applied compactions, oldest first, with the batches each archived",
        bodies.CompactionLog,
        params.TenantParams,
        ("conversation_id",),
        CONVERSATION_READS,
    ),
    Route(
        "/conversations/{conversation_id}/batches/{batch_id}",
        "getBatch",
        "One archived batch: its summary and a page of the raw turns it covers",
        bodies.BatchPage,
        params.PageParams,
        ("conversation_id", "batch_id"),
        CONVERSATION_READS,
    ),
    Route(
        "/memory/search",
        "searchMemory",
        "memory_read: archived summaries and raw turns ranked by full text and vectors",
        bodies.SearchResult,
        params.SearchParams,
        refusals=(400, 401, 403, 413, 429, 503),
        scope="search",
        notes="Scoped by conversation_id or tenant_id; a search across every conversation "
        "needs [service].allow_global_search.",
    ),
    Route(
        "/tenants/{tenant}/usage",
        "getTenantUsage",
        "What the tenant's compactions cost: LLM calls, tokens and estimated cost by UTC day",
        bodies.UsageReport,
        params.UsageParams,
        ("tenant",),
        (400, 401, 403, 413, 429, 503),
        notes="A token with the admin scope, or a tenant-bound token for its own tenant.",
    ),
    *(
        Route(
            f"/conversations/{{conversation_id}}/{action}",
            f"{action}Conversation",
            summary,
            bodies.RedoAccepted,
            params,
            ("conversation_id",),
            (400, 401, 403, 409, 413, 429, 503)
            if action == "recompact"
            else (400, 401, 403, 413, 429, 503),
            scope="admin",
            notes="An admin token only; no body. Answered 202 once the request is on the "
            "control topic: the conversation's worker does it."
            + (
                " 409: the conversation's pinned messages alone exceed the budget."
                if action == "recompact"
                else ""
            ),
            method="post",
            ok_status=202,
        )
        for action, summary, params in (
            (
                "recompact",
                "Rebuild the conversation's archived summaries from their raw turns",
                params.RecompactParams,
            ),
            (
                "restore",
                "Bring an archived batch's raw turns back into the history",
                params.RestoreParams,
            ),
        )
    ),
    *(
        Route(
            f"/conversations/{{conversation_id}}/messages/{{message_id}}/{action}",
            f"{action}Message",
            summary,
            bodies.PinChanged,
            params.TenantParams,
            ("conversation_id", "message_id"),
            (400, 401, 403, 404, 413, 429, 503),
            scope="admin",
            notes="An admin token only; no body. Stored at once under the conversation's "
            "lock (any worker answers); 404: no such live message (compacted, erased, "
            "never stored).",
            method="post",
        )
        for action, summary in (
            ("pin", "Keep a stored message verbatim through every compaction"),
            ("unpin", "Let compactions compress a pinned message again"),
        )
    ),
    Route(
        "/openapi.json",
        "getOpenApi",
        "This document",
        None,
        refusals=(401, 403, 413, 429),
    ),
    Route(
        "/healthz",
        "getHealth",
        "ok, or degraded (503) with the problems",
        probe_bodies.Health,
        refusals=(401, 413, 429),
        scope="metrics",
        secured=False,
        notes="Needs [service].metrics_token when one is set.",
        extra_ok={503: "degraded"},
    ),
    Route(
        "/metrics",
        "getMetrics",
        "Prometheus metrics",
        None,
        refusals=(401, 413, 429),
        scope="metrics",
        media="text/plain",
        secured=False,
        notes="Needs [service].metrics_token when one is set.",
    ),
    Route(
        "/livez",
        "getLiveness",
        "Kubernetes liveness: the app and its agents are running (open)",
        probe_bodies.Liveness,
        refusals=(413,),
        secured=False,
        extra_ok={503: "dead"},
    ),
    Route(
        "/readyz",
        "getReadiness",
        "Kubernetes readiness: PostgreSQL answers and partitions are assigned (open)",
        probe_bodies.Readiness,
        refusals=(413,),
        secured=False,
        extra_ok={503: "not ready"},
    ),
)

_REFUSALS = {
    400: "A parameter is not valid: error names it",
    401: "No valid bearer token",
    403: "The token may not read that (another tenant's, or a missing scope)",
    404: "Unknown (also answered 403 to a tenant token, so the difference reveals nothing)",
    409: "context: the message named by through or after is not stored yet (within "
    "wait_ms), retry after Retry-After seconds; recompact: the conversation's pinned "
    "messages alone exceed the budget",
    413: "The request had a body",
    429: "Too many requests for this token, or failed authentications from here: "
    "wait Retry-After seconds",
    503: "PostgreSQL is unavailable (or not opened yet): retry after Retry-After seconds",
}


def document(service: ServiceSettings | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document, with ``service``'s bounds (defaults when None)."""
    service = service if service is not None else ServiceSettings()
    models: list[type[BaseModel]] = [bodies.Problem]
    models += [r.ok for r in ROUTES if r.ok is not None]
    _, schemas = models_json_schema(
        [(m, "serialization") for m in dict.fromkeys(models)], ref_template=REF
    )
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(route, service)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": API_TITLE,
            "version": _version(),
            "description": "Views of compacted conversations (and an admin's recompact and "
            "restore requests). A conversation is its tenant and its id: a tenant-bound "
            "token reads its own tenant's, any other token names the tenant with "
            "tenant_id. See docs/security.md.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("context-compactor")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0.0.0"


def _operation(route: Route, service: ServiceSettings) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "parameters": _path_parameters(route) + _query_parameters(route, service),
        "responses": _responses(route),
    }
    if route.notes:
        operation["description"] = route.notes
    operation["security"] = (
        [{"bearer": []}] if route.secured else [{}, {"bearer": []}]  # open, or a token
    )
    return operation


def _path_parameters(route: Route) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": TENANT_ID_PATTERN}
            if name == "tenant"
            else {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
        }
        for name in route.path_params
    ]


def _query_parameters(route: Route, service: ServiceSettings) -> list[dict[str, Any]]:
    if route.params is None:
        return []
    schema = route.params.model_json_schema(mode="validation")
    required = set(schema.get("required", ()))
    found = []
    for name, prop in schema["properties"].items():
        prop = _bounded(name, _without_null(prop), route, service)
        description = prop.pop("description", None)
        prop.pop("title", None)
        parameter: dict[str, Any] = {
            "name": name,
            "in": "query",
            "required": name in required,
            "schema": prop,
        }
        if description:
            parameter["description"] = description
        found.append(parameter)
    return found


def _without_null(prop: dict[str, Any]) -> dict[str, Any]:
    """``X | None = None`` is an optional parameter of type X (absent, never null)."""
    options = [o for o in prop.get("anyOf", ()) if o.get("type") != "null"]
    if len(options) == 1:
        merged = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
        return {**options[0], **merged}
    return dict(prop)


def _bounded(
    name: str, prop: dict[str, Any], route: Route, service: ServiceSettings
) -> dict[str, Any]:
    """The bounds a worker's ``[service]`` sets."""
    if name == "limit":
        paged = route.params is params.PageParams
        prop["maximum"] = service.page_max_limit if paged else service.max_search_limit
    if name == "q":
        prop["maxLength"] = service.max_query_chars
    if name == "wait_ms":
        prop["maximum"] = service.context_max_wait_ms
    return prop


def _responses(route: Route) -> dict[str, Any]:
    problem = {"application/json": {"schema": {"$ref": REF.format(model="Problem")}}}
    if route.ok is not None:
        body = {route.media: {"schema": {"$ref": REF.format(model=route.ok.__name__)}}}
    elif route.media == "application/json":
        body = {route.media: {"schema": {"type": "object"}}}
    else:
        body = {route.media: {"schema": {"type": "string"}}}
    ok = "OK" if route.ok_status == 200 else "Accepted"
    responses: dict[str, Any] = {str(route.ok_status): {"description": ok, "content": body}}
    for status, meaning in route.extra_ok.items():
        responses[str(status)] = {"description": meaning, "content": body}
    for status in route.refusals:
        if str(status) not in responses:
            responses[str(status)] = {"description": _REFUSALS[status], "content": problem}
    return responses


def render(doc: dict[str, Any]) -> str:
    """Stable text (sorted keys, trailing newline), like the event schemas."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
