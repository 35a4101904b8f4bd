"""The audit log of HTTP reads, and the read scope every view hands the store.

The worker's real views over the in-memory store (``test_http_security.Site``):
every data request leaves one JSON line on ``compactor.audit`` with the token's
id, the tenant, the route, the conversation and the status, and never the
token, the query text or any content.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.domain.tenancy import ConversationRef
from core.ports.storage import ReadScope
from streams.http import audit
from tests.unit.http.test_http_security import (
    ACME,
    ADMIN,
    GLOBEX,
    METRICS,
    SECURED,
    Site,
    bearer,
    compacted_site,
    settings,
)

pytestmark = pytest.mark.unit

FIELDS = {"time", "logger", "event", "token_id", "tenant", "scope", "method", "route"}
FIELDS |= {"conversation_id", "conversation_tenant", "status"}


@pytest.fixture
def audit_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(audit.formatter())
    logger = logging.getLogger(audit.AUDIT_LOGGER)
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)


@pytest.fixture
async def site_client() -> AsyncIterator[tuple[Site, TestClient[Any, Any]]]:
    site = await compacted_site(settings(**SECURED, metrics_token=METRICS))
    async with TestClient(TestServer(site.app.web.web_app)) as client:  # type: ignore[attr-defined]
        yield site, client


def parsed(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_every_read_is_one_json_line_without_token_query_or_content(
    site_client: tuple[Site, TestClient[Any, Any]], audit_lines: io.StringIO
) -> None:
    site, client = site_client
    batch_id = next(iter(site.store.batches))
    own = ConversationRef.of_key(site.store.batches[batch_id].conversation_id)
    secret_query = "acmesecret7 word3"
    asked = [
        (ACME, "/conversations/acme-c0/history", 200),
        (ACME, "/conversations/globex-c0/history?tenant_id=globex", 403),
        (ACME, f"/memory/search?q={secret_query}&conversation_id=acme-c0", 200),
        (
            ADMIN,
            f"/conversations/{own.conversation_id}/batches/{batch_id}?tenant_id={own.tenant_id}",
            200,
        ),
        (GLOBEX, "/memory/search?q=globexsecret1", 200),
        (None, "/conversations/acme-c0/history", 401),
        ("wrong-token-0123456789abcdef", "/conversations/acme-c0", 401),
        (METRICS, "/healthz", None),  # operations: not audited
    ]
    for token, path, status in asked:
        response = await client.get(path, headers=bearer(token) if token else {})
        if status is not None:
            assert response.status == status, (path, await response.text())
    text = audit_lines.getvalue()
    lines = parsed(audit_lines)
    assert len(lines) == len(asked) - 1
    for line in lines:
        assert set(line) == FIELDS, line
        assert line["logger"] == "compactor.audit" and line["event"] == "http_read"
    summary = [
        (
            line["token_id"][:4] if line["token_id"] != "-" else "-",
            line["tenant"],
            line["scope"],
            line["route"],
            line["conversation_id"],
            line["conversation_tenant"],
            line["status"],
        )
        for line in lines
    ]
    history = "/conversations/{conversation_id}/history"
    assert summary == [
        ("tok-", "acme", "tenant", history, "acme-c0", "acme", 200),
        ("tok-", "acme", "tenant", history, "globex-c0", "acme", 403),
        ("tok-", "acme", "tenant", "/memory/search", "acme-c0", "acme", 200),
        (
            "tok-",
            None,
            "all",
            "/conversations/{conversation_id}/batches/{batch_id}",
            own.conversation_id,
            own.tenant_id,
            200,
        ),
        ("tok-", "globex", "tenant", "/memory/search", None, "globex", 200),
        ("-", None, None, history, "acme-c0", None, 401),
        ("tok-", None, None, "/conversations/{conversation_id}", "acme-c0", None, 401),
    ]
    # One token, one id; another token, another id.
    ids = [line["token_id"] for line in lines]
    assert ids[0] == ids[1] == ids[2] and len({ids[0], ids[3], ids[4], ids[6]}) == 4
    assert ids[6] == audit.token_id(b"wrong-token-0123456789abcdef")
    for secret in (ACME, ADMIN, GLOBEX, METRICS, "wrong-token-0123456789abcdef"):
        assert secret not in text
    for words in ("acmesecret7", "globexsecret1", "word3", "secret", "Summary"):
        assert words not in text


async def test_every_view_reads_with_the_tokens_scope(
    site_client: tuple[Site, TestClient[Any, Any]],
) -> None:
    site, client = site_client
    site.store.read_scopes.clear()
    batch_id = next(b for b, s in site.store.batches.items() if s.conversation_id == "acme/acme-c0")
    for token in (ACME, ADMIN):
        for path in (
            "/conversations/acme-c0/history?tenant_id=acme",
            f"/conversations/acme-c0/batches/{batch_id}?tenant_id=acme",
            "/memory/search?q=acmesecret1&conversation_id=acme-c0&tenant_id=acme",
            "/memory/search?q=acmesecret1&tenant_id=acme",
        ):
            response = await client.get(path, headers=bearer(token))
            assert response.status == 200, (path, await response.text())
    reads = site.store.read_scopes
    assert {name for name, _ in reads} >= {"load_history", "expand_batch", "memory_read"}
    assert None not in {scope for _, scope in reads}, reads
    assert {scope for _, scope in reads} == {ReadScope.of_tenant("acme"), ReadScope.everything()}


async def test_a_view_that_forgot_its_tenant_check_still_reads_nothing_of_another_tenant(
    site_client: tuple[Site, TestClient[Any, Any]],
) -> None:
    """The store enforces the scope beneath the views (as row-level security does in
    PostgreSQL): asked with acme's scope for globex's rows, it has none."""
    site, _ = site_client
    store, acme = site.store, ReadScope.of_tenant("acme")
    globex = "globex/globex-c0"
    globex_batch = next(b for b, s in store.batches.items() if s.conversation_id == globex)
    assert await store.history.load_history(globex, scope=acme) == []
    assert await store.archive.expand_batch(globex, globex_batch, scope=acme) is None
    result = await store.memory.memory_read("globexsecret1 acmesecret1", limit=20, scope=acme)
    assert result.hits
    assert {h.conversation_id for h in result.hits} <= {"acme/acme-c0", "acme/acme-c1"}
    assert await store.history.load_history(globex, scope=ReadScope.everything())


def test_read_scopes_are_one_tenant_or_all() -> None:
    assert ReadScope.everything().sees(None) and ReadScope.everything().sees("acme")
    assert ReadScope.of_tenant("acme").sees("acme")
    assert not ReadScope.of_tenant("acme").sees("globex")
    assert not ReadScope.of_tenant("acme").sees(None)
    for bad in ({}, {"tenant": "acme", "all_tenants": True}):
        with pytest.raises(ValueError):
            ReadScope(**bad)


def test_install_adds_one_json_handler_that_does_not_propagate() -> None:
    first = audit.install()
    assert audit.install() is first
    logger = logging.getLogger(audit.AUDIT_LOGGER)
    assert logger.propagate is False
    assert sum(getattr(h, "compactor_audit", False) for h in logger.handlers) == 1
