"""``POST /conversations/{id}/recompact`` and ``/restore``: admin scope only, no body,
the request on the control topic (issue 18, part 2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.ports.storage import IncomingMessage
from streams.events import CONTROL_EVENT, RecompactRequest, RestoreRequest
from tests.support.memory_store import RecordingPublisher
from tests.support.plans import msg
from tests.unit.http.test_http_security import ACME, ADMIN, SECURED, Site, bearer, settings

pytestmark = pytest.mark.unit


@pytest.fixture
async def site() -> AsyncIterator[tuple[Site, TestClient[Any, Any]]]:
    served = Site(settings(**SECURED, auth_failures_per_second=0))
    async with TestClient(TestServer(served.app.web.web_app)) as client:  # type: ignore[attr-defined]
        yield served, client


def sent(site: Site) -> list[Any]:
    publisher = site.components.requests._publisher
    assert isinstance(publisher, RecordingPublisher)
    return [CONTROL_EVENT.validate_json(p.value or b"") for p in publisher.on("control")]


async def test_an_admin_asks_for_a_recompact_and_it_goes_to_the_control_topic(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    served, client = site
    response = await client.post(
        "/conversations/c-1/recompact?tenant_id=acme&request_id=r-7", headers=bearer(ADMIN)
    )
    assert response.status == 202
    body = await response.json()
    assert (body["action"], body["request_id"], body["tenant_id"]) == ("recompact", "r-7", "acme")
    (event,) = sent(served)
    assert isinstance(event, RecompactRequest)
    assert (event.conversation_key, event.request_id) == ("acme/c-1", "r-7")
    assert event.requester.startswith("http:")


async def test_a_restore_names_its_batch_and_gets_a_request_id_when_none_is_given(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    served, client = site
    response = await client.post("/conversations/c-1/restore?batch_id=b-1", headers=bearer(ADMIN))
    assert response.status == 202
    (event,) = sent(served)
    assert isinstance(event, RestoreRequest)
    assert event.batch_id == "b-1" and event.request_id == (await response.json())["request_id"]


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/conversations/c-1/recompact", {}, 401),
        ("/conversations/c-1/recompact", bearer(ACME), 403),  # a tenant token: never admin
        ("/conversations/c-1/restore?tenant_id=acme", bearer(ACME), 403),
        ("/conversations/c-1/recompact?batch_id=b-1", bearer(ADMIN), 400),
        ("/conversations/c-1/restore?tenant_id=a/b", bearer(ADMIN), 400),
        ("/conversations/c-1/restore?request_id=" + "x" * 300, bearer(ADMIN), 400),
    ],
)
async def test_refusals_send_nothing(
    site: tuple[Site, TestClient[Any, Any]], path: str, headers: dict[str, str], status: int
) -> None:
    served, client = site
    response = await client.post(path, headers=headers)
    assert response.status == status
    assert sent(served) == []


async def test_a_body_is_refused_before_anything_else_and_get_is_not_allowed(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    served, client = site
    response = await client.post(
        "/conversations/c-1/recompact", data=b'{"x": 1}', headers=bearer(ADMIN)
    )
    assert response.status == 413
    response = await client.get("/conversations/c-1/recompact", headers=bearer(ADMIN))
    assert response.status == 405
    response = await client.post("/memory/search?q=x", headers=bearer(ACME))
    assert response.status == 403  # every POST needs the admin scope
    assert sent(served) == []


async def test_a_recompact_whose_pinned_messages_alone_exceed_the_budget_is_409(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    """No recompact can fit it: said at once, nothing sent (issue 28)."""
    served, client = site
    pinned = msg(0, "keep this", conversation_id="acme/c-1").model_copy(update={"pinned": True})
    budget = served.store.compactions  # the role the route asks
    await served.store.ingest.save_messages([IncomingMessage(pinned, 10**9)])
    assert await budget.pinned_tokens("acme/c-1") == 10**9
    response = await client.post(
        "/conversations/c-1/recompact?tenant_id=acme", headers=bearer(ADMIN)
    )
    assert response.status == 409
    assert "pinned messages alone" in (await response.json())["error"]
    assert sent(served) == []
    assert await budget.set_pinned("acme/c-1", pinned.id, False)
    response = await client.post(
        "/conversations/c-1/recompact?tenant_id=acme", headers=bearer(ADMIN)
    )
    assert response.status == 202
