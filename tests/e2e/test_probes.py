"""``/livez`` and ``/readyz`` of a real worker process (streams/http/probes.py).

Why: the unit tests serve the probes from a Faust app that never starts, so
what "agents running" reads of Faust's agents (``started``, their actors'
tasks) and when ``in_recovery`` and the assignment settle are only seen here:
a started worker must report every agent running, become ready once it owns
partitions, and answer both probes without a token while ``/healthz`` keeps
its ``metrics_token``.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import Conversation, Stack, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(150)]

ADMIN = "e2e-probe-admin-token-0123456789"
METRICS = "e2e-probe-metrics-token-0123456789"


async def test_a_worker_is_live_with_its_agents_running_and_ready_once_it_owns_partitions(
    stack: Stack,
) -> None:
    worker = stack.worker(
        "probed", config={"service": {"api_tokens": [ADMIN], "metrics_token": METRICS}}
    )
    worker.token, worker.operations_token = ADMIN, METRICS

    async def probe(path: str) -> tuple[int, Any]:
        try:
            return await worker.get(path, timeout=3.0, token="")  # no token at all
        except (aiohttp.ClientError, TimeoutError) as error:
            raise AssertionError(f"{path}: the web server does not answer yet: {error}") from None

    async def running() -> dict[str, Any]:
        status, body = await probe("/livez")
        assert status == 200, body
        assert body["agents"] and set(body["agents"].values()) == {"running"}, body
        return dict(body)

    live = await eventually(running, timeout=60, what="/livez with every agent running")
    assert live["status"] == "alive" and live["reasons"] == []

    async def ready() -> dict[str, Any]:
        status, body = await probe("/readyz")
        assert status == 200, body
        return dict(body)

    body = await eventually(ready, timeout=60, what="/readyz 200")
    assert body["status"] == "ready" and body["reasons"] == []
    assert body["assigned_partitions"] > 0

    # Ready means served: a conversation sent now is answered by the worker.
    conversation = Conversation("conv-probed", "lantern")
    await stack.send_all([conversation.message() for _ in range(3)])

    async def served() -> None:
        status, found = await worker.get(f"/conversations/{conversation.id}")
        assert status == 200 and found["message_count"] == 3, (status, found)

    await eventually(served, timeout=30, what="the conversation served")

    # The probes are open; /healthz still wants the metrics token.
    assert (await probe("/healthz"))[0] == 401
    assert (await worker.get("/healthz"))[0] == 200
