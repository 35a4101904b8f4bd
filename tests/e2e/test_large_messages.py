"""Turns of ``max_content_chars`` are ingested and compacted without stalling the worker.

Why: one tenant's conversation of large turns (pasted logs) blocked the worker's
event loop while it was compacted, the loop that also runs every consumer's
heartbeat and the probes: ``/livez`` took up to 6.8 s with turns of 200,000
characters, and turns of 900,000 drifted Faust's timers by 37 s, past Kafka's
session timeout (issue 29). The specifics ledger compared every mention of a
turn with every other (quadratic in a log's mentions), and the planning's pure
steps ran on the loop. Now each step's work per turn is bounded and the steps
proportional to content run in a worker thread; ``/livez`` is polled from
another process every 20 ms throughout, and every answer must come within
250 ms.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import T0, Stack, eventually
from tests.support.llm_server import ChatRequest, LLMTestServer, turn_words
from tests.support.loop_probe import LivezProbe

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

TURN_CHARS = 1_000_000  # [service].max_content_chars, the default
TURNS = 8
LIVEZ_LIMIT = float(os.environ.get("I29A_LIVEZ_LIMIT", "0.25"))
TENANT = "acme"
CONVERSATION = "conv-large"
# A budget that 5 such turns exceed (0.5 × 2,000,000 = 1,000,000 tokens, 250,000 a turn).
LARGE_BUDGET = {"context_budget": 0.5, "model_max_tokens": 2_000_000}


def pasted_log(n: int, chars: int = TURN_CHARS) -> str:
    """A log pasted into a turn: every line states specifics (times, paths, ids,
    amounts, commits), the worst case for the specifics ledger."""
    rng = random.Random(n)
    lines, size, i = [], 0, 0
    while size < chars:
        line = (
            f"2026-05-01T09:{i % 60:02d}:{(i * 7) % 60:02d}Z INFO worker-{i % 7} "
            f"/var/log/app/svc{i % 13}.log request REQ-{rng.randint(1000, 99999)} took "
            f"{rng.randint(1, 999)} ms for Alice status=200 path=/api/v1/items/"
            f"{rng.randint(1, 9999)} commit {rng.getrandbits(32):08x}\n"
        )
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)[:chars]


def turn(n: int) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "message_id": f"{CONVERSATION}-m{n:04d}",
        "conversation_id": CONVERSATION,
        "tenant_id": TENANT,
        "role": "user" if n % 2 == 0 else "assistant",
        "content": pasted_log(n),
        "created_at": (T0 + timedelta(seconds=30 * n)).isoformat(),
    }


def short_summary(request: ChatRequest) -> str:
    """Reads nothing of the request: the stand-in's cost stays out of the test's loop."""
    return f"Summary: the deploy's logs were pasted and read ({turn_words(request)})."


@pytest.fixture
async def llm() -> AsyncIterator[LLMTestServer]:
    async with LLMTestServer(responder=short_summary) as server:
        yield server


@pytest.fixture
async def large_stack(
    kafka_bootstrap: str, pg_database: str, llm: LLMTestServer, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose messages topic takes records of max_content_chars."""
    stack = Stack(bootstrap=kafka_bootstrap, dsn=pg_database, llm=llm, root=tmp_path)
    await stack.open(messages_configs={"max.message.bytes": str(4 * 1024 * 1024)})
    try:
        yield stack
    finally:
        await stack.close()


async def stored_and_compacted(stack: Stack, probe: LivezProbe, worker: Any) -> dict[str, Any]:
    """Every turn stored (live or archived), at least one compaction applied, nothing
    outstanding and the table equal to PostgreSQL; the probe's limit held so far."""
    probe.check(LIVEZ_LIMIT)
    key = f"{TENANT}/{CONVERSATION}"
    # A turn is live (whole, or as an offloaded preview), archived, or both (its
    # full content archived behind the preview): every one of them is kept.
    kept = await stack.db.fetchval(
        """
        SELECT count(*) FROM (
            SELECT id FROM messages WHERE conversation_id = $1 AND kind = 'message'
            UNION SELECT id FROM archived_messages WHERE conversation_id = $1
        ) AS turns
        """,
        key,
    )
    compactions = await stack.db.fetchval(
        "SELECT count(*) FROM compactions WHERE conversation_id = $1", key
    )
    assert kept == TURNS and compactions > 0, (kept, compactions)
    status, entry = await worker.get(f"/conversations/{CONVERSATION}?tenant_id={TENANT}")
    total, rows = await stack.pg_tally(key)
    assert status == 200 and entry["compaction_outstanding"] is None, entry
    assert (entry["token_total"], entry["message_count"]) == (total, rows), (entry, total, rows)
    return dict(entry)


async def test_turns_of_max_content_chars_are_compacted_while_livez_answers_within_250ms(
    large_stack: Stack,
) -> None:
    stack = large_stack
    worker = stack.worker(
        "w1",
        config={
            "summarization": {"provider": "extractive", "keep_recent": 2, "timeout_seconds": 60.0},
            "budget": LARGE_BUDGET,
            "service": {"command_timeout_seconds": 60.0},
        },
    )
    await worker.wait_ready(stack.names.messages)
    probe = await LivezProbe(worker.url + "/livez").start()
    try:
        await eventually(_answered(probe), timeout=30, what="the probe's first answer")
        for n in range(TURNS):
            await stack.send(turn(n))
        entry = await eventually(
            lambda: stored_and_compacted(stack, probe, worker),
            timeout=400,
            what="every turn stored and compacted",
            interval=1.0,
        )
    finally:
        await probe.stop()
    probe.check(LIVEZ_LIMIT)
    assert len(probe.polls) > 100, f"only {len(probe.polls)} polls"
    assert entry["token_total"] <= 1_000_000, entry
    print(f"{len(probe.polls)} polls of /livez, the slowest {probe.slowest:.3f}s")


def _answered(probe: LivezProbe) -> Any:
    async def check() -> None:
        assert probe.polls, "no answer yet"

    return check
