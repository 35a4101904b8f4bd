"""HTTP security against in-memory ports: tokens, tenants, bounded inputs, fuzz.

The worker's real views (``streams.http.views.register_views``) on a Faust app that is
never started, served by aiohttp's test server: the guard middleware, the
tenant checks and the input bounds run exactly as in a worker.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import faust
import pytest
from aiohttp.test_utils import TestClient, TestServer
from faust.exceptions import SameNode

from core.domain.compaction import StoredBatch
from core.domain.tenancy import ConversationRef, tenant_of
from core.settings import ConfigError, Settings, parse_settings
from streams.events import MessageEvent
from streams.http.access import Forbidden
from streams.http.auth import AuthPolicy, Principal, check_exposure, env_tokens
from streams.http.pins import register_pins
from streams.http.redo import StorePinnedBudget, register_redo
from streams.http.search import search_request
from streams.http.views import register_views
from streams.worker.components import Components
from streams.worker.records import Record
from tests.support.builders import T0
from tests.support.memory_store import InMemoryStore, RecordingPublisher
from tests.unit.http.views_over_memory import ViewRuntime, components_over

pytestmark = pytest.mark.unit

ADMIN = "admin-token-0123456789abcdef"
ACME = "acme-token-0123456789abcdef"
GLOBEX = "globex-token-0123456789abcdef"
METRICS = "metrics-token-0123456789abcdef"


def settings(**service: Any) -> Settings:
    return parse_settings(
        {
            "budget": {"context_budget": 0.5, "model_max_tokens": 400},
            "kafka": {"topic_prefix": "t."},
            "summarization": {"keep_recent": 2, "chunk_size": 4, "retry_backoff_seconds": 0},
            "service": {"command_timeout_seconds": 60, **service},
        }
    )


SECURED = {
    "api_tokens": [ADMIN],
    "tokens": [{"token": ACME, "tenant": "acme"}, {"token": GLOBEX, "tenant": "globex"}],
}


class Site:
    def __init__(self, config: Settings) -> None:
        self.store = InMemoryStore()
        self.publisher = RecordingPublisher()
        self.components: Components[int] = components_over(self.store, config, self.publisher)
        self.app = faust.App(f"web-test-{id(self)}", broker="kafka://127.0.0.1:1", web_port=6999)

        async def same_node(*args: Any, **kwargs: Any) -> Any:
            raise SameNode()

        self.app.router.route_topic_req = same_node  # type: ignore[method-assign]
        register_views(self.app, config, self.components, ViewRuntime(self.store))
        pinned = StorePinnedBudget(self.store, config.budget.budget_tokens)
        register_redo(self.app, self.components, pinned)  # the admin's POST routes, as a worker has
        register_pins(self.app, self.store, config.budget.budget_tokens, self.components.metrics)
        self.offset = 0

    async def message(
        self, conversation: str, index: int, content: str, tenant: str | None
    ) -> None:
        event = MessageEvent(
            message_id=f"{conversation}-m{index:04d}",
            conversation_id=conversation,
            role="user" if index % 2 == 0 else "assistant",
            content=content,
            created_at=T0 + timedelta(seconds=index),
            tenant_id=tenant,
        )
        self.offset += 1
        record = Record(
            "t.messages", 0, self.offset, conversation.encode(), event.model_dump_json().encode()
        )
        await self.components.accounting.handle(record)


async def compacted_site(config: Settings) -> Site:
    """Two tenants, two conversations each, compacted so that memory has batches."""
    site = Site(config)
    for tenant in ("acme", "globex"):
        for n in range(2):
            conversation = f"{tenant}-c{n}"
            for i in range(40):
                words = " ".join(f"{tenant}secret{i} word{j}." for j in range(12))
                await site.message(conversation, i, words, tenant)
    for command in [p for p in site.publisher.sent if p.topic == "commands"]:
        from streams.events import CompactionCommand

        parsed = CompactionCommand.model_validate_json(command.value or b"")
        await site.components.processor.compact(parsed)
    return site


@pytest.fixture
async def secured() -> AsyncIterator[tuple[Site, TestClient[Any, Any]]]:
    # No limit on failed authentications here: these tests fail hundreds on purpose
    # (test_failed_authentications_are_slowed_down tests the limit).
    site = await compacted_site(
        settings(**SECURED, metrics_token=METRICS, auth_failures_per_second=0)
    )
    async with TestClient(TestServer(site.app.web.web_app)) as client:  # type: ignore[attr-defined]
        yield site, client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- tokens --------------------------------------------------------------------------


def test_no_tokens_lets_everyone_in_and_any_token_in_when_configured() -> None:
    assert AuthPolicy.of(settings().service, {}).authenticate(None) == Principal(None)
    policy = AuthPolicy.of(settings(**SECURED).service, {})
    assert policy.authenticate(None) is None
    assert policy.authenticate("Bearer nope-nope-nope-nope-nope") is None
    assert policy.authenticate(f"Basic {ADMIN}") is None
    assert policy.authenticate("Bearer " + "x" * 5000) is None
    assert policy.authenticate("Bearer ünïcödé-token-value-xx") is None
    assert policy.authenticate(f"Bearer {ADMIN}") == Principal(None)
    assert policy.authenticate(f"bearer  {ACME} ") == Principal("acme")


def test_tokens_from_the_environment_are_added_and_a_bad_one_is_not_echoed() -> None:
    env = {"COMPACTOR_API_TOKENS": f" {GLOBEX}, second-token-0123456789 ,"}
    policy = AuthPolicy.of(settings().service, env)
    assert policy.enabled
    assert policy.authenticate("Bearer second-token-0123456789") == Principal(None)
    with pytest.raises(ConfigError) as error:
        env_tokens({"COMPACTOR_API_TOKENS": "tiny-secret"})
    assert "tiny-secret" not in str(error.value)


def test_a_bad_token_in_the_config_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as error:
        settings(api_tokens=["short-secret"])
    assert "short-secret" not in str(error.value)
    with pytest.raises(ConfigError) as error:
        settings(tokens=[{"token": "short-secret2", "tenant": "acme"}])
    assert "short-secret2" not in str(error.value)


def test_secrets_are_not_in_the_repr_of_settings() -> None:
    config = settings(**SECURED, metrics_token=METRICS)
    text = repr(config) + str(config) + repr(config.service)
    for secret in (ADMIN, ACME, GLOBEX, METRICS):
        assert secret not in text


def test_no_token_and_a_public_address_is_refused_unless_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for host in ("0.0.0.0", "", "10.1.2.3", "worker.example"):
        config = settings(web_host=host).service
        with pytest.raises(ConfigError, match="allow_unauthenticated"):
            check_exposure(config, AuthPolicy.of(config, {}))
    allowed = settings(web_host="0.0.0.0", allow_unauthenticated=True).service
    with caplog.at_level(logging.WARNING, logger="compactor.auth"):
        check_exposure(allowed, AuthPolicy.of(allowed, {}))
        loopback = settings(web_host="127.0.0.1").service
        check_exposure(loopback, AuthPolicy.of(loopback, {}))
        for host in ("::1", "localhost"):
            check_exposure(settings(web_host=host).service, AuthPolicy.of(loopback, {}))
    assert sum("UNAUTHENTICATED" in r.getMessage() for r in caplog.records) == 4
    public = settings(web_host="0.0.0.0", **SECURED, tls_certfile="c.pem").service
    check_exposure(public, AuthPolicy.of(public, {}))  # tokens over TLS: fine


def test_tokens_over_plain_http_beyond_loopback_are_refused_unless_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bearer token sent in clear text is given to whoever is on the path."""
    tokens: list[dict[str, Any]] = [
        SECURED,
        # the scraper's token is a credential too (open data views need their own opt-in)
        {"metrics_token": METRICS, "allow_unauthenticated": True},
        {"tokens": [{"token": ACME, "tenant": "acme"}]},
    ]
    for host in ("0.0.0.0", "", "10.1.2.3", "worker.example"):
        for configured in tokens:
            service = settings(web_host=host, **configured).service
            with pytest.raises(ConfigError, match=r"allow_plaintext_http") as refused:
                check_exposure(service, AuthPolicy.of(service, {}))
            assert "[service].tls_certfile" in str(refused.value)
        # a token from the environment counts the same
        bare = settings(web_host=host).service
        with pytest.raises(ConfigError, match=r"allow_plaintext_http"):
            check_exposure(bare, AuthPolicy.of(bare, {"COMPACTOR_API_TOKENS": ADMIN}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compactor.auth"):
        for host in ("127.0.0.1", "::1", "localhost"):  # loopback: nothing to say
            service = settings(web_host=host, **SECURED).service
            check_exposure(service, AuthPolicy.of(service, {}))
        assert not caplog.records
        tls = settings(web_host="0.0.0.0", tls_certfile="c.pem", tls_keyfile="k", **SECURED)
        check_exposure(tls.service, AuthPolicy.of(tls.service, {}))
        assert not caplog.records
        opted = settings(web_host="0.0.0.0", allow_plaintext_http=True, **SECURED).service
        check_exposure(opted, AuthPolicy.of(opted, {}))
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING and "PLAINTEXT HTTP" in warning.getMessage()
    assert ADMIN not in warning.getMessage()


def test_search_needs_a_scope_and_a_tenant_token_is_held_to_its_tenant() -> None:
    service = settings().service
    with pytest.raises(ValueError, match="allow_global_search"):
        search_request({"q": "x"}, Principal(None), service)
    assert search_request({"q": "x", "tenant_id": "a"}, Principal(None), service).tenant_id == "a"
    glob = settings(allow_global_search=True).service
    assert search_request({"q": "x"}, Principal(None), glob).tenant_id is None
    assert search_request({"q": "x"}, Principal("acme"), glob).tenant_id == "acme"
    with pytest.raises(Forbidden):
        search_request({"q": "x", "tenant_id": "globex"}, Principal("acme"), service)
    for bad in ({"q": "x" * 1001}, {"q": "x", "limit": "51"}, {"q": "x", "limit": "0"}):
        with pytest.raises(ValueError):
            search_request({"tenant_id": "a", **bad}, Principal(None), service)


# -- the views -------------------------------------------------------------------------

VIEWS = (
    "/conversations/{c}",
    "/conversations/{c}/history",
    "/conversations/{c}/batches/{b}",
)


def view_paths(batch: StoredBatch, *, tenant_param: bool) -> list[str]:
    """The views of ``batch``'s conversation, addressed by its producer's id (and,
    for a token that is not tenant-bound, its tenant as ``tenant_id``)."""
    ref = ConversationRef.of_key(batch.conversation_id)
    query = f"?tenant_id={ref.tenant_id}" if tenant_param and ref.tenant_id else ""
    return [v.format(c=ref.conversation_id, b=batch.id) + query for v in VIEWS]


async def test_every_view_but_operations_needs_a_token(
    secured: tuple[Site, TestClient[Any, Any]],
) -> None:
    site, client = secured
    batch = next(iter(site.store.batches.values()))
    paths = view_paths(batch, tenant_param=True)
    paths += ["/memory/search?q=word&tenant_id=acme", "/nowhere", "/table/conversations"]
    for path in paths:
        for headers in ({}, bearer("wrong-token-0123456789abc"), {"Authorization": ADMIN}):
            response = await client.get(path, headers=headers)
            assert response.status == 401, path
            body = await response.json()
            assert body == {"error": "unauthorized: a valid bearer token is required"}
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
    for path in paths[:4]:
        response = await client.get(path, headers=bearer(ADMIN))
        assert response.status == 200, (path, await response.text())
    for path in ("/healthz", "/metrics"):
        assert (await client.get(path)).status == 401
        assert (await client.get(path, headers=bearer(ADMIN))).status == 401
        assert (await client.get(path, headers=bearer(METRICS))).status == 200
    assert (await client.get("/healthz", headers=bearer(METRICS))).status == 200
    body = await (await client.get("/healthz", headers=bearer(METRICS))).text()
    for secret in (ADMIN, ACME, GLOBEX, METRICS):
        assert secret not in body


async def test_a_tenant_token_never_sees_another_tenants_data(
    secured: tuple[Site, TestClient[Any, Any]],
) -> None:
    site, client = secured
    for mine, theirs, token in (("acme", "globex", ACME), ("globex", "acme", GLOBEX)):
        own = [b for b in site.store.batches.values() if tenant_of(b.conversation_id) == mine]
        other = [b for b in site.store.batches.values() if tenant_of(b.conversation_id) == theirs]
        assert own and other
        for batch in other:
            # Its id names the caller's own tenant's conversation of that id: none here.
            for path in view_paths(batch, tenant_param=False):
                response = await client.get(path, headers=bearer(token))
                assert response.status == 404, path
                assert f"{theirs}secret" not in await response.text()
            # Naming the other tenant is refused outright.
            for path in view_paths(batch, tenant_param=False):
                response = await client.get(f"{path}?tenant_id={theirs}", headers=bearer(token))
                assert response.status == 403, path
                assert f"{theirs}secret" not in await response.text()
        for batch in own:
            for path in view_paths(batch, tenant_param=False):
                assert (await client.get(path, headers=bearer(token))).status == 200, path
            for path in view_paths(batch, tenant_param=True):  # its own tenant, named
                assert (await client.get(path, headers=bearer(token))).status == 200, path
        searches: list[dict[str, str]] = [
            {"q": f"{theirs}secret1 {mine}secret1 word1"},
            {"q": f"{theirs}secret1", "tenant_id": mine},
            {"q": "word1", "conversation_id": f"{theirs}-c0"},
        ]
        for params in searches:
            response = await client.get("/memory/search", params=params, headers=bearer(token))
            assert response.status == 200
            text = await response.text()
            assert f"{theirs}secret" not in text
            hits = (await response.json())["hits"]
            assert all(h["tenant_id"] == mine for h in hits)
        hits = (
            await (
                await client.get(
                    "/memory/search", params={"q": f"{mine}secret1"}, headers=bearer(token)
                )
            ).json()
        )["hits"]
        assert hits, "a tenant token finds its own memory"
        assert {h["conversation_id"] for h in hits} <= {f"{mine}-c0", f"{mine}-c1"}
        response = await client.get(
            "/memory/search", params={"q": "word1", "tenant_id": theirs}, headers=bearer(token)
        )
        assert response.status == 403
        for path in ("/table/conversations", "/router", "/"):
            assert (await client.get(path, headers=bearer(token))).status == 403


async def test_the_same_id_under_two_tenants_is_two_conversations() -> None:
    """Neither tenant can read, claim in advance or write into the other's: each
    message lands in its own tenant's conversation, and each token reads its own."""
    site = Site(settings(**SECURED, metrics_token=METRICS))
    await site.message("shared-1", 0, "globex got here first: globexonly", "globex")
    await site.message("shared-1", 1, "acme's own words: acmeonly", "acme")
    await site.message("shared-1", 2, "globex again: globexonly", "globex")
    published = site.publisher.sent
    assert not [p for p in published if p.topic == "dead_letters"]
    async with TestClient(TestServer(site.app.web.web_app)) as client:  # type: ignore[attr-defined]
        for token, mine, theirs, count in (
            (ACME, "acme", "globex", 1),
            (GLOBEX, "globex", "acme", 2),
        ):
            response = await client.get("/conversations/shared-1/history", headers=bearer(token))
            assert response.status == 200
            body = await response.json()
            assert (body["conversation_id"], body["tenant_id"]) == ("shared-1", mine)
            assert len(body["messages"]) == count
            assert all(m["conversation_id"] == "shared-1" for m in body["messages"])
            assert f"{theirs}only" not in await response.text()
            response = await client.get("/conversations/shared-1", headers=bearer(token))
            assert (await response.json())["message_count"] == count
        for tenant, count in (("acme", 1), ("globex", 2)):
            response = await client.get(
                f"/conversations/shared-1/history?tenant_id={tenant}", headers=bearer(ADMIN)
            )
            assert len((await response.json())["messages"]) == count
        response = await client.get("/conversations/shared-1/history", headers=bearer(ADMIN))
        assert response.status == 404  # no conversation "shared-1" without a tenant


async def test_failed_authentications_are_slowed_down() -> None:
    """A client address gets ``auth_failures_burst`` failed authentications, then a 429
    (before its token is looked at: a right token gets one too) until its bucket
    refills; other addresses and the probes are not affected."""
    site = Site(settings(**SECURED, auth_failures_per_second=0.01, auth_failures_burst=5))
    async with TestClient(TestServer(site.app.web.web_app)) as client:  # type: ignore[attr-defined]
        for _ in range(5):
            response = await client.get(
                "/conversations/c", headers=bearer("guess-0123456789abcdef")
            )
            assert response.status == 401
        response = await client.get("/conversations/c", headers=bearer("guess-0123456789abcdef"))
        assert response.status == 429
        assert int(response.headers["Retry-After"]) >= 1
        response = await client.get("/conversations/c", headers=bearer(ADMIN))
        assert response.status == 429
        assert (await client.get("/livez")).status == 200


async def test_admin_search_across_everything_needs_allow_global_search(
    secured: tuple[Site, TestClient[Any, Any]],
) -> None:
    _, client = secured
    response = await client.get("/memory/search", params={"q": "word1"}, headers=bearer(ADMIN))
    assert response.status == 400
    assert "allow_global_search" in (await response.json())["error"]


async def test_request_bodies_are_refused(secured: tuple[Site, TestClient[Any, Any]]) -> None:
    _, client = secured
    response = await client.get("/healthz", data=b"x" * 100, headers=bearer(METRICS))
    assert response.status == 413
    response = await client.post("/memory/search", data=b"{}", headers=bearer(ADMIN))
    assert response.status in (405, 413)


def _fuzz_values(rng: random.Random) -> list[str]:
    pieces = [
        "",
        "x" * 300,
        "y" * 20_000,
        "%00",
        "%ff%fe",
        "%ed%a0%80",
        "ü😀\u202e",
        "../../etc/passwd",
        "' OR 1=1 --",
        "a:b & !c | (d",
        "-1",
        "99999999999999999999",
        "1e3",
        "NaN",
    ]
    random_bytes = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    pieces.append("".join(f"%{b:02x}" for b in random_bytes))
    pieces.append("".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(1, 60))))
    return pieces


