"""HTTP security with real workers: tokens across a forwarded request, two tenants
using the same conversation ids through every view, erase end to end, signed
producers, and no secret in any log line.

Why: the token table is partitioned, so ``/conversations/{id}`` asked of the
wrong worker is forwarded to the owner, which must apply the same principal
(signed by the entry worker) and tenant rule. A conversation is (tenant, id):
two tenants' "shared-0" must stay two conversations from the message topic to
the views and the erase. And the only proof that a secret never reaches a log
is a worker that ran with every secret set, whose every log line is searched.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.adapters.postgres.privacy import KEPT_TABLES
from core.domain.tenancy import conversation_key
from core.settings import ServiceSettings
from streams.events import EraseRequest
from streams.http.auth import Principal
from streams.http.forwarding import SIGNATURE_HEADER, Forwarding, internal_key, node_of
from tests.e2e.conftest import PARTITIONS, Conversation, Stack, eventually, interleave
from tests.support.worker import WorkerProcess, render_toml, wait_for_split

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

ADMIN = "e2e-admin-token-0123456789"
ENV_TOKEN = "e2e-env-token-0123456789"
ACME = "e2e-acme-token-0123456789"
GLOBEX = "e2e-globex-token-0123456789"
METRICS = "e2e-metrics-token-0123456789"
LLM_KEY = "sk-e2e-llm-key-0123456789abcdef"
# Forwarded requests carry a principal signed with this, not the caller's token.
INTERNAL = "e2e-internal-token-0123456789"
SECRETS = (ADMIN, ENV_TOKEN, ACME, GLOBEX, METRICS, LLM_KEY, INTERNAL)

SECURED: dict[str, dict[str, Any]] = {
    "summarization": {"api_key_env": "E2E_LLM_KEY"},
    "service": {
        "api_tokens": [ADMIN],
        "metrics_token": METRICS,
        "internal_token": INTERNAL,
        # This test fails authentication on purpose 64 times from one address; the
        # slow-down of failed authentications has its own test.
        "auth_failures_per_second": 0,
    },
}
TOKENS_TOML = f"""
[[service.tokens]]
token = "{ACME}"
tenant = "acme"

