"""What compactions cost, per tenant, and a tenant's daily LLM budget, end to end.

Why: a chat platform bills its tenants and must keep one tenant's burst from
spending everyone's provider budget. Each compaction records its LLM calls and
tokens (in PostgreSQL and in its clip-archive event); `GET
/tenants/{tenant}/usage` and `compactor usage` sum them by tenant and day; and
a tenant whose `[[tenants]] llm_tokens_per_day` is spent is compacted by the
extractive summariser (its histories still fit) until the next UTC day.
"""

from __future__ import annotations

import json

import pytest

from core.domain.tenancy import conversation_key
from tests.e2e.conftest import BUDGET_TOKENS, Conversation, Stack, eventually, interleave
from tests.e2e.test_erase import compactor
from tests.support.metrics_text import metric

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

ADMIN = "e2e-usage-admin-token-0123456789"
LEAN = "e2e-usage-lean-token-0123456789"
# lean may use one LLM token a day: its first compaction starts under that and
# spends it, every later one falls back. rich has no limit.
TENANTS = [{"id": "lean", "llm_tokens_per_day": 1}, {"id": "rich"}]


async def test_usage_is_recorded_per_tenant_and_a_spent_budget_falls_back(stack: Stack) -> None:
    worker = stack.worker(
        "w1",
        config={"service": {"api_tokens": [ADMIN]}},
        env={
            "COMPACTOR_TENANTS": json.dumps(TENANTS),
            "COMPACTOR_SERVICE__TOKENS": json.dumps([{"token": LEAN, "tenant": "lean"}]),
        },
    )
    worker.token = ADMIN
    await worker.wait_ready(stack.names.messages)

    rich = Conversation("chat-1", "orchard")
    first, second = Conversation("chat-1", "lantern"), Conversation("chat-2", "quarry")
    await stack.send_all(
        interleave(
            [{**e, "tenant_id": "rich"} for e in rich.until_over(0)],
            [{**e, "tenant_id": "lean"} for e in first.until_over(0)],
        )
    )
    await stack.wait_for_clip_events(
        {conversation_key("rich", "chat-1"): 1, conversation_key("lean", "chat-1"): 1}, timeout=90
    )
    await stack.send_all([{**e, "tenant_id": "lean"} for e in second.until_over(0)])
    events = await stack.wait_for_clip_events({conversation_key("lean", "chat-2"): 1}, timeout=90)

    usage = {e.conversation_key: e.usage for e in events.values()}
    for key in ("rich/chat-1", "lean/chat-1"):
        spent = usage[key]
        assert spent is not None and spent.summarizer == "openai" and not spent.fallback, key
        assert spent.calls >= 1 and spent.input_tokens > 0 and spent.output_tokens > 0, key
    fallback = usage["lean/chat-2"]
    assert fallback is not None and fallback.summarizer == "extractive" and fallback.fallback
    assert fallback.calls == 0 and fallback.input_tokens == 0
    # The fallback kept the history within its budget all the same.
    total, _ = await stack.pg_tally("lean/chat-2")
    assert total <= BUDGET_TOKENS

    async def summed() -> None:
        status, body = await worker.get("/tenants/lean/usage")
        assert status == 200, body
        assert body["total"]["compactions"] == 2 and body["total"]["fallback_compactions"] == 1
        assert body["total"]["input_tokens"] == usage["lean/chat-1"].input_tokens  # type: ignore[union-attr]

    await eventually(summed, timeout=20, what="lean's usage summed")
    status, body = await worker.get("/tenants/rich/usage")
    assert status == 200 and body["total"]["compactions"] == 1
    assert body["total"]["llm_calls"] == usage["rich/chat-1"].calls  # type: ignore[union-attr]
    assert (await worker.get("/tenants/lean/usage", token=LEAN))[0] == 200  # its own
    assert (await worker.get("/tenants/rich/usage", token=LEAN))[0] == 403  # not another's
    text = await worker.metrics_text()
    assert metric(text, "compactor_tenant_budget_fallbacks_total") >= 1

    code, out, err = await compactor(stack, "usage", "--tenant", "lean", "--json")
    assert code == 0, err
    printed = json.loads(out)
    assert printed["total"]["compactions"] == 2 and printed["total"]["fallback_compactions"] == 1
