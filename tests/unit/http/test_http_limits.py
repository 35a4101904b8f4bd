"""Rate limits that fit a platform reading the context at every turn (issue 27), per
tenant as well as per token, a search's cost, the searches in flight per tenant, and
the failed-authentication table's bounded, O(1) eviction (issue 29).

The worker's real views (``register_views``) on a Faust app that is never started,
served by aiohttp's test server, as in ``test_http_security.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import faust
import pytest
from aiohttp.test_utils import TestClient, TestServer
from faust.exceptions import SameNode

from core.ports.storage import MemorySearch, MemorySearchResult
from core.settings import ServiceSettings, Settings, parse_settings
from streams.events import MessageEvent
from streams.http.limits import InFlight, RateLimiter, RequestLimits
from streams.http.views import register_views
from streams.worker.records import Record
from tests.support.builders import T0
from tests.support.memory_store import InMemoryStore, RecordingPublisher
from tests.unit.http.views_over_memory import ViewRuntime, components_over

pytestmark = pytest.mark.unit

ADMIN = "admin-token-0123456789abcdef"
ACME = "acme-token-0123456789abcdef"
ACME_TOO = "acme-second-token-0123456789"
GLOBEX = "globex-token-0123456789abcdef"
TOKENS: dict[str, Any] = {
    "api_tokens": [ADMIN],
    "tokens": [
        {"token": ACME, "tenant": "acme"},
        {"token": ACME_TOO, "tenant": "acme"},
        {"token": GLOBEX, "tenant": "globex"},
    ],
}


def settings(**service: Any) -> Settings:
    return parse_settings(
        {
            "budget": {"context_budget": 0.5, "model_max_tokens": 400},
            "kafka": {"topic_prefix": "t."},
            "summarization": {"keep_recent": 2, "chunk_size": 4, "retry_backoff_seconds": 0},
            "service": {"command_timeout_seconds": 60, **TOKENS, **service},
        }
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class HeldSearches(ViewRuntime):
    """Memory searches that wait for ``release``; ``running`` counts those waiting."""

    def __init__(self, store: InMemoryStore) -> None:
        super().__init__(store)
        self.release = asyncio.Event()
        self.running = 0

    @property
    def memory(self) -> MemorySearch:
        runtime, inner = self, super().memory

        class Held:
            async def memory_read(self, *args: Any, **kwargs: Any) -> MemorySearchResult:
                runtime.running += 1
                try:
                    await runtime.release.wait()
                    return await inner.memory_read(*args, **kwargs)
                finally:
                    runtime.running -= 1

        return Held()


class Site:
    def __init__(self, config: Settings) -> None:
        self.store = InMemoryStore()
        self.components = components_over(self.store, config, RecordingPublisher())
        self.app = faust.App(f"limits-{id(self)}", broker="kafka://127.0.0.1:1", web_port=6999)

        async def same_node(*args: Any, **kwargs: Any) -> Any:
            raise SameNode()

        self.app.router.route_topic_req = same_node  # type: ignore[method-assign]
        self.runtime = HeldSearches(self.store)
        self.runtime.release.set()
        register_views(self.app, config, self.components, self.runtime)
        self.offset = 0

    async def message(self, conversation: str, tenant: str | None) -> None:
        self.offset += 1
        event = MessageEvent(
            message_id=f"{conversation}-m{self.offset}",
            conversation_id=conversation,
            role="user",
            content="the words of a turn",
            created_at=T0,
            tenant_id=tenant,
        )
        record = Record(
            "t.messages", 0, self.offset, conversation.encode(), event.model_dump_json().encode()
        )
        await self.components.accounting.handle(record)

    def client(self) -> TestClient[Any, Any]:
        return TestClient(TestServer(self.app.web.web_app))  # type: ignore[attr-defined]


HISTORY = "/conversations/c-1/history"


async def site_with_conversations(**service: Any) -> Site:
    site = Site(settings(**service))
    for tenant in ("acme", "globex", None):
        await site.message("c-1", tenant)
    return site


# -- the defaults fit a platform's turn rate ------------------------------------------


def test_the_defaults_admit_one_token_at_1000_turns_a_second() -> None:
    """One platform token reading the context at every turn, 1,000 turns a second for
    a minute, with a search every tenth turn: never throttled (the old default of 50/s
    with bursts of 200 refused all but 250 of the first second's)."""
    service = ServiceSettings()
    now = [0.0]
    limits = RequestLimits(
        RateLimiter(service.rate_limit_per_second, service.rate_limit_burst, lambda: now[0]),
        RateLimiter(
            service.tenant_rate_limit_per_second, service.tenant_rate_limit_burst, lambda: now[0]
        ),
    )
    refused = 0
    for turn in range(60_000):
        now[0] = turn / 1000
        if limits.admit("tok-platform", "acme", 1.0) is not None:
            refused += 1
        if turn % 10 == 0 and limits.admit("tok-platform", "acme", 1.0) is not None:
            refused += 1  # the publish's read-your-writes re-read, say
    assert refused == 0
    assert service.rate_limit_search_cost > 1
    assert service.max_concurrent_searches_per_tenant >= 1


async def test_a_burst_of_reads_from_one_token_is_not_throttled_by_default() -> None:
    site = await site_with_conversations()
    async with site.client() as client:
        statuses = [(await client.get(HISTORY, headers=bearer(ACME))).status for _ in range(400)]
    assert statuses == [200] * 400


# -- per tenant ---------------------------------------------------------------------------


async def test_all_the_tokens_of_a_tenant_share_its_bucket() -> None:
    site = await site_with_conversations(
        tenant_rate_limit_per_second=0.01, tenant_rate_limit_burst=5
    )
    async with site.client() as client:

        async def status(token: str, path: str = HISTORY) -> int:
            return (await client.get(path, headers=bearer(token))).status

        assert [await status(ACME) for _ in range(3)] == [200] * 3
        assert [await status(ACME_TOO) for _ in range(2)] == [200] * 2
        limited = await client.get(HISTORY, headers=bearer(ACME_TOO))
        assert limited.status == 429
        assert (await limited.json())["error"] == "too many requests for this tenant"
        assert int(limited.headers["Retry-After"]) >= 1
        assert await status(ACME) == 429
        # A token bound to no tenant naming acme takes from acme's bucket too; its
        # reads of other tenants, or of no tenant, do not.
        assert await status(ADMIN, f"{HISTORY}?tenant_id=acme") == 429
        assert await status(ADMIN, f"{HISTORY}?tenant_id=globex") == 200
        assert await status(ADMIN) == 200
        assert await status(GLOBEX) == 200


def test_a_refused_request_takes_from_neither_bucket() -> None:
    now = [0.0]
    per_token = RateLimiter(1.0, 10, lambda: now[0])
    per_tenant = RateLimiter(1.0, 3, lambda: now[0])
    limits = RequestLimits(per_token, per_tenant)
    assert [limits.admit("tok-a", "acme", 1.0) for _ in range(3)] == [None] * 3
    throttled = limits.admit("tok-a", "acme", 1.0)
    assert throttled is not None and throttled.why == "too many requests for this tenant"
    assert throttled.wait == pytest.approx(1.0)
    assert per_token.wait("tok-a", 7.0) is None  # 10 - 3: the refusal took nothing
    assert limits.admit("tok-a", None, 7.0) is None  # no tenant: the token's bucket only


# -- a search's cost and the searches in flight ---------------------------------------------


async def test_a_search_costs_more_than_a_read() -> None:
    """Cheap reads cannot lend their allowance to expensive searches."""
    site = await site_with_conversations(
        rate_limit_per_second=0.01, rate_limit_burst=40, rate_limit_search_cost=20
    )
    search = "/memory/search?q=words&conversation_id=c-1"
    async with site.client() as client:
        for _ in range(21):
            assert (await client.get(HISTORY, headers=bearer(ACME))).status == 200
        limited = await client.get(search, headers=bearer(ACME))
        assert limited.status == 429
        assert int(limited.headers["Retry-After"]) >= 90  # the 1 of 20 missing, at 0.01/s
        assert (await client.get(HISTORY, headers=bearer(ACME))).status == 200
        # Another token of its own: two searches use its whole burst.
        statuses = [(await client.get(search, headers=bearer(GLOBEX))).status for _ in range(3)]
        assert statuses == [200, 200, 429]


async def test_searches_in_flight_are_capped_per_tenant() -> None:
    site = await site_with_conversations(max_concurrent_searches_per_tenant=2)
    site.runtime.release.clear()
    search = "/memory/search?q=words&conversation_id=c-1"
    async with site.client() as client:
        held = [
            asyncio.create_task(client.get(search, headers=bearer(token)))
            for token in (ACME, ACME_TOO)
        ]
        await _until(lambda: site.runtime.running == 2)
        # answered at once, not held (without the cap it would wait for the release)
        third = await asyncio.wait_for(client.get(search, headers=bearer(ACME)), 10)
        assert third.status == 429 and third.headers["Retry-After"] == "1"
        assert "searches in flight" in (await third.json())["error"]
        # the same tenant named by a token bound to none: the same cap
        named = await asyncio.wait_for(
            client.get(f"{search}&tenant_id=acme", headers=bearer(ADMIN)), 10
        )
        assert named.status == 429
        # another tenant, and a search of no tenant, are not held back by acme's
        others = [
            asyncio.create_task(client.get(search, headers=bearer(GLOBEX))),
            asyncio.create_task(client.get(search, headers=bearer(ADMIN))),
        ]
        await _until(lambda: site.runtime.running == 4)
        site.runtime.release.set()
        assert [(await task).status for task in held + others] == [200] * 4
        assert (await client.get(search, headers=bearer(ACME))).status == 200


async def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def test_in_flight_keys_leave_with_their_last_request() -> None:
    slots = InFlight(2)
    assert slots.enter("tenant:a") and slots.enter("tenant:a")
    assert not slots.enter("tenant:a")
    assert slots.enter("tenant:b")
    for key in ("tenant:a", "tenant:a", "tenant:b"):
        slots.leave(key)
    assert len(slots) == 0
    assert all(InFlight(0).enter("x") for _ in range(100))  # 0: no cap


# -- the failed-authentication table ------------------------------------------------------


def test_a_full_table_drops_its_least_recently_used_bucket() -> None:
    now = [0.0]
    failures = RateLimiter(0.5, 2, lambda: now[0], max_keys=3)
    for address in ("a", "b", "c"):
        failures.acquire(address)
        failures.acquire(address)
    assert failures.blocked("a") is not None  # used up
    now[0] = 1.0
    assert failures.blocked("a") is not None  # a touch: "a" is the most recent now
    failures.acquire("d")
    assert len(failures) == 3
    assert failures.blocked("b") is None  # dropped: the least recently used
    assert failures.blocked("a") is not None and failures.blocked("c") is not None


def test_new_addresses_past_a_full_table_cost_the_same_whatever_its_size() -> None:
    """Before: every new address past max_keys rebuilt the whole table (2,000 new
    addresses against 20,000 used-up buckets took seconds). Now O(1) each."""
    max_keys = 20_000
    failures = RateLimiter(0.5, 20, max_keys=max_keys)
    for n in range(max_keys):
        failures.acquire(f"10.0.{n // 256}.{n % 256}")  # none has refilled
    started = time.perf_counter()
    for n in range(2_000):
        failures.acquire(f"fd00::{n:x}")
    elapsed = time.perf_counter() - started
    assert len(failures) == max_keys
    assert elapsed < 0.5, f"2,000 new addresses took {elapsed:.2f} s"
