"""``GET /tenants/{tenant}/usage``: what a tenant's compactions cost, by UTC day.

Open to a token with the admin scope, and to a tenant-bound token for its own
tenant. Read through the store's ``ReadScope`` like every view's read, so
row-level security (docs/security.md) holds beneath this view's own check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date
from typing import Any, Protocol

import faust
from faust.web import Request, Response, View

from core.domain.tenancy import is_tenant_id
from core.domain.usage import UsageDay
from core.ports.storage import ReadScope, UsageStore
from streams.http.access import FORBIDDEN, principal_of, read_scope
from streams.http.bodies import UsageReport, UsageTotals

USAGE_PATH = re.compile(r"^/tenants/[^/]+/usage$")
"""The one path of this module: the guard asks for the read scope, and the
view itself whether the token is the admin's or the tenant's own."""


class UsageRuntime(Protocol):
    """What the usage view reads of the runtime (``streams.worker.runtime``)."""

    @property
    def usage(self) -> UsageStore: ...


def usage_totals(days: Sequence[UsageDay]) -> dict[str, Any]:
    """The days summed (what `compactor usage` prints last)."""
    totals: dict[str, Any] = UsageTotals.of(days).model_dump(mode="json")
    return totals


def usage_body(tenant: str | None, since: date | None, days: Sequence[UsageDay]) -> dict[str, Any]:
    """The view's body (``streams.http.bodies.UsageReport``)."""
    body: dict[str, Any] = UsageReport.of(tenant, since, days).model_dump(mode="json")
    return body


def parse_since(raw: str | None) -> date | None:
    """``YYYY-MM-DD`` (a UTC day); ValueError says what is expected."""
    if raw is None:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise ValueError("since must be a day, YYYY-MM-DD") from None


def register_usage(app: faust.App, runtime: UsageRuntime) -> None:
    @app.page("/tenants/{tenant}/usage")
    class TenantUsage(View):
        async def get(self, request: Request, tenant: str) -> Response:
            principal = principal_of(request)
            if not is_tenant_id(tenant):
                return self.json(
                    {"error": "tenant (the path) must be 1 to 256 letters, digits or ._:@-"},
                    status=400,
                )
            if not (principal.allows("admin") or principal.tenant == tenant):
                return self.json(FORBIDDEN, status=403)
            try:
                since = parse_since(request.query.get("since"))
            except ValueError as error:
                return self.json({"error": str(error)}, status=400)
            scope: ReadScope = read_scope(principal)
            days = await runtime.usage.usage_by_day(scope=scope, tenant_id=tenant, since=since)
            return self.json(usage_body(tenant, since, days))
