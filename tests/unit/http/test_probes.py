"""``/livez`` and ``/readyz`` (streams/http/probes.py) on a Faust app that is never started.

The worker's real views (``register_views``, so the guard runs too) served by
aiohttp's test server, as in test_http_security.py; the runtime's ``is_open``,
the app's recovery flag and the consumer's assignment are set by each test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import faust
import pytest
from aiohttp.test_utils import TestClient, TestServer
from faust.types import TP

from core.ports.storage import StoreReadTimedOut, StoreUnavailable
from core.settings import Settings, parse_settings
from streams.http.probes import agent_state, liveness, register_probes
from streams.http.views import register_views
from streams.worker.components import Components
from tests.support.memory_store import InMemoryStore
from tests.unit.http.views_over_memory import ViewRuntime, components_over

pytestmark = pytest.mark.unit

ADMIN = "admin-token-0123456789abcdef"
METRICS = "metrics-token-0123456789abcdef"


def settings(**service: Any) -> Settings:
    return parse_settings(
        {
            "kafka": {"topic_prefix": "t."},
            "service": {"api_tokens": [ADMIN], "metrics_token": METRICS, **service},
        }
    )


class Site:
    def __init__(self, config: Settings) -> None:
        self.store = InMemoryStore()
        self.components: Components[int] = components_over(self.store, config)
        self.app = faust.App(f"probe-test-{id(self)}", broker="kafka://127.0.0.1:1", web_port=6999)
        self.runtime = ViewRuntime(self.store, is_open=False)
        self.assigned: set[TP] = set()
        self.app.consumer.assignment = lambda: set(self.assigned)  # type: ignore[method-assign]

    def all_ready(self) -> None:
        self.runtime.is_open = True
        self.app.in_recovery = False
        self.assigned = {TP("t.messages", 0), TP("t.commands", 0)}


@pytest.fixture
async def site() -> AsyncIterator[tuple[Site, TestClient[Any, Any]]]:
    found = Site(settings())
    register_views(found.app, settings(), found.components, found.runtime)
    async with TestClient(TestServer(found.app.web.web_app)) as client:  # type: ignore[attr-defined]
        yield found, client


async def get(client: TestClient[Any, Any], path: str) -> tuple[int, dict[str, Any]]:
    response = await client.get(path)
    return response.status, await response.json()


# -- /livez --------------------------------------------------------------------------


async def test_livez_answers_200_while_the_database_is_down(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    found, client = site
    # Not open at all (PostgreSQL never answered) …
    status, body = await get(client, "/livez")
    assert status == 200, body
    assert body["status"] == "alive"
    # … and open, but every store call failing.
    found.runtime.is_open = True
    found.store.fail_times("compaction_applied", 10)
    status, body = await get(client, "/livez")
    assert status == 200, body
    # Never touches the database: the outage it was set up with is all still there.
    assert found.store.outage == {"compaction_applied": 10}


async def test_livez_and_readyz_need_no_token_while_healthz_still_does(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    _, client = site
    assert (await client.get("/healthz")).status == 401
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/livez")).status == 200
    assert (await client.get("/readyz")).status == 503  # not 401: answered, just not ready
    # A body is still refused (the guard's first check).
    assert (await client.get("/livez", data=b"x")).status == 413


class FakeTask:
    def __init__(self, done: bool) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done


class FakeActor:
    def __init__(self, done: bool) -> None:
        self.actor_task = FakeTask(done)


class FakeAgent:
    def __init__(
        self,
        *,
        started: bool = True,
        crashed: bool = False,
        stopped: bool = False,
        actors: tuple[bool, ...] = (False,),
    ) -> None:
        self.started = started
        self.crashed = crashed
        self.should_stop = crashed or stopped
        self._actors = {FakeActor(done) for done in actors}


def test_agent_states() -> None:
    assert agent_state(FakeAgent()) == "running"
    assert agent_state(FakeAgent(actors=(True, False))) == "running"
    assert agent_state(FakeAgent(started=False, actors=())) == "starting"
    assert agent_state(FakeAgent(actors=())) == "starting"  # started, actors not yet made
    assert agent_state(FakeAgent(actors=(True,))) == "exited"
    assert agent_state(FakeAgent(crashed=True)) == "crashed"
    assert agent_state(FakeAgent(stopped=True)) == "stopped"


async def test_livez_is_503_when_an_agent_is_dead(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    found, client = site
    found.app.agents["ok"] = FakeAgent()  # type: ignore[assignment]
    status, body = await get(client, "/livez")
    assert status == 200 and body["agents"]["ok"] == "running"
    found.app.agents["gone"] = FakeAgent(actors=(True,))  # type: ignore[assignment]
    status, body = await get(client, "/livez")
    assert status == 503
    assert body["reasons"] == ["agent gone is exited"]


def test_a_real_agent_that_has_not_started_is_starting() -> None:
    app = faust.App("probe-agents", broker="kafka://127.0.0.1:1")

    @app.agent()
    async def idle(stream: Any) -> None:
        async for _ in stream:
            pass

    alive, body = liveness(app)
    assert alive and set(body["agents"].values()) == {"starting"}


# -- /readyz -------------------------------------------------------------------------


async def test_readyz_is_200_when_every_condition_holds(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    found, client = site
    found.all_ready()
    status, body = await get(client, "/readyz")
    assert status == 200, body
    assert body == {
        "status": "ready",
        "reasons": [],
        "assigned_partitions": 2,
        "degraded": False,
    }
    # The database was asked: its outage makes the same probe 503, then it is back.
    found.store.fail_times("compaction_applied", 1)
    assert (await get(client, "/readyz"))[0] == 503
    assert (await get(client, "/readyz"))[0] == 200


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("not_open", "runtime not open"),
        ("recovering", "table recovery in progress"),
        ("unassigned", "no partitions assigned"),
        ("database_down", "database: StoreUnavailable"),
    ],
)
async def test_readyz_is_503_with_the_reason(
    site: tuple[Site, TestClient[Any, Any]], breakage: str, reason: str
) -> None:
    found, client = site
    found.all_ready()
    if breakage == "not_open":
        found.runtime.is_open = False
    elif breakage == "recovering":
        found.app.in_recovery = True
    elif breakage == "unassigned":
        found.assigned = set()
    else:
        found.store.fail_times("compaction_applied", 1)
    status, body = await get(client, "/readyz")
    assert status == 503, body
    assert body["status"] == "not ready"
    assert len(body["reasons"]) == 1 and body["reasons"][0].startswith(reason), body


async def test_readyz_reports_every_reason_at_once_and_never_an_error_message(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    found, client = site
    found.app.in_recovery = True
    status, body = await get(client, "/readyz")
    assert status == 503
    assert [r.split(":")[0] for r in body["reasons"]] == [
        "runtime not open",
        "table recovery in progress",
        "no partitions assigned",
    ]
    found.all_ready()
    found.store.fail_next["compaction_applied"] = StoreUnavailable("host db-7.internal refused")
    status, body = await get(client, "/readyz")
    assert status == 503
    assert "db-7" not in str(body)


async def test_readyz_times_out_on_a_database_that_does_not_answer() -> None:
    found = Site(settings())
    register_probes(found.app, found.components, found.runtime, db_timeout=0.05)
    found.all_ready()

    async def hangs(compaction_id: str) -> bool:
        await asyncio.sleep(10)
        return False

    found.store.compactions.compaction_applied = hangs  # type: ignore[method-assign]
    async with TestClient(TestServer(found.app.web.web_app)) as client:  # type: ignore[attr-defined]
        status, body = await get(client, "/readyz")
    assert status == 503
    assert body["reasons"] == ["database: no answer within 0.05s"]


# -- a data view while the store is away ------------------------------------------------


async def test_a_read_while_the_store_is_unavailable_is_503_with_retry_after(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    """Before the runtime opens (start-up) or during an outage: a 503 the client may
    retry, never a 500 (the worker waits such outages out)."""
    found, client = site
    headers = {"Authorization": f"Bearer {ADMIN}"}
    response = await client.get("/conversations/c1/history", headers=headers)
    assert response.status == 503, await response.text()
    assert response.headers["Retry-After"] == "5"
    assert (await response.json())["error"].startswith("the store is unavailable")
    found.runtime.is_open = True
    response = await client.get("/conversations/c1/history", headers=headers)
    assert response.status == 404  # open: an unknown conversation, answered


async def test_a_read_past_the_statement_timeout_is_503_naming_it(
    site: tuple[Site, TestClient[Any, Any]],
) -> None:
    """A read PostgreSQL cancelled for its statement timeout (the read pool's):
    a 503 that says so and which setting bounds it, never a 500 with a stack."""
    found, client = site
    found.runtime.is_open = True

    async def cancelled(*args: Any, **kwargs: Any) -> Any:
        raise StoreReadTimedOut("canceling statement due to statement timeout")

    found.store.history.load_history = cancelled  # type: ignore[method-assign]
    headers = {"Authorization": f"Bearer {ADMIN}"}
    response = await client.get("/conversations/c1/history", headers=headers)
    assert response.status == 503, await response.text()
    assert response.headers["Retry-After"] == "1"
    error = (await response.json())["error"]
    assert "statement timeout" in error and "read_statement_timeout_seconds" in error
