"""``GET /tenants/{tenant}/usage`` over the in-memory ports: who may read whose usage.

The worker's real views (``test_http_security.Site``) after two tenants'
compactions: a tenant's token reads its own tenant's usage, never another's;
an admin token reads any; bad input is a 400 naming it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.http.test_http_security import (
    ACME,
    ADMIN,
    GLOBEX,
    SECURED,
    Site,
    bearer,
    compacted_site,
    settings,
)

pytestmark = pytest.mark.unit


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    site: Site = await compacted_site(settings(**SECURED, auth_failures_per_second=0))
    async with TestClient(TestServer(site.app.web.web_app)) as served:  # type: ignore[attr-defined]
        yield served


async def test_a_tenant_reads_its_own_usage_and_an_admin_any(
    client: TestClient[Any, Any],
) -> None:
    for tenant, token in (("acme", ACME), ("globex", GLOBEX), ("acme", ADMIN)):
        response = await client.get(f"/tenants/{tenant}/usage", headers=bearer(token))
        assert response.status == 200, await response.text()
        body = await response.json()
        assert body["tenant_id"] == tenant
        assert body["total"]["compactions"] == 2  # its two conversations, compacted once each
        assert [day["tenant_id"] for day in body["days"]] == [tenant]
    for tenant, token in (("globex", ACME), ("acme", GLOBEX)):
        response = await client.get(f"/tenants/{tenant}/usage", headers=bearer(token))
        assert response.status == 403
        assert "compactions" not in await response.text()
    assert (await client.get("/tenants/acme/usage")).status == 401


async def test_bad_input_is_a_400_naming_it(client: TestClient[Any, Any]) -> None:
    response = await client.get("/tenants/not%20a%20tenant/usage", headers=bearer(ADMIN))
    assert response.status == 400 and "tenant" in (await response.json())["error"]
    response = await client.get("/tenants/acme/usage?since=yesterday", headers=bearer(ADMIN))
    assert response.status == 400 and "since" in (await response.json())["error"]
    response = await client.get("/tenants/acme/usage?since=2099-01-01", headers=bearer(ADMIN))
    assert response.status == 200 and (await response.json())["total"]["compactions"] == 0
