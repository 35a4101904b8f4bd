"""HTTP views of a worker (JSON), served by Faust's web server.

``/conversations/{id}`` reads the token table, which is partitioned: a request
reaching the wrong worker is forwarded to the one that owns the key (the
owner of the conversation's messages partition). Faust forwards the request
with its headers, so the owner authenticates the same bearer token again.

Every request passes ``guard`` first (an aiohttp middleware, so Faust's own
views are covered too): bodies are refused, ``/livez`` and ``/readyz`` need no
token (``streams.http.probes``), ``/healthz`` and ``/metrics``
need ``[service].metrics_token`` when it is set, everything else a token of
``streams.http.auth.AuthPolicy``. A tenant-bound token reaches only the views
below, each of which checks the conversation's tenant (403 otherwise, also
for an unknown conversation, so a 403/404 difference reveals nothing).
Inputs are bounded: path ids by ``MAX_ID_LENGTH``, the query by
``[service].max_query_chars``, ``limit`` by ``[service].max_search_limit``.
Every body is built by a model of ``streams.http.bodies``, the API's contract:
``streams.http.openapi`` generates the document (``/openapi.json``) from the
same models, and ``tests/unit/http/test_openapi.py`` keeps routes, parameters
and fields in step with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import faust
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from faust.web import Request, Response, View
from pydantic import BaseModel

from core.domain.tenancy import conversation_key, is_tenant_id
from core.ports.storage import (
    QueryMode,
    ReadScope,
    SearchSources,
    StoreUnavailable,
    WorkerStore,
)
from core.settings import ResolvedModel, Scope, ServiceSettings, Settings
from streams.events import MAX_ID_LENGTH
from streams.http import bodies, openapi, pages, ui
from streams.http.audit import audit_reads
from streams.http.auth import (
    OPEN_PATHS,
    AuthPolicy,
    PolicyRef,
    Principal,
    check_exposure,
    configured_service,
)
from streams.http.forwarding import (
    FORWARDABLE,
    FORWARDED,
    PRINCIPAL,
    PRINCIPAL_HEADER,
    SIGNATURE_HEADER,
    Forwarding,
    client_ssl_context,
    install,
    internal_key,
)
from streams.http.limits import RateLimiter
from streams.http.probes import PROBE_PATHS, register_probes
from streams.http.usage import USAGE_PATH, register_usage
from streams.worker.components import Components

log = logging.getLogger("compactor.auth")
OPENAPI_PATH = "/openapi.json"
# Where the worker finds the DSN first (core.adapters.postgres.embedded.POSTGRES_DSN_ENV).
DSN_ENV = "POSTGRES_DSN"
# A request that somehow skipped the guard reads nothing (no tenant matches "").
_NOBODY = Principal(tenant="")


class ViewRuntime(Protocol):
    """What the views need of the worker's runtime (``streams.bootstrap.WorkerRuntime``)."""

    resolved_model: ResolvedModel

    @property
    def is_open(self) -> bool: ...

    @property
    def store(self) -> WorkerStore: ...


def _body(model: BaseModel) -> dict[str, Any]:
    """A body as the views send it: every field, in JSON types."""
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped


def _problem(view: View, problem: bodies.Problem | str, status: int) -> Response:
    found = bodies.Problem(error=problem) if isinstance(problem, str) else problem
    return view.json(_body(found), status=status)


_SOURCES: tuple[SearchSources, ...] = ("both", "summaries", "raw")
_MODES: tuple[QueryMode, ...] = ("plain", "websearch")


