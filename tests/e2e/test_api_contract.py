"""The HTTP API fuzzed from its own contract, against a live worker.

schemathesis (``st run``) reads the worker's ``/openapi.json`` and sends what
the document allows and what it does not, with an admin token and with a
tenant token: no answer may be a 5xx, every answer must match the document
(status, content type, body schema), invalid input must be refused with a
4xx, and a 400 must name the parameter (``contract/hooks.py``). Ids the
worker knows (conversations of two tenants, a batch) are mixed into the
generated ones, so the fuzzing reaches the views' logic rather than only
their 404s. The same worker then answers the CLI's ``--url`` reads.

Sized for CI (a couple of minutes): ``CONTRACT_EXAMPLES`` sets the examples
per operation (default 25 for the admin token, a third of it for the tenant).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Conversation, Stack, interleave
from tests.e2e.test_security import ACME, ADMIN, secured_worker
from tests.support.worker import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

EXAMPLES = int(os.environ.get("CONTRACT_EXAMPLES", "25"))
# Operations without input (probes, metrics: their own tests cover them) are not fuzzed.
NOT_FUZZED = r"^/(livez|readyz|healthz|metrics)$"
# Checks that need resources created by the API itself (it only reads) or want every
# valid request answered 2xx (an unknown id is a 404 here, by design).
NOT_APPLICABLE = (
    "positive_data_acceptance,ensure_resource_availability,use_after_free,"
    "object_level_authorization,ignored_auth"
)


def contract_config(conversations: list[str], tenants: list[str], batch: str) -> str:
    """schemathesis.toml: known ids mixed into the generated ones."""

    def values(items: list[str]) -> str:
        return json.dumps(items)

    return f"""
[dictionaries.conversations]
values = {values(conversations)}
[dictionaries.tenants]
values = {values(tenants)}
[dictionaries.batches]
values = {values([batch])}
[dictionaries.queries]
values = ["orchid", "falcon glacier"]
[parameters]
"path.conversation_id" = {{ dictionary = "conversations", probability = 0.6 }}
"query.conversation_id" = {{ dictionary = "conversations", probability = 0.6 }}
"query.tenant_id" = {{ dictionary = "tenants", probability = 0.6 }}
"path.batch_id" = {{ dictionary = "batches", probability = 0.6 }}
"query.q" = {{ dictionary = "queries", probability = 0.5 }}
"""


def fuzz(url: str, token: str, examples: int, where: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(Path(sys.executable).parent / "st"),
        "run",
        f"{url}/openapi.json",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--exclude-checks",
        NOT_APPLICABLE,
        "--exclude-path-regex",
        NOT_FUZZED,
        "--max-examples",
        str(examples),
        "--workers",
        "1",
        "--seed",
        "19",
        "--generation-database",
        "none",
        "--no-color",
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.e2e.contract.hooks",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=300)


def summary(run: subprocess.CompletedProcess[str]) -> str:
    lines = run.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "SUMMARY" in line), len(lines) - 25)
    return "\n".join(lines[start:])


async def test_the_api_holds_its_contract_under_fuzzing_with_admin_and_tenant_tokens(
    stack: Stack, tmp_path: Path
) -> None:
    worker = secured_worker(stack, "w1")
    await worker.wait_ready(stack.names.messages)
    talks = {
        "acme": Conversation("talk-1", "orchid"),
        "globex": Conversation("talk-2", "falcon"),
        None: Conversation("talk-3", "glacier"),
    }
    events = [
        [{**event, "tenant_id": tenant} if tenant else event for event in talk.until_over(0)]
        for tenant, talk in talks.items()
    ]
    await stack.send_all(interleave(*events))
    await stack.wait_for_clip_events(
        {"acme/talk-1": 1, "globex/talk-2": 1, "talk-3": 1}, timeout=90
    )
    batch = await stack.db.fetchval(
        "SELECT id FROM archival_memory WHERE conversation_id = 'acme/talk-1' LIMIT 1"
    )
    (tmp_path / "schemathesis.toml").write_text(
        contract_config(["talk-1", "talk-2", "talk-3"], ["acme", "globex"], batch)
    )
    runs = {
        "admin token": await asyncio.to_thread(fuzz, worker.url, ADMIN, EXAMPLES, tmp_path),
        "tenant token (acme)": await asyncio.to_thread(
            fuzz, worker.url, ACME, max(5, EXAMPLES // 3), tmp_path
        ),
    }
    report = "\n\n".join(f"== schemathesis, {who}\n{summary(run)}" for who, run in runs.items())
    (tmp_path / "schemathesis-summary.txt").write_text(report)
    print(report)
    for who, run in runs.items():
        assert run.returncode == 0, f"{who}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
        assert " passed" in summary(run) and "failure" not in summary(run).lower(), who

    # The CLI's --url reads, through streams.client, as a consumer reads.
    env = {k: v for k, v in os.environ.items() if k != "COMPACTOR_CONFIG"}
    env["COMPACTOR_TOKEN"] = ACME
    history = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "streams.cli", "history", "talk-1", "--url", worker.url, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert history.returncode == 0, history.stderr
    body = json.loads(history.stdout)
    assert body["tenant_id"] == "acme" and body["clip_archive"] is not None
    assert body["messages"][0]["id"] == body["clip_archive"]["id"]
    refused = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "streams.cli", "history", "talk-2", "--url", worker.url],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert refused.returncode == 1 and "talk-2" in refused.stderr  # acme's token: not globex's
