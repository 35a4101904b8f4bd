"""Scopes, hashed tokens, duplicates, SIGHUP reload, rate limits, pages, forwarding
and HTTPS, on the worker's real views (``register_views``) over in-memory ports.

Like ``test_http_security.py``: a Faust app that is never started, served by
aiohttp's test server (or, for HTTPS, by Faust's own web server driver).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import faust
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler
from faust.exceptions import SameNode

from core.domain.tenancy import ConversationRef
from core.settings import ConfigError, Settings, parse_settings
from streams.events import CompactionCommand, MessageEvent
from streams.http.auth import AuthPolicy, Principal
from streams.http.forwarding import (
    PRINCIPAL_HEADER,
    SIGNATURE_HEADER,
    Forwarding,
    internal_key,
    node_of,
)
from streams.http.limits import RateLimiter
from streams.http.reload import watch_sighup
from streams.http.views import register_views
from streams.kafka.faust_app import create_app
from streams.worker.components import Components
from streams.worker.records import Record
from tests.support.builders import T0
from tests.support.memory_store import InMemoryStore, RecordingPublisher
from tests.unit.http.views_over_memory import ViewRuntime, components_over

pytestmark = pytest.mark.unit

ADMIN = "admin-token-0123456789abcdef"
ACME = "acme-token-0123456789abcdef"
GLOBEX = "globex-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
SEARCHER = "searcher-token-0123456789abcdef"
SCRAPER = "scraper-token-0123456789abcdef"
INTERNAL = "internal-token-0123456789abcdef"


def sha(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def settings(**service: Any) -> Settings:
    return parse_settings(
        {
            "budget": {"context_budget": 0.5, "model_max_tokens": 400},
            "kafka": {"topic_prefix": "t."},
            "summarization": {"keep_recent": 2, "chunk_size": 4, "retry_backoff_seconds": 0},
            "service": {"command_timeout_seconds": 60, **service},
        }
    )


SCOPED: dict[str, Any] = {
    "api_tokens": [ADMIN],
    "tokens": [
        {"token": ACME, "tenant": "acme"},
        {"token": GLOBEX, "tenant": "globex"},
        {"token": READER, "scopes": ["read"]},
        {"token": SEARCHER, "scopes": ["search"]},
        {"token": SCRAPER, "scopes": ["metrics"]},
    ],
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Worker:
    """One worker's views over an in-memory store; ``reload`` is what SIGHUP calls."""

    def __init__(
        self, config: Settings, app: faust.App | None = None, config_path: Path | None = None
    ) -> None:
        self.store = InMemoryStore()
        self.publisher = RecordingPublisher()
        self.components: Components[int] = components_over(self.store, config, self.publisher)
        self.app = app or faust.App(
            f"tokens-test-{id(self)}", broker="kafka://127.0.0.1:1", web_port=6999
        )

        async def same_node(*args: Any, **kwargs: Any) -> Any:
            raise SameNode()

        self.local = same_node
        self.app.router.external_topic_key_store = (  # type: ignore[method-assign]
            lambda *args: self.app.conf.canonical_url
        )
        self.reload: Callable[[], bool] = register_views(
            self.app, config, self.components, ViewRuntime(self.store), config_path
        )
        self.offset = 0

    @property
    def web_app(self) -> web.Application:
        return self.app.web.web_app  # type: ignore[attr-defined,no-any-return]

    async def message(self, conversation: str, index: int, tenant: str | None) -> None:
        event = MessageEvent(
            message_id=f"{conversation}-m{index:04d}",
            conversation_id=conversation,
            role="user" if index % 2 == 0 else "assistant",
            content=" ".join(f"{tenant}secret{index} word{j}." for j in range(12)),
            created_at=T0 + timedelta(seconds=index),
            tenant_id=tenant,
        )
        self.offset += 1
        record = Record(
            "t.messages", 0, self.offset, conversation.encode(), event.model_dump_json().encode()
        )
        await self.components.accounting.handle(record)

    async def compact_all(self) -> None:
        sent = self.publisher.sent
        for command in [p for p in sent if p.topic == "commands"]:
            parsed = CompactionCommand.model_validate_json(command.value or b"")
            await self.components.processor.compact(parsed)