def search_options(query: Any) -> tuple[SearchSources, QueryMode]:
    """``sources`` and ``mode`` of a memory search request; ValueError names a bad one."""
    sources, mode = query.get("sources", "both"), query.get("mode", "plain")
    for name, value, allowed in (("sources", sources, _SOURCES), ("mode", mode, _MODES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return sources, mode


FORBIDDEN = _body(bodies.FORBIDDEN)
UNAUTHORIZED = _body(bodies.UNAUTHORIZED)


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
    conversation_key: str | None  # one conversation (its tenant's, when tenant_id is set)
    tenant_id: str | None
    limit: int
    sources: SearchSources
    mode: QueryMode


class Forbidden(Exception):
    """The caller's token may not read what it asked for (403)."""


def requested_tenant(query: Mapping[str, str], principal: Principal) -> str | None:
    """The tenant a request is about: a tenant-bound token's own (``tenant_id``, if
    given, must be it: Forbidden otherwise), or ``tenant_id`` (None: conversations
    without a tenant, or every tenant where a view allows). ValueError names a
    malformed one."""
    asked = query.get("tenant_id")
    if asked is not None and not is_tenant_id(asked):
        raise ValueError("tenant_id must be 1 to 256 letters, digits or ._:@-")
    if principal.tenant is None:
        return asked
    if not principal.tenant or asked not in (None, principal.tenant):
        raise Forbidden
    return principal.tenant


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
    conversation_id = query.get("conversation_id")
    if problem is None and conversation_id is not None:
        problem = bad_text("conversation_id", conversation_id, MAX_ID_LENGTH)
    if problem is not None:
        raise ValueError(problem)
    sources, mode = search_options(query)
    tenant = requested_tenant(query, principal)
    if tenant is None and conversation_id is None and not service.allow_global_search:
        raise ValueError(
            "memory search needs conversation_id or tenant_id (a search across every "
            "conversation needs [service].allow_global_search = true)"
        )
    key = None if conversation_id is None else conversation_key(tenant, conversation_id)
    return SearchRequest(text, key, tenant, int(raw_limit), sources, mode)


def principal_of(request: Request) -> Principal:
    found = cast(web.Request, request).get(PRINCIPAL)
    return found if isinstance(found, Principal) else _NOBODY


def read_scope(principal: Principal) -> ReadScope:
    """What the store lets the caller's reads see, beneath every view's own tenant
    check (PostgreSQL: row-level security, docs/security.md): the tenant's
    conversations, or all of them for a token that is not tenant-bound. Only
    here, after the guard authenticated the token, is ``everything()`` chosen."""
    if principal.tenant is None:
        return ReadScope.everything()
    return ReadScope.of_tenant(principal.tenant)


def _refusal(status: int, body: Mapping[str, str]) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="compactor"'} if status == 401 else None
    return web.json_response(dict(body), status=status, headers=headers)


def _tenant_views(path: str) -> bool:
    """The views a tenant-bound token may reach: those that check a conversation's
    (or the usage's) tenant themselves, and the API's document."""
    return (
        path in ("/memory/search", OPENAPI_PATH)
        or path.startswith("/conversations/")
        or USAGE_PATH.match(path) is not None
    )


def required_scope(method: str, path: str) -> Scope:
    """The scope a request needs (``/healthz`` and ``/metrics``: metrics, see ``guard``)."""
    if path in OPEN_PATHS:
        return "metrics"
    if method == "POST":  # recompact, restore (streams/http/redo.py): the admin's only
        return "admin"
    if path == "/memory/search":
        return "search"
    if path == OPENAPI_PATH:
        return "read"
    if USAGE_PATH.match(path):
        return "read"  # the view lets only the admin scope or the tenant's own token in
    if path.startswith("/conversations/"):
        return "erase" if method == "DELETE" else "read"
    return "admin"  # Faust's own views (/table, /router, /, …) and anything else


def _too_many(
    limiter: RateLimiter, wait: float, why: str = "too many requests for this token"
) -> web.Response:
    return web.json_response(
        {"error": why},
        status=429,
        headers={"Retry-After": limiter.retry_after(wait)},
    )


@web.middleware
async def store_outage_is_503(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A read while PostgreSQL is away (or not opened yet, at start-up) is a 503 the
    client may retry, not a 500: the worker waits such outages out. aiohttp's own
    refusals (no such route, a method a view lacks) answer JSON like the views."""
    try:
        return await handler(request)
    except web.HTTPException as refusal:
        if refusal.status < 400:
            raise
        return web.json_response(
            {"error": refusal.reason.lower()}, status=refusal.status, headers=_allow(refusal)
        )
    except StoreUnavailable:
        return web.json_response(
            {"error": "the store is unavailable; retry later"},
            status=503,
            headers={"Retry-After": "5"},
        )


def _allow(refusal: web.HTTPException) -> dict[str, str] | None:
    allow = refusal.headers.get("Allow")
    return None if allow is None else {"Allow": allow}


def guard(
    policy: AuthPolicy | PolicyRef,
    limiter: RateLimiter | None = None,
    forwarding: Forwarding | None = None,
    failures: RateLimiter | None = None,
) -> Middleware:
    """``failures``: failed authentications per client address (see ``limits``)."""
    ref = policy if isinstance(policy, PolicyRef) else PolicyRef(policy)
    limits = limiter if limiter is not None else RateLimiter(0, 1)
    failed = failures if failures is not None else RateLimiter(0, 1)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            return _refusal(413, {"error": "request bodies are not accepted"})
        if request.path in PROBE_PATHS or ui.is_ui_path(request.path):
            # kubelet probes (streams/http/probes.py) and the inspector's static files
            # (no data: the page asks for a token): no token
            return await handler(request)
        current = ref.policy  # read once: a reload mid-request never mixes two policies
        header = request.headers.get("Authorization")
        principal: Principal | None
        if PRINCIPAL_HEADER in request.headers or SIGNATURE_HEADER in request.headers:
            # Forwarded by another worker: the signed principal, on the forwarded
            # path only; the entry worker already counted it against the limit.
            principal = None
            if (
                forwarding is not None
                and request.method in ("GET", "HEAD")
                and FORWARDABLE.match(request.path)
            ):
                principal = forwarding.verify(request.headers, request.method, request.path_qs)
            if principal is None:
                return _refusal(401, UNAUTHORIZED)
            request[FORWARDED] = True
        else:
            client = request.remote or "unknown"
            if (wait := failed.blocked(client)) is not None:
                return _too_many(failed, wait, "too many failed authentications from here")
            if request.path in OPEN_PATHS:
                principal = current.operations_principal(header)
            else:
                principal = current.authenticate(header)
            if principal is None:
                failed.acquire(client)
                return _refusal(401, UNAUTHORIZED)
            if (
                principal.token_id != "anonymous"
                and (wait := limits.acquire(principal.token_id)) is not None
            ):
                return _too_many(limits, wait)
            if request.path in OPEN_PATHS:
                return await handler(request)
        if not principal.allows(required_scope(request.method, request.path)):
            return _refusal(403, FORBIDDEN)
        if principal.tenant is not None and not _tenant_views(request.path):
            return _refusal(403, FORBIDDEN)
        request[PRINCIPAL] = principal
        return await handler(request)

    return check


def register_views(
    app: faust.App, settings: Settings, components: Components[Any], runtime: ViewRuntime
) -> Callable[[], bool]:
    """Registers the views behind the guard; returns the token reload (what SIGHUP calls)."""
    service = settings.service
    policy = AuthPolicy.of(service)
    check_exposure(service, policy)
    ref = PolicyRef(policy)
    configured = settings.postgres.dsn
    dsn = os.environ.get(DSN_ENV) or (
        configured.get_secret_value() if configured is not None else None
    )
    forwarding = Forwarding(internal_key(service, dsn), client_ssl_context(service))
    if forwarding.key is None and policy.enabled:
        log.warning(
            "no internal key: a request for a conversation another worker serves is "
            "answered 503 instead of being forwarded (a caller's token is never sent on); "
            "set [service].internal_token, the same on every worker (docs/security.md)"
        )
    install(app, forwarding)
    limiter = RateLimiter(service.rate_limit_per_second, service.rate_limit_burst)
    failures = RateLimiter(
        service.auth_failures_per_second, service.auth_failures_burst, max_keys=10_000
    )
    web_app = cast(web.Application, app.web.web_app)  # type: ignore[attr-defined]
    # Outermost, so it logs every answer, the guard's refusals included.
    web_app.middlewares.append(audit_reads(lambda request: request.get(PRINCIPAL)))
    web_app.middlewares.append(guard(ref, limiter, forwarding, failures))
    web_app.middlewares.append(store_outage_is_503)
    register_operations(app, components, runtime)
    register_probes(app, components, runtime)
    register_conversations(app, settings, components, runtime)
    register_memory(app, settings, runtime)
    register_usage(app, runtime)
    register_document(app, settings.service)
    ui.register_ui(app)

    def reload() -> bool:
        return ref.reload(configured_service, check=check_exposure)

    @app.task  # type: ignore[untyped-decorator]
    async def reload_on_sighup() -> None:
        watch_sighup(reload)

    return reload


def watch_sighup(reload: Callable[[], bool]) -> None:
    """Call ``reload`` (the tokens from the config file and the environment) on SIGHUP."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


def register_operations(app: faust.App, components: Components[Any], runtime: ViewRuntime) -> None:
    @app.page("/healthz")
    class Health(View):
        async def get(self, request: Request) -> Response:
            try:
                assignment = app.consumer.assignment()
            except Exception:  # not started yet (or stopping): nothing assigned
                assignment = set()
            health = components.health
            body = bodies.Health(
                status="ok" if health.ok else "degraded",
                problems=[bodies.HealthProblem.model_validate(p) for p in health.describe()],
                app_id=app.conf.id,
                summariser=runtime.resolved_model.kind,
                assigned_partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assignment),
            )
            return self.json(_body(body), status=200 if health.ok else 503)

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

    @app.page("/conversations/{conversation_id}")
    class Conversation(View):
        @app.topic_route(topic=messages_topic, match_info="conversation_id")  # type: ignore[arg-type]
        async def get(self, request: Request, conversation_id: str) -> Response:
            # Runs on the owner (after forwarding): its guard authenticated the
            # caller again, and the key below is built from that principal.
            if not isinstance(key := addressed(self, request, conversation_id), str):
                return key
            tally = tallies.get(key)
            if tally is None:
                return _problem(self, bodies.unknown_conversation(key), 404)
            return self.json(_body(bodies.ConversationStatus.of(tally, budget)))

    register_pages(app, settings, runtime)


def addressed(view: View, request: Request, *ids: str) -> Response | str:
    """The conversation key a view's path (and ``tenant_id``) names for the caller,
    or the refusal: 400 for a bad path id or tenant id, 403 for a tenant the
    token is not bound to. A tenant-bound token names its own tenant's
    conversations only, so it cannot even address another's."""
    for name, value in zip(("conversation_id", "batch_id"), ids, strict=False):
        problem = bad_text(name, value, MAX_ID_LENGTH)
        if problem is not None:
            return _problem(view, problem, 400)
    try:
        tenant = requested_tenant(request.query, principal_of(request))
    except ValueError as error:
        return _problem(view, str(error), 400)
    except Forbidden:
        return _problem(view, bodies.FORBIDDEN, 403)
    return conversation_key(tenant, ids[0])


def register_pages(app: faust.App, settings: Settings, runtime: ViewRuntime) -> None:
    """The views that return a page (``limit`` + ``cursor``, ``streams.http.pages``)."""

    @app.page("/conversations/{conversation_id}/history")
    class History(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            if not isinstance(key := addressed(self, request, conversation_id), str):
                return key
            try:
                limit, after = pages.page_request(request.query, settings.service)
            except ValueError as error:
                return _problem(self, str(error), 400)
            store = runtime.store
            history = await store.load_history(
                key,
                scope=read_scope(principal_of(request)),
                after=after,
                limit=limit + 1,  # one more: is there a next page?
            )
            if not history and after is None:
                return _problem(self, bodies.unknown_conversation(key), 404)
            page = history[:limit]
            following = pages.cursor_of(page[-1]) if len(history) > limit else None
            return self.json(_body(bodies.HistoryPage.of(key, page, following)))

    @app.page("/conversations/{conversation_id}/batches/{batch_id}")
    class Batch(View):
        async def get(self, request: Request, conversation_id: str, batch_id: str) -> Response:
            if not isinstance(key := addressed(self, request, conversation_id, batch_id), str):
                return key
            try:
                limit, after = pages.page_request(request.query, settings.service)
            except ValueError as error:
                return _problem(self, str(error), 400)
            store = runtime.store
            expanded = await store.expand_batch(
                key,
                batch_id,
                scope=read_scope(principal_of(request)),
                after=after,
                limit=limit + 1,
            )
            if expanded is None:
                return _problem(self, f"unknown batch {batch_id!r} in {conversation_id!r}", 404)
            turns = expanded.turns
            following = pages.cursor_of(turns[limit - 1]) if len(turns) > limit else None
            page = expanded.model_copy(update={"turns": turns[:limit]})
            return self.json(_body(bodies.BatchPage.of(page, following)))

    @app.page("/conversations/{conversation_id}/compactions")
    class Compactions(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            if not isinstance(key := addressed(self, request, conversation_id), str):
                return key
            store = runtime.store
            scope = read_scope(principal_of(request))
            records = await store.compaction_log(key, scope=scope)
            if not records and not await store.load_history(key, scope=scope, limit=1):
                return _problem(self, bodies.unknown_conversation(key), 404)
            return self.json(_body(bodies.CompactionLog.of(key, records)))


def register_memory(app: faust.App, settings: Settings, runtime: ViewRuntime) -> None:
    @app.page("/memory/search")
    class MemorySearch(View):
        async def get(self, request: Request) -> Response:
            principal = principal_of(request)
            try:
                asked = search_request(request.query, principal, settings.service)
            except ValueError as error:
                return _problem(self, str(error), 400)
            except Forbidden:
                return _problem(self, bodies.FORBIDDEN, 403)
            store = runtime.store
            try:
                result = await store.memory_read(
                    asked.query,
                    conversation_id=asked.conversation_key,
                    limit=asked.limit,
                    sources=asked.sources,
                    mode=asked.mode,
                    tenant_id=asked.tenant_id,
                    scope=read_scope(principal),
                )
            except ValueError as error:
                return _problem(self, str(error), 400)
            return self.json(_body(bodies.SearchResult.of(result)))


def register_document(app: faust.App, service: ServiceSettings) -> None:
    """``/openapi.json``: the API's contract with this worker's bounds (``[service]``)."""
    document = openapi.document(service)

    @app.page(OPENAPI_PATH)
    class Document(View):
        async def get(self, request: Request) -> Response:
            return self.json(document)
