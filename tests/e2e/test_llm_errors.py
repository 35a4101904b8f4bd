"""A failing LLM leaves history untouched, and reconciliation retries until it works.

Why: the model provider is the least reliable dependency (rate limits,
outages, hangs). A failed compaction must change nothing at all, be counted
where operators look, and be retried without anyone re-sending messages.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import KEEP_RECENT, Conversation, Stack, eventually
from tests.support.llm_server import OPENAI_CHAT_PATH, Delay, RateLimited, ServerError
from tests.support.metrics_text import label_values, metric

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(150)]

TIMEOUT = 1.0  # [summarization].timeout_seconds
RETRY_AFTER = 0.8  # well above retry_backoff_seconds (0.1): only the header explains the wait


async def test_llm_failures_leave_history_untouched_then_reconciliation_compacts(
    stack: Stack,
) -> None:
    # max_retries = 1: each chunk gets two attempts, so each compaction below
    # fails after exactly two scripted failures.
    #   compaction 1: 429 (retry-after 0.8 s), then 500          -> fails
    #   compaction 2: no answer within the timeout (twice; the
    #                 retry sends half the chunk)                 -> fails
    #   compaction 3: answers                                     -> succeeds
    stack.llm.enqueue(
        RateLimited(retry_after=RETRY_AFTER),
        ServerError(500),
        Delay(TIMEOUT * 3),
        Delay(TIMEOUT * 3),
        path=OPENAI_CHAT_PATH,
    )
    worker = stack.worker(
        "w1",
        config={
            "summarization": {"timeout_seconds": TIMEOUT, "max_retries": 1},
            "service": {"command_timeout_seconds": 5.0},
        },
    )
    await worker.wait_ready(stack.names.messages)
    conv = Conversation("conv-flaky", "lantern")
    await stack.send_all(conv.until_over(0))
    sent_total = sum(1 for _ in conv.events)

    async def history_untouched() -> None:
        count = await stack.db.fetchval(
            "SELECT count(*) FROM messages WHERE conversation_id = $1", conv.id
        )
        assert count == sent_total
        for table in ("archival_memory", "compactions", "outbox"):
            assert await stack.db.fetchval(f"SELECT count(*) FROM {table}") == 0, table
        assert stack.clip_archives.records == []

    for failures in (1, 2):

        async def failed(expected: int = failures) -> dict[str, float]:
            text = await worker.metrics_text()
            assert metric(text, "compactor_compactions_failed_total") == expected
            return label_values(text, "compactor_compactions_failed_total", "reason")

        reasons = await eventually(
            failed, timeout=30, what=f"{failures} failed compaction(s)", interval=0.1
        )
        # While the LLM fails, nothing was written: no batch, no delete, no
        # compaction row, no event. (The third attempt comes only after
        # command_timeout_seconds, so this is checked between attempts.)
        await history_untouched()
        status, entry = await worker.get(f"/conversations/{conv.id}")
        assert status == 200
        assert entry["compactions"] == 0
        assert entry["compaction_outstanding"] is not None, "still waiting for a completion"
        assert entry["message_count"] == sent_total

    assert reasons == {"model_server": 1, "model_timeout": 1}
    assert stack.llm.pending == 0

    # Reconciliation sends the same command again, and this time it works.
    await stack.wait_for_clip_events({conv.id: 1}, timeout=40)
    entries = await stack.wait_idle(worker, [conv.id], timeout=20)
    assert entries[conv.id]["compactions"] == 1
    assert entries[conv.id]["message_count"] == KEEP_RECENT + 1
    compactions = await stack.pg_compactions()
    assert len(compactions) == 1
    # The same compaction id throughout: the command was re-sent, not re-issued.
    (event,) = stack.clip_events().values()
    assert compactions[0]["compaction_id"] == event.compaction_id == entry["compaction_outstanding"]

    async def counted() -> None:
        text = await worker.metrics_text()
        assert metric(text, "compactor_compactions_failed_total") == 2
        assert metric(text, "compactor_compactions_succeeded_total") == 1
        assert label_values(text, "compactor_commands_issued_total", "reason") == {
            "over_budget": 1,
            "reconcile": 2,
        }

    await eventually(counted, timeout=10, what="metrics")

    # What the server saw: the retry after the 429 waited for retry-after, and
    # the retry after a timeout asked about half as many messages.
    chats = stack.llm.requests_to(OPENAI_CHAT_PATH)
    assert chats[1].received_at - chats[0].received_at >= RETRY_AFTER * 0.95
    first, half = (len(r.body["messages"]) for r in chats[2:4])
    assert half < first
