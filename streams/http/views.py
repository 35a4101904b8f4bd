"""HTTP views of a worker (JSON), served by Faust's web server.

``/conversations/{id}`` reads the token table, which is partitioned: a request
reaching the wrong worker is forwarded to the one that owns the key (the
owner of the conversation's messages partition). Faust forwards the request
with its headers, so the owner authenticates the same bearer token again.

Every request passes ``guard`` first (an aiohttp middleware, so Faust's own
views are covered too): bodies are refused, ``/healthz`` and ``/metrics``
need ``[service].metrics_token`` when it is set, everything else a token of
``streams.http.auth.AuthPolicy``. A tenant-bound token reaches only the views
below, each of which checks the conversation's tenant (403 otherwise, also
for an unknown conversation, so a 403/404 difference reveals nothing).
Inputs are bounded: path ids by ``MAX_ID_LENGTH``, the query by
``[service].max_query_chars``, ``limit`` by ``[service].max_search_limit``.
The bodies are built by plain functions, so their shape is testable without
a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import faust
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from faust.web import Request, Response, View

from core.domain.accounting import ConversationTally
from core.domain.budget import BudgetConfig, over_budget
from core.domain.clip_archive import is_clip_archive
from core.domain.messages import ConversationMessage
from core.domain.tokens import estimate_history_tokens
from core.ports.storage import ExpandedBatch, QueryMode, SearchSources, WorkerStore
from core.settings import ResolvedModel, ServiceSettings, Settings
from streams.events import MAX_ID_LENGTH
from streams.http.auth import OPEN_PATHS, AuthPolicy, Principal, check_exposure
from streams.worker.components import Components

PRINCIPAL = web.RequestKey("compactor.principal", Principal)
# A request that somehow skipped the guard reads nothing (no tenant matches "").
_NOBODY = Principal(tenant="")


class ViewRuntime(Protocol):
    """What the views need of the worker's runtime (``streams.bootstrap.WorkerRuntime``)."""

    resolved_model: ResolvedModel

    @property
    def store(self) -> WorkerStore: ...


def conversation_body(tally: ConversationTally, budget: BudgetConfig) -> dict[str, Any]:
    return {
        "conversation_id": tally.conversation_id,
        "token_total": tally.token_total,
        "message_count": tally.message_count,
        "budget_tokens": budget.budget_tokens,
        "over_budget": over_budget(tally.token_total, budget),
        "compactions": tally.compactions,
        "generation": tally.generation,
        "compaction_outstanding": tally.outstanding,
    }


def history_body(conversation_id: str, history: Sequence[ConversationMessage]) -> dict[str, Any]:
    first = history[0] if history else None
    return {
        "conversation_id": conversation_id,
        "token_estimate": estimate_history_tokens(history),
        "clip_archive": first.model_dump(mode="json")
        if first is not None and is_clip_archive(first)
        else None,
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in history],
    }


_SOURCES: tuple[SearchSources, ...] = ("both", "summaries", "raw")
_MODES: tuple[QueryMode, ...] = ("plain", "websearch")


