"""What a request may address, once the guard admitted it: shared by every view.

The guard (``streams.http.guard``) leaves the authenticated ``Principal`` on
the request; the views (``views``, ``redo``, ``usage``) read it here, check
their path ids and ``tenant_id`` the same way, and answer their refusals with
the same bodies. Kept apart from the views so that no view module imports
another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from aiohttp import web
from faust.web import Request, Response, View
from pydantic import BaseModel

from core.domain.tenancy import conversation_key, is_tenant_id
from core.ports.storage import ReadScope
from streams.events import MAX_ID_LENGTH
from streams.http import bodies
from streams.http.auth import Principal
from streams.http.forwarding import PRINCIPAL

# A request that somehow skipped the guard reads nothing (no tenant matches "").
_NOBODY = Principal(tenant="")


def json_body(model: BaseModel) -> dict[str, Any]:
    """A body as the views send it: every field, in JSON types."""
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped


FORBIDDEN = json_body(bodies.FORBIDDEN)
UNAUTHORIZED = json_body(bodies.UNAUTHORIZED)


def problem_response(view: View, found: bodies.Problem | str, status: int) -> Response:
    """An error answer: a ``bodies.Problem`` (or its text) with ``status``."""
    model = bodies.Problem(error=found) if isinstance(found, str) else found
    return view.json(json_body(model), status=status)


class Forbidden(Exception):
    """The caller's token may not read what it asked for (403)."""


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


def principal_of(request: Request) -> Principal:
    """The caller the guard admitted (or nobody, for a request it never saw)."""
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


def addressed(view: View, request: Request, *ids: str) -> Response | str:
    """The conversation key a view's path (and ``tenant_id``) names for the caller,
    or the refusal: 400 for a bad path id or tenant id, 403 for a tenant the
    token is not bound to. A tenant-bound token names its own tenant's
    conversations only, so it cannot even address another's."""
    for name, value in zip(("conversation_id", "batch_id"), ids, strict=False):
        problem = bad_text(name, value, MAX_ID_LENGTH)
        if problem is not None:
            return problem_response(view, problem, 400)
    try:
        tenant = requested_tenant(request.query, principal_of(request))
    except ValueError as error:
        return problem_response(view, str(error), 400)
    except Forbidden:
        return problem_response(view, bodies.FORBIDDEN, 403)
    return conversation_key(tenant, ids[0])