async def test_fuzzed_requests_never_get_a_server_error(
    secured: tuple[Site, TestClient[Any, Any]],
) -> None:
    _, client = secured
    rng = random.Random(10)
    from urllib.parse import quote

    seen: set[int] = set()
    for _ in range(40):
        values = _fuzz_values(rng)
        a, b = rng.choice(values), rng.choice(values)
        safe_a = a if "%" in a else quote(a, safe="")
        safe_b = b if "%" in b else quote(b, safe="")
        tenant = rng.choice(values)
        tenant_query = "" if rng.random() < 0.5 else f"?tenant_id={quote(tenant, safe='%')}"
        paths = [v.format(c=safe_a, b=safe_b) + tenant_query for v in VIEWS]
        query = "&".join(
            f"{name}={rng.choice(values) if '%' in rng.choice(values) else quote(rng.choice(values))}"
            for name in rng.sample(
                ["q", "limit", "sources", "mode", "conversation_id", "tenant_id"], 4
            )
        )
        paths.append(f"/memory/search?{query}")
        redo = [
            f"/conversations/{safe_a}/{action}?request_id={quote(b, safe='')}"
            f"&batch_id={quote(tenant, safe='')}"
            for action in ("recompact", "restore")
        ]
        for path in [*paths, *redo]:
            for token in (ADMIN, ACME):
                send = client.post if path in redo else client.get
                response = await send(path, headers=bearer(token))
                seen.add(response.status)
                assert response.status < 500, (path, response.status, await response.text())
    assert 400 in seen and 403 in seen
