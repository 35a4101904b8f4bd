"""The guard every request passes first: an aiohttp middleware, so Faust's own
views are covered too.

Bodies are refused; ``/livez``, ``/readyz`` (``streams.http.probes``) and the
inspector's static files need no token; ``/healthz`` and ``/metrics`` need
``[service].metrics_token`` when it is set; everything else a token of
``streams.http.auth.AuthPolicy`` with the scope the route needs
(``required_scope``). A request forwarded by another worker carries a signed
principal instead (``streams.http.forwarding``). A tenant-bound token reaches
only the views that check a conversation's tenant themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from core.ports.storage import StoreUnavailable
from core.settings import Scope
from streams.http import ui
from streams.http.access import FORBIDDEN, UNAUTHORIZED
from streams.http.auth import OPEN_PATHS, AuthPolicy, Principal
from streams.http.forwarding import (
    FORWARDABLE,
    FORWARDED,
    PRINCIPAL,
    PRINCIPAL_HEADER,
    SIGNATURE_HEADER,
    Forwarding,
)
from streams.http.limits import RateLimiter
from streams.http.openapi import OPENAPI_PATH
from streams.http.probes import PROBE_PATHS
from streams.http.reload import PolicyRef
from streams.http.usage import USAGE_PATH


@dataclass(frozen=True)
class Caller:
    """Authenticated; whether its scope reaches the route is checked next."""

    principal: Principal


@dataclass(frozen=True)
class Operator:
    """``/healthz`` or ``/metrics`` answered for a caller the policy lets in."""


@dataclass(frozen=True)
class Refusal:
    response: web.Response


Admission = Caller | Operator | Refusal


@dataclass(frozen=True)
class Limits:
    """Requests per token, and failed authentications per client address."""

    requests: RateLimiter
    failures: RateLimiter


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


def _tenant_views(path: str) -> bool:
    """The views a tenant-bound token may reach: those that check a conversation's
    (or the usage's) tenant themselves, and the API's document."""
    return (
        path in ("/memory/search", OPENAPI_PATH)
        or path.startswith("/conversations/")
        or USAGE_PATH.match(path) is not None
    )


def _refusal(status: int, body: Mapping[str, str]) -> Refusal:
    headers = {"WWW-Authenticate": 'Bearer realm="compactor"'} if status == 401 else None
    return Refusal(web.json_response(dict(body), status=status, headers=headers))


def _too_many(
    limiter: RateLimiter, wait: float, why: str = "too many requests for this token"
) -> Refusal:
    return Refusal(
        web.json_response(
            {"error": why}, status=429, headers={"Retry-After": limiter.retry_after(wait)}
        )
    )


def _forwarded(request: web.Request, forwarding: Forwarding | None) -> Admission:
    """Forwarded by another worker: the signed principal, on the forwarded path
    only; the entry worker already counted it against the limit."""
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
    return Caller(principal)


def _direct(request: web.Request, policy: AuthPolicy, limits: Limits) -> Admission:
    """A caller's own bearer token, after its address's failed tries and before its
    token's rate limit."""
    client = request.remote or "unknown"
    if (wait := limits.failures.blocked(client)) is not None:
        return _too_many(limits.failures, wait, "too many failed authentications from here")
    header = request.headers.get("Authorization")
    operations = request.path in OPEN_PATHS
    principal = policy.operations_principal(header) if operations else policy.authenticate(header)
    if principal is None:
        limits.failures.acquire(client)
        return _refusal(401, UNAUTHORIZED)
    if (
        principal.token_id != "anonymous"
        and (wait := limits.requests.acquire(principal.token_id)) is not None
    ):
        return _too_many(limits.requests, wait)
    return Operator() if operations else Caller(principal)


def _admission(
    request: web.Request, policy: AuthPolicy, limits: Limits, forwarding: Forwarding | None
) -> Admission:
    """Who the caller is, and whether the route's scope and tenant let it in."""
    if PRINCIPAL_HEADER in request.headers or SIGNATURE_HEADER in request.headers:
        admitted = _forwarded(request, forwarding)
    else:
        admitted = _direct(request, policy, limits)
    if not isinstance(admitted, Caller):
        return admitted
    principal = admitted.principal
    if not principal.allows(required_scope(request.method, request.path)):
        return _refusal(403, FORBIDDEN)
    if principal.tenant is not None and not _tenant_views(request.path):
        return _refusal(403, FORBIDDEN)
    return admitted


def guard(
    policy: AuthPolicy | PolicyRef,
    limiter: RateLimiter | None = None,
    forwarding: Forwarding | None = None,
    failures: RateLimiter | None = None,
) -> Middleware:
    """``failures``: failed authentications per client address (see ``limits``)."""
    ref = policy if isinstance(policy, PolicyRef) else PolicyRef(policy)
    limits = Limits(
        limiter if limiter is not None else RateLimiter(0, 1),
        failures if failures is not None else RateLimiter(0, 1),
    )

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            return _refusal(413, {"error": "request bodies are not accepted"}).response
        if request.path in PROBE_PATHS or ui.is_ui_path(request.path):
            # kubelet probes (streams/http/probes.py) and the inspector's static files
            # (no data: the page asks for a token): no token
            return await handler(request)
        # The policy is read once: a reload mid-request never mixes two policies.
        match _admission(request, ref.policy, limits, forwarding):
            case Refusal(response):
                return response
            case Operator():
                return await handler(request)
            case Caller(principal):
                request[PRINCIPAL] = principal
                return await handler(request)

    return check


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