@pytest.fixture
async def scoped() -> AsyncIterator[tuple[Worker, TestClient[Any, Any]]]:
    worker = Worker(settings(**SCOPED))
    for tenant in ("acme", "globex"):
        for i in range(40):
            await worker.message(f"{tenant}-c0", i, tenant)
    await worker.compact_all()
    async with TestClient(TestServer(worker.web_app)) as client:
        yield worker, client


# -- scopes ---------------------------------------------------------------------------


async def test_each_route_needs_its_scope(scoped: tuple[Worker, TestClient[Any, Any]]) -> None:
    worker, client = scoped
    batch = next(b for b in worker.store.batches.values() if b.conversation_id == "acme/acme-c0")
    read_paths = [  # acme's conversation acme-c0 (a tenant token may name its own tenant)
        "/conversations/acme-c0?tenant_id=acme",
        "/conversations/acme-c0/history?tenant_id=acme",
        f"/conversations/acme-c0/batches/{batch.id}?tenant_id=acme",
    ]
    search = "/memory/search?q=word1&tenant_id=acme"
    admin_paths = ["/table/conversations", "/router"]

    async def status(path: str, token: str) -> int:
        return (await client.get(path, headers=bearer(token))).status

    for path in read_paths:
        assert await status(path, READER) == 200, path
        assert await status(path, SEARCHER) == 403, path
        assert await status(path, SCRAPER) == 403, path
        assert await status(path, ADMIN) == 200, path
        assert await status(path, ACME) == 200, path  # a tenant token: read + search
    assert await status(search, SEARCHER) == 200
    assert await status(search, READER) == 403
    assert await status(search, ACME) == 200
    for path in admin_paths:
        assert await status(path, READER) == 403
        assert await status(path, SEARCHER) == 403
        assert await status(path, ACME) == 403
        assert await status(path, ADMIN) != 403
    # /metrics and /healthz: the metrics scope, once a token has it (401 otherwise)
    for path in ("/metrics", "/healthz"):
        assert await status(path, SCRAPER) == 200
        for token in (ADMIN, READER, ACME):
            assert await status(path, token) == 401
        assert (await client.get(path)).status == 401


def test_scopes_of_each_kind_of_token() -> None:
    policy = AuthPolicy.of(settings(**SCOPED).service, {"COMPACTOR_API_TOKENS": GLOBEX + "-env"})
    admin = policy.authenticate(f"Bearer {ADMIN}")
    assert admin is not None and admin.scopes == {"read", "search", "erase", "admin"}
    acme = policy.authenticate(f"Bearer {ACME}")
    assert acme is not None and acme.scopes == {"read", "search"}
    assert acme.tenant == "acme"
    env = policy.authenticate(f"Bearer {GLOBEX}-env")
    assert env is not None and env.tenant is None and "admin" in env.scopes
    scraper = policy.authenticate(f"Bearer {SCRAPER}")
    assert scraper is not None and scraper.scopes == {"metrics"}
    narrowed = AuthPolicy.of(
        settings(tokens=[{"token": ACME, "tenant": "acme", "scopes": ["read"]}]).service, {}
    )
    assert narrowed.authenticate(f"Bearer {ACME}") == Principal("acme", frozenset({"read"}))
    with pytest.raises(ConfigError, match=r"\[service\]\.tokens\[0\]\.scopes"):
        AuthPolicy.of(
            settings(tokens=[{"token": ACME, "tenant": "acme", "scopes": ["admin"]}]).service, {}
        )
    with pytest.raises(ConfigError, match=r"\[service\]\.tokens\.0\.scopes"):
        settings(tokens=[{"token": ACME, "scopes": ["everything"]}])


# -- hashed tokens and duplicates -------------------------------------------------------


