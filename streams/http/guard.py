"""The guard every request passes first: an aiohttp middleware, so Faust's own
views are covered too.

Bodies are refused; ``/livez``, ``/readyz`` (``streams.http.probes``) and the
inspector's static files need no token; ``/healthz`` and ``/metrics`` need
``[service].metrics_token`` when it is set; everything else a token of
``streams.http.auth.AuthPolicy`` with the scope the route needs
(``required_scope``). A request forwarded by another worker carries a signed
principal instead (``streams.http.forwarding``). A tenant-bound token reaches
only the views that check a conversation's tenant themselves.

Every 401, direct or forwarded, takes one from the client address's failed
authentications; an admitted request takes its cost from its token's and its
tenant's buckets, and a memory search waits for no one: past the tenant's cap
of searches in flight it is 429 at once (``streams.http.limits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from core.domain.tenancy import is_tenant_id
from core.ports.storage import StoreReadTimedOut, StoreUnavailable
from core.settings import Scope, ServiceSettings
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
    Refused,
)
from streams.http.limits import (
    MAX_TENANT_BUCKETS,
    InFlight,
    RateLimiter,
    RequestLimits,
    Throttled,
)
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


SEARCH_PATH = "/memory/search"
READ_TIMED_OUT = (
    "the read ran past the store's statement timeout"
    " ([postgres].read_statement_timeout_seconds); retry later or narrow it"
)
# Failed authentications: buckets for this many client addresses at most.
MAX_FAILURE_BUCKETS = 10_000


def _off() -> RateLimiter:
    return RateLimiter(0, 1)


@dataclass(frozen=True)
class Limits:
    """Requests per token and per tenant, what a search costs and how many may
    run at once per tenant, and failed authentications per client address."""

    requests: RequestLimits = field(default_factory=lambda: RequestLimits(_off(), _off()))
    failures: RateLimiter = field(default_factory=_off)
    searches: InFlight = field(default_factory=lambda: InFlight(0))
    search_cost: float = 1.0

    @classmethod
    def of(cls, service: ServiceSettings) -> Limits:
        per_token = RateLimiter(service.rate_limit_per_second, service.rate_limit_burst)
        per_tenant = RateLimiter(
            service.tenant_rate_limit_per_second,
            service.tenant_rate_limit_burst,
            max_keys=MAX_TENANT_BUCKETS,
        )
        failures = RateLimiter(
            service.auth_failures_per_second,
            service.auth_failures_burst,
            max_keys=MAX_FAILURE_BUCKETS,
        )
        return cls(
            RequestLimits(per_token, per_tenant),
            failures,
            InFlight(service.max_concurrent_searches_per_tenant),
            service.rate_limit_search_cost,
        )

    def cost(self, path: str) -> float:
        return self.search_cost if path == SEARCH_PATH else 1.0


def required_scope(method: str, path: str) -> Scope:
    """The scope a request needs (``/healthz`` and ``/metrics``: metrics, see ``guard``)."""
    if path in OPEN_PATHS:
        return "metrics"
    if method == "POST":  # recompact, restore (streams/http/redo.py): the admin's only
        return "admin"
    if path == SEARCH_PATH:
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
        path in (SEARCH_PATH, OPENAPI_PATH)
        or path.startswith("/conversations/")
        or USAGE_PATH.match(path) is not None
    )


def _refusal(status: int, body: Mapping[str, str]) -> Refusal:
    headers = {"WWW-Authenticate": 'Bearer realm="compactor"'} if status == 401 else None
    return Refusal(web.json_response(dict(body), status=status, headers=headers))


def _too_many(throttled: Throttled) -> Refusal:
    return Refusal(
        web.json_response(
            {"error": throttled.why}, status=429, headers={"Retry-After": throttled.retry_after}
        )
    )


def _failed_before(request: web.Request, limits: Limits) -> Refusal | None:
    """429 for an address that has used up its failed authentications."""
    if (wait := limits.failures.blocked(request.remote or "unknown")) is not None:
        return _too_many(Throttled(wait, "too many failed authentications from here"))
    return None


def _unauthorized(request: web.Request, limits: Limits) -> Refusal:
    """A 401, counted against the client address's failed authentications."""
    limits.failures.acquire(request.remote or "unknown")
    return _refusal(401, UNAUTHORIZED)


