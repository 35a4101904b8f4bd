"""streams.client against the worker's real views (over in-memory ports), and the
CLI's ``--url`` reads through it: typed answers, pages followed, the token sent,
429/503 retried after Retry-After, and errors that say what the worker said."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.ports.storage import RejectionRecord
from core.settings import Settings
from streams.cli.errors import CommandError
from streams.cli.read_commands import cmd_expand, cmd_history, cmd_memory_read
from streams.cli.usage_commands import cmd_usage
from streams.client import (
    BadRequest,
    CompactorClient,
    Forbidden,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
    retry_after_seconds,
)
from tests.support.builders import T0
from tests.unit.http.test_http_security import (
    ACME,
    ADMIN,
    METRICS,
    SECURED,
    Site,
    compacted_site,
    settings,
)

pytestmark = pytest.mark.unit


@pytest.fixture
async def worker() -> AsyncIterator[tuple[Site, str]]:
    site = await compacted_site(
        settings(**SECURED, metrics_token=METRICS, auth_failures_per_second=0, page_default_limit=3)
    )
    server = TestServer(site.app.web.web_app)  # type: ignore[attr-defined]
    await server.start_server()
    try:
        yield site, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_every_view_is_a_typed_method(worker: tuple[Site, str]) -> None:
    site, url = worker
    async with CompactorClient(url, ACME) as client:
        messages = [m async for m in client.history("acme-c0")]
        stored = await site.store.history.load_history("acme/acme-c0")
        assert [m.id for m in messages] == [m.id for m in stored]  # every page, in order
        first = await client.history_page("acme-c0", limit=2)
        assert first.clip_archive is not None and first.clip_archive.id == messages[0].id
        assert first.next_cursor is not None and first.tenant_id == "acme"
        status = await client.conversation("acme-c0")
        assert status.message_count == 40 and status.conversation_id == "acme-c0"
        log = await client.compactions("acme-c0")
        batch_id = log.compactions[0].batches[0].batch_id
        batch = await client.batch("acme-c0", batch_id, page_size=1)  # read page by page
        assert len(batch.turns) == batch.message_count and batch.next_cursor is None
        found = await client.search("acmesecret1", conversation_id="acme-c0")
        assert found.hits and {h.tenant_id for h in found.hits} == {"acme"}
        assert (await client.openapi())["openapi"] == "3.1.0"
        usage = await client.usage("acme")
        assert usage.tenant_id == "acme" and usage.total.compactions == len(log.compactions) * 2
        assert sum(d.compactions for d in usage.days) == usage.total.compactions
        with pytest.raises(Forbidden):
            await client.usage("globex")
    async with CompactorClient(url, ADMIN) as admin:
        assert (await admin.conversation("acme-c0", tenant_id="acme")).tenant_id == "acme"
    async with CompactorClient(url, METRICS) as scraper:
        assert (await scraper.health()).status in ("ok", "degraded")


async def test_errors_say_what_the_worker_said(worker: tuple[Site, str]) -> None:
    _, url = worker
    async with CompactorClient(url) as anonymous:
        with pytest.raises(Unauthorized, match="401 unauthorized"):
            await anonymous.history_page("acme-c0")
    async with CompactorClient(url, ACME) as client:
        with pytest.raises(Forbidden):
            await client.history_page("acme-c0", tenant_id="globex")
        with pytest.raises(NotFound, match="unknown conversation 'nope' of tenant 'acme'"):
            await client.conversation("nope")
        with pytest.raises(BadRequest, match="limit must be a whole number"):
            await client.history_page("acme-c0", limit=0)


class Flaky:
    """A server that answers ``statuses`` in turn (then 200), recording each request."""

    def __init__(self, *answers: tuple[int, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.seen: list[web.Request] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request)
        if self.answers:
            status, headers = self.answers.pop(0)
            return web.json_response(
                {"error": f"try later ({status})"}, status=status, headers=headers
            )
        return web.json_response(
            {"conversation_id": "c", "tenant_id": None, "compactions": []}, status=200
        )


async def serve(flaky: Flaky) -> TestServer:
    app = web.Application()
    app.router.add_get("/conversations/{cid}/compactions", flaky.handle)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_429_and_503_are_retried_after_retry_after() -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    flaky = Flaky((429, {"Retry-After": "2"}), (503, {"Retry-After": later}), (503, {}))
    server = await serve(flaky)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    try:
        url = str(server.make_url("")).rstrip("/")
        async with CompactorClient(url, "tok-0123456789abcdef", sleep=sleep) as client:
            log = await client.compactions("c")
        assert log.compactions == []
        assert slept[0] == 2 and 28 <= slept[1] <= 30 and slept[2] == 4  # 503 without: backoff
        assert {r.headers["Authorization"] for r in flaky.seen} == {"Bearer tok-0123456789abcdef"}
        flaky.answers = [(429, {"Retry-After": "1"})] * 10
        async with CompactorClient(url, sleep=sleep, max_retries=3) as client:
            with pytest.raises(RateLimited, match="429"):
                await client.compactions("c")
        flaky.answers = [(503, {"Retry-After": "50"})] * 3
        async with CompactorClient(url, sleep=sleep, max_wait=20) as client:
            with pytest.raises(Unavailable, match="503"):  # would wait past max_wait: gives up
                await client.compactions("c")
    finally:
        await server.close()


async def test_no_worker_there_is_unavailable_after_the_retries() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with CompactorClient("http://127.0.0.1:1", sleep=sleep, max_retries=2) as client:
        with pytest.raises(Unavailable, match="no answer"):
            await client.conversation("c")
    assert slept == [1.0, 2.0]


def test_retry_after_is_seconds_or_a_date() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    now = datetime(2026, 1, 1, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert retry_after_seconds(date, now.timestamp()) == 90.0
    past = format_datetime(now - timedelta(seconds=90), usegmt=True)
    assert retry_after_seconds(past, now.timestamp()) == 0.0


# -- the CLI's --url reads go through the client ---------------------------------------


def args(**values: Any) -> argparse.Namespace:
    defaults: dict[str, Any] = {"tenant_id": None, "json": False, "url": None}
    return argparse.Namespace(**{**defaults, **values})


async def test_cli_reads_from_a_worker_print_the_apis_json_and_text(
    worker: tuple[Site, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site, url = worker
    config: Settings = settings()
    monkeypatch.setenv("COMPACTOR_TOKEN", ACME)
    assert await cmd_history(config, args(conversation_id="acme-c0", url=url, json=True)) == 0
    body = json.loads(capsys.readouterr().out)
    stored = await site.store.history.load_history("acme/acme-c0")
    assert [m["id"] for m in body["messages"]] == [m.id for m in stored]  # all pages
    assert body["clip_archive"]["id"] == stored[0].id and body["next_cursor"] is None
    assert await cmd_history(config, args(conversation_id="acme-c0", url=url)) == 0
    assert capsys.readouterr().out.startswith("--- clip-archive (")

    batch_id = next(iter(site.store.batches))
    owner = site.store.batches[batch_id].conversation_id.split("/")[1]
    tenant = owner.split("-")[0]
    monkeypatch.setenv("COMPACTOR_TOKEN", ADMIN)
    expand = args(conversation_id=owner, batch_id=batch_id, tenant_id=tenant, url=url, json=True)
    assert await cmd_expand(config, expand) == 0
    expanded = json.loads(capsys.readouterr().out)
    assert expanded["batch_id"] == batch_id and len(expanded["turns"]) == expanded["message_count"]

    search = args(
        query="acmesecret1",
        conversation_id=None,
        tenant_id="acme",
        all=False,
        limit=3,
        sources="both",
        mode="plain",
        url=url,
        json=True,
    )
    assert await cmd_memory_read(config, search) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits and {h["tenant_id"] for h in hits} == {"acme"}
    assert await cmd_memory_read(config, argparse.Namespace(**{**vars(search), "json": False})) == 0
    assert "score=" in capsys.readouterr().out

    usage = argparse.Namespace(tenant="acme", since=None, json=True, url=url)
    assert await cmd_usage(config, usage) == 0
    assert json.loads(capsys.readouterr().out)["tenant_id"] == "acme"
    with pytest.raises(CommandError, match="needs --tenant"):
        await cmd_usage(config, argparse.Namespace(tenant=None, since=None, json=True, url=url))

    monkeypatch.setenv("COMPACTOR_TOKEN", ACME)
    assert await cmd_history(config, args(conversation_id="nope", url=url)) == 1
    assert "no messages for conversation 'nope'" in capsys.readouterr().err
    monkeypatch.delenv("COMPACTOR_TOKEN")
    with pytest.raises(CommandError, match="401"):
        await cmd_history(config, args(conversation_id="acme-c0", url=url))


async def test_the_compaction_log_lists_rejected_compactions_and_pinned_messages_are_marked(
    worker: tuple[Site, str],
) -> None:
    """What the inspector shows (issue 28): a refusal with its reason; a pinned message."""
    site, url = worker
    tables = site.store.compactions._t
    tables.rejections["acme/acme-c0", "cmp-x", "anthropic"] = RejectionRecord(
        "cmp-x", "anthropic", "echo", "the summaries repeat 90% of the compressed text", T0
    )
    stored = await site.store.history.load_history("acme/acme-c0")
    plain = next(m for m in stored if m.role == "user")
    assert await site.store.compactions.set_pinned("acme/acme-c0", plain.id, True)
    async with CompactorClient(url, ACME) as client:
        log = await client.compactions("acme-c0")
        assert [(r.compaction_id, r.reason) for r in log.rejections] == [("cmp-x", "echo")]
        pinned = [m.id for m in [m async for m in client.history("acme-c0")] if m.pinned]
        assert pinned == [plain.id]
