"""The audit log of HTTP reads: one JSON object per line on ``compactor.audit``.

Every request to a data view (everything but ``/healthz`` and ``/metrics``)
is logged once, after its answer is known, by ``audit_reads``, the outermost
middleware, so refusals (401, 403, 413, 400) are logged as well as reads:

    {"time": "...", "logger": "compactor.audit", "event": "http_read",
     "token_id": "tok-3f2a…", "tenant": "acme", "scope": "tenant",
     "method": "GET", "route": "/conversations/{conversation_id}/history",
     "conversation_id": "c-42", "status": 200}

``token_id`` names the token by a hash (``tok-`` and 12 hex digits of a
SHA-256 over the token's SHA-256: the token cannot be recovered from it),
also for a token that was refused, so probing shows in the log; ``-`` when
no bearer token was presented. ``route`` is the route's pattern, not the
path; ``conversation_id`` is the path's or the search's parameter. Never
logged: the token, the query text (``q``), any content, any other parameter.

The lines are written by python-json-logger to stderr (``install``), and not
passed on to the root logger: ship them from there, or attach another
handler to ``compactor.audit``. A request Faust forwards to the worker that
owns the conversation is logged by both workers.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Callable
from typing import IO, Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from streams.http.auth import OPEN_PATHS, Principal, bearer
from streams.http.probes import PROBE_PATHS
from streams.logs import json_formatter

AUDIT_LOGGER = "compactor.audit"
log = logging.getLogger(AUDIT_LOGGER)

# An id longer than the views accept is cut to this in the log line.
_MAX_LOGGED_ID = 256
NO_TOKEN = "-"


def token_id(token: bytes) -> str:
    """A name for a presented token that reveals nothing of it (the same name
    ``streams.http.auth`` gives a configured token)."""
    digest = hashlib.sha256(token).digest()
    return "tok-" + hashlib.sha256(b"compactor token id:" + digest).hexdigest()[:12]


def formatter() -> logging.Formatter:
    """One JSON object per line: time, logger, event and the record's fields."""
    return json_formatter(message_key="event", level=False)


def install(stream: IO[str] | None = None) -> logging.Handler:
    """Give ``compactor.audit`` its JSON handler once (stderr unless ``stream``);
    the handler it has. Idempotent: every worker's views call it."""
    for handler in log.handlers:
        if getattr(handler, "compactor_audit", False):
            return handler
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter())
    handler.compactor_audit = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return handler


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "(no route)"


def _short(value: str | None) -> str | None:
    return None if value is None else value[:_MAX_LOGGED_ID]


def read_fields(request: web.Request, principal: Principal | None, status: int) -> dict[str, Any]:
    """The audit line of one request (what ``audit_reads`` logs)."""
    if principal is not None:
        who = principal.token_id
    else:
        presented = bearer(request.headers.get("Authorization"))
        who = NO_TOKEN if presented is None else token_id(presented)
    conversation = request.match_info.get("conversation_id") or request.query.get("conversation_id")
    scope = None if principal is None else "all" if principal.tenant is None else "tenant"
    tenant = None if principal is None else principal.tenant
    return {
        "token_id": who,
        "tenant": tenant,
        "scope": scope,
        "method": request.method,
        "route": _route(request),
        "conversation_id": _short(conversation),
        # The conversation's tenant (a conversation is its tenant and its id): a
        # tenant token's own, else the tenant_id the request named.
        "conversation_tenant": _short(tenant or request.query.get("tenant_id")),
        "status": status,
    }


def audit_reads(principal_of: Callable[[web.Request], Principal | None]) -> Middleware:
    """The outermost middleware: logs every data view's request with its status.

    ``principal_of`` gives the principal the guard authenticated (None when it
    did not: a 401, a 413).
    """
    install()

    @web.middleware
    async def audited(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.path in PROBE_PATHS:  # not reads of data
            return await handler(request)
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as error:
            status = error.status
            raise
        finally:
            log.info("http_read", extra=read_fields(request, principal_of(request), status))

    return audited