def _forwarded(request: web.Request, forwarding: Forwarding | None, limits: Limits) -> Admission:
    """Forwarded by another worker: the signed principal, on the forwarded path
    only; the entry worker already counted it against the rate limits."""
    if (blocked := _failed_before(request, limits)) is not None:
        return blocked
    verified: Principal | Refused = Refused("not forwardable")
    if (
        forwarding is not None
        and request.method in ("GET", "HEAD")
        and FORWARDABLE.match(request.path)
    ):
        verified = forwarding.verify(request.headers, request.method, request.path_qs)
    if isinstance(verified, Refused):
        return _unauthorized(request, limits)
    request[FORWARDED] = True
    return Caller(verified)


def request_tenant(request: web.Request, principal: Principal) -> str | None:
    """The tenant whose bucket a request takes from: a tenant-bound token's own, or
    the ``tenant_id`` a token bound to none names (a malformed one: none; the
    view answers it 400)."""
    if principal.tenant is not None:
        return principal.tenant
    asked = request.query.get("tenant_id")
    return asked if asked is not None and is_tenant_id(asked) else None


def _direct(request: web.Request, policy: AuthPolicy, limits: Limits) -> Admission:
    """A caller's own bearer token, after its address's failed tries and before its
    token's and tenant's rate limits."""
    if (blocked := _failed_before(request, limits)) is not None:
        return blocked
    header = request.headers.get("Authorization")
    operations = request.path in OPEN_PATHS
    principal = policy.operations_principal(header) if operations else policy.authenticate(header)
    if principal is None:
        return _unauthorized(request, limits)
    if principal.token_id != "anonymous":
        tenant = request_tenant(request, principal)
        throttled = limits.requests.admit(principal.token_id, tenant, limits.cost(request.path))
        if throttled is not None:
            return _too_many(throttled)
    return Operator() if operations else Caller(principal)


def _admission(
    request: web.Request, policy: AuthPolicy, limits: Limits, forwarding: Forwarding | None
) -> Admission:
    """Who the caller is, and whether the route's scope and tenant let it in."""
    if PRINCIPAL_HEADER in request.headers or SIGNATURE_HEADER in request.headers:
        admitted = _forwarded(request, forwarding, limits)
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


async def _answered(
    request: web.Request, handler: Handler, principal: Principal, limits: Limits
) -> web.StreamResponse:
    """The view's answer; a memory search only while its tenant (or, for a search
    of no tenant, its token) has fewer than the cap in flight."""
    if request.path != SEARCH_PATH:
        return await handler(request)
    tenant = request_tenant(request, principal)
    key = f"tenant:{tenant}" if tenant is not None else f"token:{principal.token_id}"
    if not limits.searches.enter(key):
        why = "too many searches in flight for this tenant; retry when one has finished"
        return _too_many(Throttled(1.0, why)).response
    try:
        return await handler(request)
    finally:
        limits.searches.leave(key)


def guard(
    policy: AuthPolicy | PolicyRef,
    limits: Limits | None = None,
    forwarding: Forwarding | None = None,
) -> Middleware:
    """``limits``: none by default (``Limits.of(service)`` is the worker's)."""
    ref = policy if isinstance(policy, PolicyRef) else PolicyRef(policy)
    applied = limits if limits is not None else Limits()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            return _refusal(413, {"error": "request bodies are not accepted"}).response
        if request.path in PROBE_PATHS or ui.is_ui_path(request.path):
            # kubelet probes (streams/http/probes.py) and the inspector's static files
            # (no data: the page asks for a token): no token
            return await handler(request)
        # The policy is read once: a reload mid-request never mixes two policies.
        match _admission(request, ref.policy, applied, forwarding):
            case Refusal(response):
                return response
            case Operator():
                return await handler(request)
            case Caller(principal):
                request[PRINCIPAL] = principal
                return await _answered(request, handler, principal, applied)

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
    except StoreReadTimedOut:
        return web.json_response(
            {"error": READ_TIMED_OUT}, status=503, headers={"Retry-After": "1"}
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