def test_hashed_tokens_authenticate_the_token_not_the_hash() -> None:
    config = settings(
        api_tokens=[sha(ADMIN)],
        tokens=[{"token": sha(ACME).upper().replace("SHA256:", "sha256:"), "tenant": "acme"}],
        metrics_token=sha(SCRAPER),
    )
    policy = AuthPolicy.of(config.service, {"COMPACTOR_API_TOKENS": sha(READER)})
    assert policy.authenticate(f"Bearer {ADMIN}") == Principal(None)
    assert policy.authenticate(f"Bearer {ACME}") == Principal("acme")
    assert policy.authenticate(f"Bearer {READER}") == Principal(None)
    assert policy.operations_principal(f"Bearer {SCRAPER}") is not None
    assert policy.operations_principal(f"Bearer {ADMIN}") is None
    for hashed in (sha(ADMIN), sha(ACME), sha(ADMIN)[7:]):
        assert policy.authenticate(f"Bearer {hashed}") is None  # the hash is no token
    assert policy.authenticate("Bearer wrong-token-0123456789abc") is None
    with pytest.raises(ConfigError, match=r"\[service\]\.api_tokens\[0\]: a sha256") as error:
        AuthPolicy.of(settings(api_tokens=["sha256:" + "ab" * 20]).service, {})
    assert "ab" * 20 not in str(error.value)
    assert ADMIN not in repr(config) and sha(ADMIN) not in repr(config)


@pytest.mark.parametrize(
    ("service", "env", "names"),
    [
        (
            {"api_tokens": [ADMIN], "tokens": [{"token": ADMIN, "tenant": "acme"}]},
            "",
            ("[service].tokens[0]", "[service].api_tokens[0]"),
        ),
        (
            {"api_tokens": [ADMIN, sha(ADMIN)]},
            "",
            ("[service].api_tokens[1]", "[service].api_tokens[0]"),
        ),
        (
            {"tokens": [{"token": ACME, "tenant": "acme"}, {"token": ACME, "tenant": "globex"}]},
            "",
            ("[service].tokens[1]", "[service].tokens[0]"),
        ),
        ({"api_tokens": [ADMIN]}, ADMIN, ("COMPACTOR_API_TOKENS token 1", "api_tokens[0]")),
        ({"api_tokens": [ADMIN], "metrics_token": ADMIN}, "", ("[service].metrics_token",)),
    ],
)
def test_a_token_listed_twice_is_refused_naming_the_keys(
    service: dict[str, Any], env: str, names: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as error:
        AuthPolicy.of(settings(**service).service, {"COMPACTOR_API_TOKENS": env})
    message = str(error.value)
    for name in names:
        assert name in message
    assert ADMIN not in message and ACME not in message


def test_register_views_refuses_duplicates_at_start() -> None:
    with pytest.raises(ConfigError, match="listed once"):
        Worker(settings(api_tokens=[ADMIN], tokens=[{"token": ADMIN, "tenant": "acme"}]))


# -- SIGHUP reload -------------------------------------------------------------------------


def _write(path: Path, api_tokens: list[str], extra: str = "") -> None:
    listed = ", ".join(f'"{t}"' for t in api_tokens)
    path.write_text(f"[service]\napi_tokens = [{listed}]\n{extra}")


async def test_sighup_reloads_the_tokens_and_a_bad_reload_keeps_the_old_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COMPACTOR_API_TOKENS", raising=False)
    config = tmp_path / "config.toml"
    _write(config, [ADMIN])
    worker = Worker(settings(api_tokens=[ADMIN]), config_path=config)
    await worker.message("c-1", 0, None)
    loop = asyncio.get_running_loop()
    watch_sighup(worker.reload)
    try:
        async with TestClient(TestServer(worker.web_app)) as client:

            async def status(token: str) -> int:
                response = await client.get("/conversations/c-1/history", headers=bearer(token))
                return response.status

            async def hangup() -> None:
                os.kill(os.getpid(), signal.SIGHUP)
                for _ in range(50):  # the handler runs on the loop, soon after the signal
                    await asyncio.sleep(0.01)

            assert (await status(ADMIN), await status(READER)) == (200, 401)
            _write(config, [READER])
            await hangup()
            assert (await status(ADMIN), await status(READER)) == (401, 200)
            # A bad file (a duplicate) keeps the tokens in force and logs why.
            _write(config, [SEARCHER, SEARCHER])
            with caplog.at_level(logging.ERROR, logger="compactor.auth"):
                await hangup()
            assert (await status(READER), await status(SEARCHER)) == (200, 401)
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert any("token reload failed" in e and "api_tokens[1]" in e for e in errors)
            assert not any(SEARCHER in e or READER in e for e in errors)
            # Tokens from the environment are re-read too.
            monkeypatch.setenv("COMPACTOR_API_TOKENS", ACME)
            _write(config, [READER])
            assert worker.reload()
            assert (await status(ACME), await status(READER)) == (200, 200)
            # Invalid TOML: the old tokens stay.
            config.write_text("[service\n")
            assert not worker.reload()
            assert await status(ACME) == 200
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


# -- rate limit --------------------------------------------------------------------------


async def test_a_token_over_its_rate_gets_429_with_retry_after() -> None:
    worker = Worker(settings(**SCOPED, rate_limit_per_second=0.5, rate_limit_burst=3))
    await worker.message("c-1", 0, None)
    async with TestClient(TestServer(worker.web_app)) as client:
        path = "/conversations/c-1/history"
        statuses = [(await client.get(path, headers=bearer(ADMIN))).status for _ in range(3)]
        assert statuses == [200, 200, 200]
        limited = await client.get(path, headers=bearer(ADMIN))
        assert limited.status == 429
        assert limited.headers["Retry-After"] == "2"
        assert "too many" in (await limited.json())["error"]
        # another token has its own bucket; a wrong token is 401, not 429
        assert (await client.get(path, headers=bearer(READER))).status == 200
        assert (await client.get(path, headers=bearer("wrong-token-0123456789"))).status == 401


def test_the_bucket_refills_at_the_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, 2, clock=lambda: now[0])
    assert limiter.acquire("a") is None and limiter.acquire("a") is None
    wait = limiter.acquire("a")
    assert wait == pytest.approx(0.5)
    assert limiter.retry_after(wait or 0) == "1"
    now[0] = 0.5
    assert limiter.acquire("a") is None
    assert limiter.acquire("b") is None
    assert RateLimiter(0, 1).acquire("a") is None  # 0: no limit