[[service.tokens]]
token = "{GLOBEX}"
tenant = "globex"
"""
ENV = {"E2E_LLM_KEY": LLM_KEY, "COMPACTOR_API_TOKENS": ENV_TOKEN}


def secured_worker(stack: Stack, name: str) -> WorkerProcess:
    config = {section: dict(values) for section, values in stack.config().items()}
    for section, values in SECURED.items():
        config.setdefault(section, {}).update(values)
    worker = WorkerProcess(
        stack.root,
        name,
        bootstrap=stack.bootstrap,
        dsn=stack.dsn,
        config=config,
        env=ENV,
        extra_toml=TOKENS_TOML,
    )
    worker.token, worker.operations_token = ADMIN, METRICS
    stack.workers.append(worker)
    return worker.start()


async def test_tokens_and_tenants_hold_across_forwarded_requests_and_erase_forgets(
    stack: Stack,
) -> None:
    w1 = secured_worker(stack, "w1")
    await w1.wait_ready(stack.names.messages)
    w2 = secured_worker(stack, "w2")
    owned = await wait_for_split([w1, w2], stack.names.messages, PARTITIONS)
    assert all(owned)
    # The same ids under both tenants: four conversations each, two tenants' apart.
    conversations = {
        conversation_key(tenant, f"shared-{n}"): (
            tenant,
            f"shared-{n}",
            Conversation(f"shared-{n}", f"{tenant}marker{n}"),
        )
        for tenant in ("acme", "globex")
        for n in range(4)
    }
    batches = [
        [{**event, "tenant_id": tenant} for event in conversation.until_over(0)]
        for tenant, _, conversation in conversations.values()
    ]
    await stack.send_all(interleave(*batches))
    await stack.wait_for_clip_events(dict.fromkeys(conversations, 1), timeout=90)
    tokens = {"acme": ACME, "globex": GLOBEX}

    async def all_answer() -> None:
        for tenant, cid, _ in conversations.values():
            for worker in (w1, w2):
                status, body = await worker.get(f"/conversations/{cid}", token=tokens[tenant])
                assert status == 200, (worker.name, cid, status, body)

    await eventually(all_answer, timeout=30, what="every conversation answers on both workers")
    forwarded = 0
    for tenant, cid, _ in conversations.values():
        other = "globex" if tenant == "acme" else "acme"
        for worker in (w1, w2):
            # Half of these are forwarded: the owner authenticates the signed principal.
            for path in (f"/conversations/{cid}", f"/conversations/{cid}/history"):
                status, body = await worker.get(f"{path}?tenant_id={tenant}", token=ENV_TOKEN)
                assert status == 200 and body["tenant_id"] == tenant, (worker.name, path, body)
                status, body = await worker.get(path, token=tokens[tenant])
                assert status == 200 and body["tenant_id"] == tenant, (worker.name, path, body)
                assert f"{other}marker" not in json.dumps(body)
                status, body = await worker.get(f"{path}?tenant_id={tenant}", token=tokens[other])
                assert status == 403 and f"{tenant}marker" not in json.dumps(body)
                for bad in ("", "e2e-wrong-token-0123456789"):
                    status, body = await worker.get(path, token=bad or "-")
                    assert status == 401 and body == {
                        "error": "unauthorized: a valid bearer token is required"
                    }
            forwarded += 1
        status, body = await w1.get(
            "/memory/search",
            {"q": f"{tenant}marker0 {other}marker0", "conversation_id": cid},
            token=tokens[tenant],
        )
        assert status == 200 and f"{other}marker" not in json.dumps(body)
        assert {h["tenant_id"] for h in body["hits"]} <= {tenant}
        status, _ = await w2.get(
            "/memory/search", {"q": "x", "tenant_id": other}, token=tokens[tenant]
        )
        assert status == 403
    assert forwarded == 2 * len(conversations)

    # An EraseRequest on the control topic erases nothing any more (dead-lettered).
    forged = EraseRequest(
        request_id="forged",
        conversation_id="shared-1",
        tenant_id="acme",
        requester="anyone",
        reason="forged",
        requested_at=datetime.now(UTC),
    )
    await stack.producer.send(
        stack.names.control, forged.model_dump_json().encode(), key=b"shared-1"
    )
    # Erase acme's shared-0 through the erase-requests topic, as `compactor erase` does:
    # globex's shared-0 stays.
    doomed = conversation_key("acme", "shared-0")
    request = EraseRequest(
        request_id="e2e-erase-1",
        conversation_id="shared-0",
        tenant_id="acme",
        requester="e2e",
        reason="security test",
        requested_at=datetime.now(UTC),
    )
    await stack.producer.send(
        stack.names.erasures, request.model_dump_json().encode(), key=b"shared-0"
    )

    async def erased() -> None:
        for worker in (w1, w2):
            assert (await worker.get("/conversations/shared-0", token=ACME))[0] == 404
        tables = await stack.db.fetch(
            "SELECT table_name FROM information_schema.columns "
            "WHERE column_name = 'conversation_id' AND table_schema = 'public'"
        )
        for row in tables:
            if row["table_name"] in KEPT_TABLES:  # ids, offsets, times: what keeps it erased
                continue
            count = await stack.db.fetchval(
                f"SELECT count(*) FROM {row['table_name']} WHERE conversation_id = $1", doomed
            )
            assert count == 0, row["table_name"]
        tombstones = [
            r for r in stack.clip_archives.records if r.key == doomed.encode() and r.value is None
        ]
        assert tombstones

    await eventually(erased, timeout=30, what="the erased conversation is gone")
    assert (await w1.get("/conversations/shared-1", token=ACME))[0] == 200
    assert (await w1.get("/conversations/shared-0", token=GLOBEX))[0] == 200  # globex's own
    assert (
        await stack.db.fetchval(
            "SELECT count(*) FROM erase_audit WHERE conversation_id = $1", doomed
        )
        == 1
    )
    assert await stack.db.fetchval("SELECT count(*) FROM erase_audit") == 1

    for worker in (w1, w2):
        await worker.stop_async()
    for worker in (w1, w2):
        text = worker.log_text()
        assert text, f"{worker.name} wrote no log"
        for secret in SECRETS:
            assert secret not in text, f"a secret is in {worker.name}'s log"


async def _raw_get(url: str, headers: dict[str, str]) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(url, headers=headers) as response,
    ):
        return response.status


async def test_a_replayed_forwarded_request_is_refused_and_plain_http_is_not_served(
    stack: Stack,
) -> None:
    """A real worker: a forwarded request signed for it is served once, refused when
    sent again and when signed for another worker; a signature that is not ASCII is
    401, never 500. And the worker refuses to serve its tokens over plain HTTP beyond
    loopback, before it connects to anything."""
    w1 = secured_worker(stack, "w1")
    await w1.wait_ready(stack.names.messages)
    conversation = Conversation("replayed-0", "replaymarker")
    await stack.send_all(conversation.message(tenant_id="acme") for _ in range(3))

    async def stored() -> None:
        assert (await w1.get("/conversations/replayed-0", token=ACME))[0] == 200

    await eventually(stored, timeout=30, what="the conversation answers")
    signer = Forwarding(internal_key(ServiceSettings(internal_token=INTERNAL), None))
    path = "/conversations/replayed-0?tenant_id=acme"
    captured = signer.sign(Principal(None), "GET", path, node_of(w1.url))
    assert await _raw_get(w1.url + path, captured) == 200
    assert await _raw_get(w1.url + path, captured) == 401  # sent again
    elsewhere = signer.sign(Principal(None), "GET", path, "127.0.0.1:1")
    assert await _raw_get(w1.url + path, elsewhere) == 401  # signed for another worker
    fresh = signer.sign(Principal(None), "GET", path, node_of(w1.url))
    not_ascii = {**fresh, SIGNATURE_HEADER: fresh[SIGNATURE_HEADER][:-2] + "é"}
    statuses = [await _raw_get(w1.url + path, not_ascii) for _ in range(5)]
    assert statuses == [401] * 5
    assert w1.alive

    # Tokens configured, every interface, no TLS: exit 2 naming the opt-in.
    config = {section: dict(values) for section, values in stack.config().items()}
    config.setdefault("service", {}).update(
        {**SECURED["service"], "web_host": "0.0.0.0", "data_dir": str(stack.root / "plain")}
    )
    config_path = stack.root / "plain.toml"
    config_path.write_text(render_toml(config), encoding="utf-8")
    compactor = Path(sys.executable).parent / "compactor"
    refused = await asyncio.to_thread(
        subprocess.run,
        [str(compactor), "worker"],
        env={
            **os.environ,
            **ENV,
            "COMPACTOR_CONFIG": str(config_path),
            "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap,
            "POSTGRES_DSN": stack.dsn,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert "allow_plaintext_http" in refused.stderr and "tls_certfile" in refused.stderr
    for secret in SECRETS:
        assert secret not in refused.stdout + refused.stderr
