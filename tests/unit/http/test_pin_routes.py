"""``POST /conversations/{id}/messages/{message_id}/pin`` and ``/unpin``: an
operator pins a stored message without re-sending it (issue 28); admin scope
only, no body, stored at once, 404 for a message the conversation does not hold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.ports.storage import IncomingMessage
from tests.support.plans import msg
from tests.unit.http.test_http_security import ACME, ADMIN, SECURED, Site, bearer, settings

pytestmark = pytest.mark.unit


@pytest.fixture
async def site() -> AsyncIterator[tuple[Site, TestClient[Any, Any]]]:
    served = Site(settings(**SECURED, auth_failures_per_second=0))
    stored = msg(0, "the contract terms", conversation_id="acme/c-1").model_copy(
        update={"id": "m-1"}
    )
    await served.store.ingest.save_messages([IncomingMessage(stored, 40)])
    async with TestClient(TestServer(served.app.web.web_app)) as client:  # type: ignore[attr-defined]
        yield served, client


async def pinned_ids(site: Site) -> set[str]:
    history = await site.store.history.load_history("acme/c-1")
    return {m.id for m in history if m.pinned}


async def test_an_admin_pins_and_unpins_a_stored_message(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    served, client = site
    (message_id,) = [m.id for m in await served.store.history.load_history("acme/c-1")]
    path = f"/conversations/c-1/messages/{message_id}"
    response = await client.post(f"{path}/pin?tenant_id=acme", headers=bearer(ADMIN))
    assert response.status == 200
    body = await response.json()
    assert (body["pinned"], body["pinned_tokens"], body["tenant_id"]) == (True, 40, "acme")
    assert await pinned_ids(served) == {message_id}
    again = await client.post(f"{path}/pin?tenant_id=acme", headers=bearer(ADMIN))
    assert again.status == 200 and (await again.json())["pinned_tokens"] == 40  # idempotent
    response = await client.post(f"{path}/unpin?tenant_id=acme", headers=bearer(ADMIN))
    assert response.status == 200
    assert (await response.json())["pinned_tokens"] == 0
    assert await pinned_ids(served) == set()


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/conversations/c-1/messages/{id}/pin?tenant_id=acme", {}, 401),
        ("/conversations/c-1/messages/{id}/pin?tenant_id=acme", bearer(ACME), 403),
        ("/conversations/c-1/messages/{id}/pin?tenant_id=a/b", bearer(ADMIN), 400),
        ("/conversations/c-1/messages/nope/pin?tenant_id=acme", bearer(ADMIN), 404),
        ("/conversations/c-1/messages/{id}/pin", bearer(ADMIN), 404),  # no tenant: not it
    ],
)
async def test_refusals_pin_nothing(
    site: tuple[Site, TestClient[Any, Any]], path: str, headers: dict[str, str], status: int
) -> None:
    served, client = site
    (message_id,) = [m.id for m in await served.store.history.load_history("acme/c-1")]
    response = await client.post(path.replace("{id}", message_id), headers=headers)
    assert response.status == status
    assert await pinned_ids(served) == set()


async def test_a_body_is_refused_and_get_is_not_allowed(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    served, client = site
    (message_id,) = [m.id for m in await served.store.history.load_history("acme/c-1")]
    path = f"/conversations/c-1/messages/{message_id}/pin?tenant_id=acme"
    response = await client.post(path, data=b'{"pinned": true}', headers=bearer(ADMIN))
    assert response.status == 413
    response = await client.get(path, headers=bearer(ADMIN))
    assert response.status == 405
    assert await pinned_ids(served) == set()
