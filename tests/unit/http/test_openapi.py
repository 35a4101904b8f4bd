"""The OpenAPI document and the views stay in step.

A route served without being documented (or documented without being served)
fails ``test_the_document_lists_exactly_the_routes_served``; a field a view
sends that its model does not declare fails ``test_every_answer_matches_its_schema``
(the schemas are checked strictly here: no undeclared property), and a model
changed without ``docs/openapi.json`` fails ``test_the_committed_document_is_current``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.settings import ServiceSettings
from streams.cli import main
from streams.http import openapi, ui
from tests.unit.http.test_http_security import (
    ACME,
    ADMIN,
    METRICS,
    SECURED,
    Site,
    bearer,
    compacted_site,
    settings,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
# Anything the page would load from another origin (no CDN): a src/href, a CSS url(),
# an @import or a fetch of an absolute or protocol-relative URL.
EXTERNAL = re.compile(
    r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import|fetch\(\s*["'`](https?:)?//"""
)
COMMITTED = ROOT / "docs" / "openapi.json"


def test_the_committed_document_is_current() -> None:
    expected = openapi.render(openapi.document(ServiceSettings()))
    assert COMMITTED.read_text(encoding="utf-8") == expected, (
        "run `compactor openapi --out docs/openapi.json` (no config file) and commit it"
    )


def test_compactor_openapi_prints_the_document_with_the_configs_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[service]\npage_max_limit = 77\nmax_search_limit = 9\n")
    assert main(["--config", str(config), "openapi"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["openapi"] == "3.1.0"
    history = printed["paths"]["/conversations/{conversation_id}/history"]["get"]
    limit = next(p for p in history["parameters"] if p["name"] == "limit")
    assert limit["schema"]["maximum"] == 77
    search = printed["paths"]["/memory/search"]["get"]
    assert next(p for p in search["parameters"] if p["name"] == "limit")["schema"]["maximum"] == 9


def test_the_document_is_valid_openapi_3_1() -> None:
    from schemathesis.openapi import from_dict

    schema = from_dict(openapi.document())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} == {route.path for route in openapi.ROUTES}


def served_routes(site: Site) -> set[tuple[str, str]]:
    """(method, path) of every route but HEAD (aiohttp's, with each GET) and the UI."""
    routes = site.app.web.web_app.router.routes()  # type: ignore[attr-defined]
    return {
        (route.method, route.resource.canonical)
        for route in routes
        if route.method != "HEAD" and not ui.is_ui_path(route.resource.canonical)
    }


def test_the_document_lists_exactly_the_routes_served() -> None:
    site = Site(settings(**SECURED))
    documented = {
        (method.upper(), path)
        for path, operations in openapi.document()["paths"].items()
        for method in operations
    }
    assert served_routes(site) == documented


def strict(document: dict[str, Any]) -> dict[str, Any]:
    """The document's schemas with no undeclared property allowed, so a field a view
    adds outside its model fails (clients ignore unknown fields; this test does not)."""
    doc = copy.deepcopy(document)
    pending: list[Any] = [doc["components"]["schemas"]]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node["additionalProperties"] = False
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return doc


def check_answer(
    document: dict[str, Any], path: str, status: int, body: Any, method: str = "get"
) -> None:
    responses = document["paths"][path][method]["responses"]
    assert str(status) in responses, f"{path} answered {status}, which is not documented"
    content = responses[str(status)]["content"]
    if "application/json" not in content:
        assert isinstance(body, str)
        return
    schema = {**content["application/json"]["schema"], "components": document["components"]}
    jsonschema.Draft202012Validator(schema).validate(body)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Site, TestClient[Any, Any]]]:
    site = await compacted_site(
        settings(**SECURED, metrics_token=METRICS, auth_failures_per_second=0)
    )
    async with TestClient(TestServer(site.app.web.web_app)) as client:  # type: ignore[attr-defined]
        yield site, client