# -- pages -------------------------------------------------------------------------------


async def _walk(
    client: TestClient[Any, Any], path: str, limit: int, key: str
) -> tuple[list[str], int]:
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"limit": str(limit), **({"cursor": cursor} if cursor else {})}
        response = await client.get(path, params=params, headers=bearer(ADMIN))
        assert response.status == 200, await response.text()
        body = await response.json()
        assert len(body[key]) <= limit
        seen += [m["id"] for m in body[key]]
        pages += 1
        assert pages <= 2000, "the cursor does not advance"
        cursor = body["next_cursor"]
        if cursor is None:
            return seen, pages


async def test_a_cursor_walks_the_whole_history_exactly_once(
    scoped: tuple[Worker, TestClient[Any, Any]],
) -> None:
    worker, client = scoped
    for i in range(23):
        await worker.message("plain-c", i, None)
    # acme's acme-c0 starts with its clip-archive
    for key, path in (
        ("plain-c", "/conversations/plain-c/history"),
        ("acme/acme-c0", "/conversations/acme-c0/history?tenant_id=acme"),
    ):
        everything = [m.id for m in await worker.store.history.load_history(key)]
        assert len(everything) > 7
        for limit in (1, 7, len(everything), 1000):
            seen, pages = await _walk(client, path, limit, "messages")
            assert seen == everything
            assert pages == max(1, -(-len(everything) // limit))
    history = await (
        await client.get("/conversations/acme-c0/history?tenant_id=acme", headers=bearer(ADMIN))
    ).json()
    assert history["clip_archive"] is not None and history["next_cursor"] is None
    batch = max(worker.store.batches.values(), key=lambda b: len(b.batch.source_message_ids))
    full = await worker.store.archive.expand_batch(batch.conversation_id, batch.id)
    assert full is not None
    ref = ConversationRef.of_key(batch.conversation_id)
    path = f"/conversations/{ref.conversation_id}/batches/{batch.id}?tenant_id={ref.tenant_id}"
    assert len(full.turns) >= 2
    seen, pages = await _walk(client, path, 1, "turns")
    assert seen == [t.id for t in full.turns] and pages == len(full.turns)


async def test_the_default_page_is_capped_and_bad_pages_are_400() -> None:
    worker = Worker(settings(api_tokens=[ADMIN], page_default_limit=5, page_max_limit=8))
    for i in range(12):
        await worker.message("c-1", i, None)
    async with TestClient(TestServer(worker.web_app)) as client:
        path = "/conversations/c-1/history"
        body = await (await client.get(path, headers=bearer(ADMIN))).json()
        assert len(body["messages"]) == 5 and body["next_cursor"]
        for params in (
            {"limit": "9"},
            {"limit": "0"},
            {"limit": "-1"},
            {"limit": "x"},
            {"cursor": "not-a-cursor"},
            {"cursor": "W10"},
            {"cursor": "x" * 2000},
        ):
            response = await client.get(path, params=params, headers=bearer(ADMIN))
            assert response.status == 400, params
        assert (await client.get(path, params={"limit": "8"}, headers=bearer(ADMIN))).status == 200


# -- forwarded requests ----------------------------------------------------------------


def _pair(**service: Any) -> tuple[Worker, Worker]:
    """An entry worker that forwards /conversations/{id} to the owner, and the owner
    (advertising 127.0.0.1 on a port of its own, where ``forwarding_between`` serves it)."""
    config = settings(**SCOPED, **service)
    port = _free_port()
    owner_app = faust.App(
        f"tokens-owner-{port}",
        broker="kafka://127.0.0.1:1",
        web_port=port,
        canonical_url=f"http://127.0.0.1:{port}",
    )
    return Worker(config), Worker(config, app=owner_app)


@asynccontextmanager
async def forwarding_between(
    entry: Worker, owner: Worker
) -> AsyncIterator[tuple[TestClient[Any, Any], TestClient[Any, Any], list[dict[str, str]]]]:
    """Both workers served; the entry forwards /conversations/{id} to the owner, whose
    received headers are recorded (in ``seen``, in order)."""
    seen: list[dict[str, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.append(dict(request.headers))
        return await handler(request)

    owner.web_app.middlewares.insert(0, record)
    owner_url = owner.app.conf.canonical_url
    async with (
        TestClient(
            TestServer(owner.web_app, host="127.0.0.1", port=owner_url.port)
        ) as owner_client,
        TestClient(TestServer(entry.web_app)) as entry_client,
    ):
        entry.app.router.external_topic_key_store = (  # type: ignore[method-assign]
            lambda *args: owner_url
        )
        yield entry_client, owner_client, seen


async def test_forwarded_requests_carry_a_signed_principal_not_the_token() -> None:
    entry, owner = _pair(internal_token=INTERNAL)
    for i in range(3):
        await owner.message("acme-c0", i, "acme")
        await owner.message("globex-c0", i, "globex")
    async with forwarding_between(entry, owner) as (entry_client, owner_client, seen):
        response = await entry_client.get("/conversations/acme-c0", headers=bearer(ACME))
        assert response.status == 200, await response.text()
        assert (await response.json())["conversation_id"] == "acme-c0"
        forwarded = seen[-1]
        assert "Authorization" not in forwarded
        assert PRINCIPAL_HEADER in forwarded and SIGNATURE_HEADER in forwarded
        assert ACME not in str(forwarded)
        # the owner applies the signed tenant: acme's token cannot read globex's
        response = await entry_client.get("/conversations/globex-c0", headers=bearer(ACME))
        assert response.status == 404  # acme has no globex-c0
        response = await entry_client.get(
            "/conversations/globex-c0?tenant_id=globex", headers=bearer(ACME)
        )
        assert response.status == 403
        # a token without the read scope is stopped at the entry, never forwarded
        count = len(seen)
        response = await entry_client.get("/conversations/acme-c0", headers=bearer(SEARCHER))
        assert response.status == 403 and len(seen) == count
        await entry_client.close()

        # At the owner: the signed headers only on the forwarded path, only fresh,
        # only signed with the deployment's key, only addressed to the owner.
        good = Forwarding(internal_key(settings(internal_token=INTERNAL).service, None))
        here = node_of(owner.app.conf.canonical_url)
        admin = Principal(None)

        async def direct(path: str, headers: dict[str, str]) -> int:
            return (await owner_client.get(path, headers=headers)).status

        path = "/conversations/globex-c0?tenant_id=globex"
        assert await direct(path, good.sign(admin, "GET", path, here)) == 200
        history = "/conversations/globex-c0/history"
        assert await direct(history, good.sign(admin, "GET", history, here)) == 401
        other = Forwarding(hashlib.sha256(b"another deployment").digest())
        assert await direct(path, other.sign(admin, "GET", path, here)) == 401
        stale = good.sign(admin, "GET", path, here, now=time.time() - 120)
        assert await direct(path, stale) == 401
        assert await direct(path, good.sign(admin, "GET", "/conversations/acme-c0", here)) == 401
        forged = dict(good.sign(Principal("acme"), "GET", path, here))
        forged[PRINCIPAL_HEADER] = good.sign(admin, "GET", path, here)[PRINCIPAL_HEADER]
        assert await direct(path, forged) == 401
        assert await direct(path, {PRINCIPAL_HEADER: "e30", SIGNATURE_HEADER: "00"}) == 401


async def test_a_captured_forwarded_request_is_refused_when_sent_again() -> None:
    """Replayed as it was captured, to its owner or to another worker: 401."""
    entry, owner = _pair(internal_token=INTERNAL)
    await owner.message("acme-c0", 0, "acme")
    async with forwarding_between(entry, owner) as (entry_client, owner_client, seen):
        path = "/conversations/acme-c0"
        response = await entry_client.get(path, headers=bearer(ACME))
        assert response.status == 200, await response.text()
        captured = {k: seen[-1][k] for k in (PRINCIPAL_HEADER, SIGNATURE_HEADER)}
        replayed = await owner_client.get(path, headers=captured)
        assert replayed.status == 401
        assert await replayed.json() == {"error": "unauthorized: a valid bearer token is required"}
        # the entry forwards each request with a fresh nonce: still 200, every time
        for _ in range(3):
            assert (await entry_client.get(path, headers=bearer(ACME))).status == 200
        forwarded = [h for h in seen if h is not seen[1]]  # seen[1]: the replay
        assert len({h[SIGNATURE_HEADER] for h in forwarded}) == len(forwarded) == 4

        # signed for this owner, sent to another worker of the deployment (the entry,
        # which would own the conversation after a rebalance): refused there too
        good = Forwarding(internal_key(settings(internal_token=INTERNAL).service, None))
        admin_path = f"{path}?tenant_id=acme"
        owner_node = node_of(owner.app.conf.canonical_url)
        to_owner = good.sign(Principal(None), "GET", admin_path, owner_node)
        entry.app.router.external_topic_key_store = (  # type: ignore[method-assign]
            lambda *args: entry.app.conf.canonical_url  # the entry owns it now
        )
        assert (await entry_client.get(admin_path, headers=to_owner)).status == 401
        assert (await owner_client.get(admin_path, headers=to_owner)).status == 200
        assert (await owner_client.get(admin_path, headers=to_owner)).status == 401


async def test_a_signature_that_is_not_ascii_is_a_401_not_a_500() -> None:
    _, owner = _pair(internal_token=INTERNAL)
    await owner.message("acme-c0", 0, "acme")
    good = Forwarding(internal_key(settings(internal_token=INTERNAL).service, None))
    path = "/conversations/acme-c0?tenant_id=acme"
    signed = good.sign(Principal(None), "GET", path, node_of(owner.app.conf.canonical_url))
    async with TestClient(TestServer(owner.web_app)) as client:
        for header, value in (
            (SIGNATURE_HEADER, "é" * 64),
            (SIGNATURE_HEADER, signed[SIGNATURE_HEADER][:-1] + "é"),
            (PRINCIPAL_HEADER, signed[PRINCIPAL_HEADER] + "é"),
        ):
            headers = {**signed, header: value}
            response = await client.get(path, headers=headers)
            assert response.status == 401, (header, await response.text())


async def test_forwarded_401s_count_as_failed_authentications() -> None:
    """A peer address sending bad signatures is slowed down like a guessing client."""
    _, owner = _pair(internal_token=INTERNAL, auth_failures_per_second=0.01, auth_failures_burst=3)
    await owner.message("acme-c0", 0, "acme")
    other = Forwarding(hashlib.sha256(b"a guess").digest())
    path = "/conversations/acme-c0?tenant_id=acme"
    here = node_of(owner.app.conf.canonical_url)
    async with TestClient(TestServer(owner.web_app)) as client:
        statuses = [
            (await client.get(path, headers=other.sign(Principal(None), "GET", path, here))).status
            for _ in range(4)
        ]
        assert statuses == [401, 401, 401, 429]
        # the address is now refused before its credentials are looked at
        good = Forwarding(internal_key(settings(internal_token=INTERNAL).service, None))
        response = await client.get(path, headers=good.sign(Principal(None), "GET", path, here))
        assert response.status == 429 and "Retry-After" in response.headers
        assert (await client.get(path, headers=bearer(ADMIN))).status == 429


async def test_without_an_internal_key_a_callers_token_is_never_forwarded() -> None:
    entry, owner = _pair()
    await owner.message("acme-c0", 0, "acme")
    async with forwarding_between(entry, owner) as (entry_client, owner_client, seen):
        response = await entry_client.get("/conversations/acme-c0", headers=bearer(ACME))
        assert response.status == 503
        assert "[service].internal_token" in (await response.json())["error"]
        assert not seen, "nothing reached the owner"
        path = "/conversations/acme-c0"
        here = node_of(owner.app.conf.canonical_url)
        guess = Forwarding(hashlib.sha256(b"guess").digest())
        signed = guess.sign(Principal(None), "GET", path, here)
        assert (await owner_client.get(path, headers=signed)).status == 401
        await entry_client.close()


def test_the_internal_key_needs_a_secret() -> None:
    service = settings(app_id="app-a").service
    assert internal_key(service, None) is None
    assert internal_key(service, "postgresql://compactor@db/app") is None
    derived = internal_key(service, "postgresql://compactor:pw-1@db/app")
    assert derived is not None
    assert derived != internal_key(service, "postgresql://compactor:pw-2@db/app")
    assert derived != internal_key(settings(app_id="app-b").service, "postgresql://c:pw-1@db/a")
    explicit = internal_key(settings(internal_token=INTERNAL).service, None)
    assert explicit is not None and explicit != derived


# -- HTTPS -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_the_faust_web_server_speaks_https_with_the_configured_certificate(
    tmp_path: Path,
) -> None:
    from devtools.tls import issue, make_ca

    ca = make_ca(tmp_path / "ca")
    server = issue(ca, tmp_path / "server", "worker")
    port = _free_port()
    config = settings(
        **SCOPED,
        web_port=port,
        tls_certfile=str(server.cert),
        tls_keyfile=str(server.key),
    )
    worker = Worker(config, app=create_app(config, "127.0.0.1:1"))
    await worker.message("c-1", 0, None)
    web_driver = worker.app.web
    await web_driver.start_server()  # type: ignore[attr-defined]
    try:
        trusted = ssl.create_default_context(cafile=str(ca.cert))
        async with aiohttp.ClientSession() as session:
            url = f"https://localhost:{port}/conversations/c-1/history"
            async with session.get(url, ssl=trusted, headers=bearer(ADMIN)) as response:
                assert response.status == 200
                assert (await response.json())["messages"][0]["id"] == "c-1-m0000"
            with pytest.raises(aiohttp.ClientError):  # plain HTTP gets no answer
                async with session.get(f"http://localhost:{port}/healthz") as response:
                    await response.read()
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with session.get(url, headers=bearer(ADMIN)) as response:
                    await response.read()  # not a system CA: refused
    finally:
        await web_driver.stop_server()  # type: ignore[attr-defined]


def test_https_needs_both_files_and_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[service\]\.tls_keyfile"):
        create_app(settings(tls_certfile=str(tmp_path / "c.pem")), "127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"tls_certfile / tls_keyfile cannot be loaded"):
        create_app(
            settings(tls_certfile=str(tmp_path / "c.pem"), tls_keyfile=str(tmp_path / "k")),
            "127.0.0.1:1",
        )