def search_options(query: Any) -> tuple[SearchSources, QueryMode]:
    """``sources`` and ``mode`` of a memory search request; ValueError names a bad one."""
    sources, mode = query.get("sources", "both"), query.get("mode", "plain")
    for name, value, allowed in (("sources", sources, _SOURCES), ("mode", mode, _MODES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return sources, mode


def batch_body(expanded: ExpandedBatch) -> dict[str, Any]:
    """A batch with every raw turn it covers, in conversation order."""
    stored = expanded.batch
    return {
        "batch_id": stored.id,
        "label": stored.label,
        "conversation_id": stored.conversation_id,
        "depth": stored.batch.depth,
        "start_time": stored.batch.start_time.isoformat(),
        "end_time": stored.batch.end_time.isoformat(),
        "message_count": stored.batch.message_count,
        "superseded_by": stored.superseded_by,
        "summary": stored.batch.content,
        "turns": [m.model_dump(mode="json", exclude_none=True) for m in expanded.turns],
        "turns_missing": expanded.turns_missing,
    }


def unknown(conversation_id: str) -> dict[str, str]:
    return {"error": f"unknown conversation {conversation_id!r}"}


FORBIDDEN = {"error": "forbidden: this token cannot read that"}
UNAUTHORIZED = {"error": "unauthorized: a valid bearer token is required"}


def bad_text(name: str, value: str, limit: int) -> str | None:
    """Why ``value`` is not usable as ``name``, or None."""
    if not value:
        return f"{name} must not be empty"
    if len(value) > limit:
        return f"{name} is longer than {limit} characters"
    if "\x00" in value:
        return f"{name} contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{name} is not valid UTF-8 text"
    return None


@dataclass(frozen=True)
class SearchRequest:
    query: str
    conversation_id: str | None
    tenant_id: str | None
    limit: int
    sources: SearchSources
    mode: QueryMode


class Forbidden(Exception):
    """The caller's token may not read what it asked for (403)."""


def search_request(
    query: Mapping[str, str], principal: Principal, service: ServiceSettings
) -> SearchRequest:
    """A memory search as asked; ValueError (400) or Forbidden (403) says why not."""
    text = query.get("q", "")
    problem = bad_text("q", text, service.max_query_chars)
    raw_limit = query.get("limit", "5")
    if problem is None and (len(raw_limit) > 4 or not raw_limit.isdigit()):
        problem = f"limit must be a whole number from 1 to {service.max_search_limit}"
    if problem is None and not 1 <= int(raw_limit) <= service.max_search_limit:
        problem = f"limit must be a whole number from 1 to {service.max_search_limit}"
    scopes = {name: query.get(name) for name in ("conversation_id", "tenant_id")}
    for name, value in scopes.items():
        if problem is None and value is not None:
            problem = bad_text(name, value, MAX_ID_LENGTH)
    if problem is not None:
        raise ValueError(problem)
    sources, mode = search_options(query)
    tenant = scopes["tenant_id"]
    if principal.tenant is not None:
        if tenant not in (None, principal.tenant):
            raise Forbidden
        tenant = principal.tenant
    if tenant is None and scopes["conversation_id"] is None and not service.allow_global_search:
        raise ValueError(
            "memory search needs conversation_id or tenant_id (a search across every "
            "conversation needs [service].allow_global_search = true)"
        )
    return SearchRequest(text, scopes["conversation_id"], tenant, int(raw_limit), sources, mode)


def principal_of(request: Request) -> Principal:
    found = cast(web.Request, request).get(PRINCIPAL)
    return found if isinstance(found, Principal) else _NOBODY


async def may_read(store: WorkerStore, principal: Principal, conversation_id: str) -> bool:
    """Whether the caller may read the conversation (a tenant-bound token: its own only)."""
    if principal.tenant is None:
        return True
    return principal.may_read(await store.conversation_tenant(conversation_id))


def _refusal(status: int, body: Mapping[str, str]) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="compactor"'} if status == 401 else None
    return web.json_response(dict(body), status=status, headers=headers)


def _tenant_views(path: str) -> bool:
    """The views that check a conversation's tenant themselves."""
    return path == "/memory/search" or path.startswith("/conversations/")


def guard(policy: AuthPolicy) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            return _refusal(413, {"error": "request bodies are not accepted"})
        header = request.headers.get("Authorization")
        if request.path in OPEN_PATHS:
            if not policy.operations_allowed(header):
                return _refusal(401, UNAUTHORIZED)
            return await handler(request)
        principal = policy.authenticate(header)
        if principal is None:
            return _refusal(401, UNAUTHORIZED)
        if principal.tenant is not None and not _tenant_views(request.path):
            return _refusal(403, FORBIDDEN)
        request[PRINCIPAL] = principal
        return await handler(request)

    return check


def register_views(
    app: faust.App, settings: Settings, components: Components[Any], runtime: ViewRuntime
) -> None:
    policy = AuthPolicy.of(settings.service)
    check_exposure(settings.service, policy)
    web_app = cast(web.Application, app.web.web_app)  # type: ignore[attr-defined]
    web_app.middlewares.append(guard(policy))
    register_operations(app, components, runtime)
    register_conversations(app, settings, components, runtime)
    register_memory(app, settings, runtime)


def register_operations(app: faust.App, components: Components[Any], runtime: ViewRuntime) -> None:
    @app.page("/healthz")
    class Health(View):
        async def get(self, request: Request) -> Response:
            try:
                assignment = app.consumer.assignment()
            except Exception:  # not started yet (or stopping): nothing assigned
                assignment = set()
            health = components.health
            return self.json(
                {
                    "status": "ok" if health.ok else "degraded",
                    "problems": health.describe(),
                    "app_id": app.conf.id,
                    "summariser": runtime.resolved_model.kind,
                    "assigned_partitions": sorted(
                        f"{tp.topic}:{tp.partition}" for tp in assignment
                    ),
                },
                status=200 if health.ok else 503,
            )

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(components.metrics.render(), content_type="text/plain; version=0.0.4")


def register_conversations(
    app: faust.App, settings: Settings, components: Components[Any], runtime: ViewRuntime
) -> None:
    budget = settings.budget
    tallies = components.table
    # The owner of a conversation's table entry is the owner of its messages
    # partition (the entry is written while processing that partition), so
    # requests are routed by the messages topic, whose keys are the raw UTF-8
    # conversation id as producers send it. Faust's table_route would hash
    # the table's own key encoding instead (JSON: '"conv-1"'), which lands on
    # another partition for most keys: with several workers, most lookups
    # went to a worker without the entry and answered 404.
    messages_topic = app.topic(
        components.names.messages,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )

    async def refused(view: View, request: Request, *ids: str) -> Response | None:
        """400 for a bad path id, 403 for a conversation the token may not read."""
        for value in ids:
            problem = bad_text("path parameter", value, MAX_ID_LENGTH)
            if problem is not None:
                return view.json({"error": problem}, status=400)
        store = runtime.store
        if not await may_read(store, principal_of(request), ids[0]):
            return view.json(FORBIDDEN, status=403)
        return None

    @app.page("/conversations/{conversation_id}")
    class Conversation(View):
        @app.topic_route(topic=messages_topic, match_info="conversation_id")  # type: ignore[arg-type]
        async def get(self, request: Request, conversation_id: str) -> Response:
            # Runs on the owner (after forwarding): its guard authenticated the
            # same token, and the tenant check below is the owner's.
            if (refusal := await refused(self, request, conversation_id)) is not None:
                return refusal
            tally = tallies.get(conversation_id)
            if tally is None:
                return self.json(unknown(conversation_id), status=404)
            return self.json(conversation_body(tally, budget))

    @app.page("/conversations/{conversation_id}/history")
    class History(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            if (refusal := await refused(self, request, conversation_id)) is not None:
                return refusal
            store = runtime.store
            history = await store.load_history(conversation_id)
            if not history:
                return self.json(unknown(conversation_id), status=404)
            return self.json(history_body(conversation_id, history))

    @app.page("/conversations/{conversation_id}/batches/{batch_id}")
    class Batch(View):
        async def get(self, request: Request, conversation_id: str, batch_id: str) -> Response:
            if (refusal := await refused(self, request, conversation_id, batch_id)) is not None:
                return refusal
            store = runtime.store
            expanded = await store.expand_batch(conversation_id, batch_id)
            if expanded is None:
                return self.json(
                    {"error": f"unknown batch {batch_id!r} in {conversation_id!r}"}, status=404
                )
            return self.json(batch_body(expanded))


def register_memory(app: faust.App, settings: Settings, runtime: ViewRuntime) -> None:
    @app.page("/memory/search")
    class MemorySearch(View):
        async def get(self, request: Request) -> Response:
            principal = principal_of(request)
            try:
                asked = search_request(request.query, principal, settings.service)
            except ValueError as error:
                return self.json({"error": str(error)}, status=400)
            except Forbidden:
                return self.json(FORBIDDEN, status=403)
            store = runtime.store
            if asked.conversation_id is not None and not await may_read(
                store, principal, asked.conversation_id
            ):
                return self.json(FORBIDDEN, status=403)
            try:
                result = await store.memory_read(
                    asked.query,
                    conversation_id=asked.conversation_id,
                    limit=asked.limit,
                    sources=asked.sources,
                    mode=asked.mode,
                    tenant_id=asked.tenant_id,
                )
            except ValueError as error:
                return self.json({"error": str(error)}, status=400)
            return self.json(result.model_dump(mode="json"))