async def test_every_answer_matches_its_schema(
    served: tuple[Site, TestClient[Any, Any]],
) -> None:
    _, client = served
    document = strict(openapi.document(settings().service))
    compactions = await client.get(
        "/conversations/acme-c0/compactions", params={"tenant_id": "acme"}, headers=bearer(ADMIN)
    )
    log = await compactions.json()
    assert log["compactions"], "the site's conversations are compacted"
    batch = log["compactions"][0]["batches"][0]["batch_id"]
    admin, acme, scraper = bearer(ADMIN), bearer(ACME), bearer(METRICS)
    asked: list[tuple[str, str, dict[str, str], dict[str, str], int]] = [
        # (documented path, request path, query, headers, expected status)
        (
            "/conversations/{conversation_id}",
            "/conversations/acme-c0",
            {"tenant_id": "acme"},
            admin,
            200,
        ),
        ("/conversations/{conversation_id}", "/conversations/nope", {}, acme, 404),
        (
            "/conversations/{conversation_id}/history",
            "/conversations/acme-c0/history",
            {"limit": "3"},
            acme,
            200,
        ),
        (
            "/conversations/{conversation_id}/history",
            "/conversations/acme-c0/history",
            {"limit": "0"},
            acme,
            400,
        ),
        (
            "/conversations/{conversation_id}/history",
            "/conversations/acme-c0/history",
            {"tenant_id": "globex"},
            acme,
            403,
        ),
        ("/conversations/{conversation_id}/history", "/conversations/acme-c0/history", {}, {}, 401),
        *(
            (
                "/conversations/{conversation_id}/context",
                "/conversations/acme-c0/context",
                {"format": shape, "fit": fit},
                acme,
                200,
            )
            for shape in ("messages", "openai", "anthropic")
            for fit in ("budget", "none")
        ),
        (
            "/conversations/{conversation_id}/context",
            "/conversations/acme-c0/context",
            {"through": "never-sent", "wait_ms": "10"},
            acme,
            409,
        ),
        (
            "/conversations/{conversation_id}/context",
            "/conversations/acme-c0/context",
            {"after": "x:1"},
            acme,
            400,
        ),
        ("/conversations/{conversation_id}/context", "/conversations/nope/context", {}, acme, 404),
        (
            "/conversations/{conversation_id}/compactions",
            "/conversations/acme-c1/compactions",
            {},
            acme,
            200,
        ),
        (
            "/conversations/{conversation_id}/compactions",
            "/conversations/nope/compactions",
            {},
            acme,
            404,
        ),
        (
            "/conversations/{conversation_id}/batches/{batch_id}",
            f"/conversations/acme-c0/batches/{batch}",
            {"limit": "2"},
            acme,
            200,
        ),
        (
            "/conversations/{conversation_id}/batches/{batch_id}",
            "/conversations/acme-c0/batches/nope",
            {},
            acme,
            404,
        ),
        ("/memory/search", "/memory/search", {"q": "acmesecret1", "tenant_id": "acme"}, admin, 200),
        ("/memory/search", "/memory/search", {"q": "acmesecret1", "sources": "all"}, acme, 400),
        ("/tenants/{tenant}/usage", "/tenants/acme/usage", {}, acme, 200),
        ("/tenants/{tenant}/usage", "/tenants/acme/usage", {"since": "yesterday"}, admin, 400),
        ("/tenants/{tenant}/usage", "/tenants/globex/usage", {}, acme, 403),
        ("/openapi.json", "/openapi.json", {}, acme, 200),
        ("/healthz", "/healthz", {}, scraper, 200),
        ("/healthz", "/healthz", {}, admin, 401),
        ("/metrics", "/metrics", {}, scraper, 200),
        ("/livez", "/livez", {}, {}, 200),
        ("/readyz", "/readyz", {}, {}, 503),  # never started: not ready, in its schema
    ]
    posted: list[tuple[str, str, dict[str, str], dict[str, str], int]] = [
        (
            "/conversations/{conversation_id}/recompact",
            "/conversations/acme-c0/recompact",
            {"tenant_id": "acme", "request_id": "r-1"},
            admin,
            202,
        ),
        ("/conversations/{conversation_id}/recompact", "/conversations/c/recompact", {}, acme, 403),
        (
            "/conversations/{conversation_id}/restore",
            "/conversations/acme-c0/restore",
            {"tenant_id": "acme", "batch_id": batch},
            admin,
            202,
        ),
        (
            "/conversations/{conversation_id}/restore",
            "/conversations/acme-c0/restore",
            {"tenant_id": "a/b"},
            admin,
            400,
        ),
        (
            "/conversations/{conversation_id}/messages/{message_id}/pin",
            "/conversations/acme-c0/messages/acme-c0-m0039/pin",
            {"tenant_id": "acme"},
            admin,
            200,
        ),
        (
            "/conversations/{conversation_id}/messages/{message_id}/unpin",
            "/conversations/acme-c0/messages/nope/unpin",
            {"tenant_id": "acme"},
            admin,
            404,
        ),
    ]
    for method, cases in (("get", asked), ("post", posted)):
        for documented, path, query, headers, status in cases:
            answer = await client.request(method, path, params=query, headers=headers)
            assert answer.status == status, (path, query, await answer.text())
            is_json = answer.content_type == "application/json"
            body = await answer.json() if is_json else await answer.text()
            check_answer(document, documented, answer.status, body, method)
            if documented == "/memory/search" and status == 200:
                assert body["hits"] and body["hits"][0]["turns"], "a hit with turns was checked"
    assert set(openapi.document()["paths"]) == {documented for documented, *_ in asked + posted}


def test_a_field_outside_the_model_fails_the_strict_check() -> None:
    document = strict(openapi.document())
    body = {"error": "x", "stack": "where it broke"}
    with pytest.raises(jsonschema.ValidationError, match="stack"):
        check_answer(document, "/memory/search", 400, body)


async def test_the_inspector_page_is_served_without_a_token_and_holds_no_data(
    served: tuple[Site, TestClient[Any, Any]],
) -> None:
    _, client = served
    for name in ui.asset_names():
        answer = await client.get(f"/ui/{name}")
        assert answer.status == 200, name
        assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
        text = await answer.text()
        assert not EXTERNAL.search(text), f"{name} loads something from elsewhere"
    page = await client.get("/ui/")
    assert page.status == 200 and "compactor inspector" in await page.text()
    redirect = await client.get("/ui", allow_redirects=False)
    assert redirect.status == 308 and redirect.headers["Location"] == "/ui/"
    assert (await client.get("/ui/secrets.txt")).status == 404
    assert (await client.get("/ui/../openapi.json")).status == 401


def test_every_query_parameter_a_view_reads_is_declared() -> None:
    """A view that starts reading a query parameter no ``Params`` model declares fails
    here (the document would not tell clients, nor schemathesis, about it)."""
    read: set[str] = set()
    for module in sorted((ROOT / "streams" / "http").glob("*.py")):
        read |= set(re.findall(r"query\.get\(\s*\"(\w+)\"", module.read_text()))
    declared = {
        parameter["name"]
        for path in openapi.document()["paths"].values()
        for operation in path.values()
        for parameter in operation["parameters"]
        if parameter["in"] == "query"
    }
    assert read, "the scan found no parameter: the pattern no longer matches the views"
    assert read <= declared, f"read but not declared: {sorted(read - declared)}"
