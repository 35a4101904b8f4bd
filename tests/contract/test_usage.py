"""``UsageStore``: what compactions cost, by tenant and UTC day, recorded with each
compaction; a tenant's LLM tokens leave out what no LLM processed."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from core.domain.usage import LlmUsage
from core.ports.storage import Applied, Erasure, ReadScope
from tests.support.plans import make_plan, msg, save_all, stored

LLM = LlmUsage(
    summarizer="anthropic",
    model="claude-haiku-4-5",
    calls=3,
    input_tokens=900,
    output_tokens=120,
    cache_read_tokens=4000,
    cache_write_tokens=500,
    cost_usd=0.00249,
)
EXTRACTIVE = LlmUsage(calls=2, input_tokens=700, output_tokens=90, cost_usd=0.0, fallback=True)


async def compacted(store: Any, conversation: str, compaction_id: str, usage: LlmUsage) -> None:
    messages = [msg(i, f"turn {i}", conversation_id=conversation) for i in range(3)]
    await save_all(store, messages)
    batch = stored(compaction_id, 0, "a summary of turn 1", messages, conversation_id=conversation)
    plan = make_plan(compaction_id, [batch], [m.id for m in messages], conversation_id=conversation)
    assert await store.compactions.apply_compaction(plan.model_copy(update={"usage": usage})) == (
        Applied()
    )


async def test_usage_by_day_sums_per_tenant_in_the_read_scope(store: Any) -> None:
    await compacted(store, "acme/c1", "cmp-1", LLM)
    await compacted(store, "acme/c2", "cmp-2", EXTRACTIVE)
    await compacted(store, "globex/c1", "cmp-3", LLM)
    everything = await store.usage.usage_by_day(scope=ReadScope.everything())
    assert [(d.tenant_id, d.compactions) for d in everything] == [("acme", 2), ("globex", 1)]
    (acme,) = await store.usage.usage_by_day(scope=ReadScope.of_tenant("acme"))
    assert (acme.llm_calls, acme.input_tokens, acme.fallback_compactions) == (5, 1600, 1)
    assert acme.cost_usd == pytest.approx(0.00249) and acme.day == datetime.now(UTC).date()
    # acme's scope sees nothing of globex, whatever it asks for.
    acme_scope = ReadScope.of_tenant("acme")
    assert await store.usage.usage_by_day(scope=acme_scope, tenant_id="globex") == []
    (globex,) = await store.usage.usage_by_day(scope=ReadScope.everything(), tenant_id="globex")
    assert globex.compactions == 1
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    assert await store.usage.usage_by_day(scope=ReadScope.everything(), since=tomorrow) == []
    assert await store.usage.usage_by_day(scope=ReadScope.everything(), since=date(2000, 1, 1))


async def test_a_tenants_llm_tokens_count_no_extractive_compaction(store: Any) -> None:
    await compacted(store, "acme/c1", "cmp-1", LLM)
    await compacted(store, "acme/c2", "cmp-2", EXTRACTIVE)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert await store.usage.tenant_llm_tokens("acme", today) == LLM.total_tokens
    assert await store.usage.tenant_llm_tokens("acme", today + timedelta(days=1)) == 0
    assert await store.usage.tenant_llm_tokens("globex", today) == 0


async def test_a_failed_compactions_spend_is_counted_by_tenant_and_scope(store: Any) -> None:
    """Issue 29: a compaction that spent LLM tokens and failed is a content-free row,
    in its tenant's budget and usage, seen through the read scope like the others."""
    await compacted(store, "acme/c1", "cmp-1", LLM)
    today = datetime.now(UTC).date()
    await store.usage.record_failed_spend("acme", LLM, today)
    await store.usage.record_failed_spend("acme", EXTRACTIVE, today)
    await store.usage.record_failed_spend("globex", LLM, today)
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert await store.usage.tenant_llm_tokens("acme", start) == 2 * LLM.total_tokens
    assert await store.usage.tenant_llm_tokens("acme", start + timedelta(days=1)) == 0
    (acme,) = await store.usage.usage_by_day(scope=ReadScope.of_tenant("acme"))
    assert (acme.compactions, acme.failed_compactions) == (1, 2)
    assert (acme.llm_calls, acme.input_tokens) == (8, 2500)
    assert acme.cost_usd == pytest.approx(2 * 0.00249)
    (globex,) = await store.usage.usage_by_day(scope=ReadScope.of_tenant("globex"))
    assert (globex.compactions, globex.failed_compactions) == (0, 1)
    assert await store.usage.usage_by_day(scope=ReadScope.of_tenant("initech")) == []


async def test_an_erase_keeps_the_usage_and_the_budget_spent_without_the_conversation(
    store: Any,
) -> None:
    """Issue 29: an erase deleted the conversation's compactions rows, refunding the
    day's tenant budget and removing its usage history. Now their sums stay, per
    tenant and day, without the conversation; a repeated erase adds nothing."""
    await compacted(store, "acme/c1", "cmp-1", LLM)
    await compacted(store, "acme/c2", "cmp-2", EXTRACTIVE)
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    before = await store.usage.usage_by_day(scope=ReadScope.everything())
    spent = await store.usage.tenant_llm_tokens("acme", start)
    for request_id in ("req-1", "req-1", "req-2"):  # redelivered, then erased again
        erasure = Erasure(
            request_id=request_id,
            requester="ops",
            reason="asked",
            requested_at=datetime.now(UTC),
            erased_at=datetime.now(UTC),
            offsets={},
        )
        await store.privacy.erase_conversation("acme/c1", erasure)
    assert not await store.compactions.compaction_applied("cmp-1")
    assert await store.usage.usage_by_day(scope=ReadScope.everything()) == before
    assert await store.usage.usage_by_day(scope=ReadScope.of_tenant("acme")) == before
    assert await store.usage.usage_by_day(scope=ReadScope.of_tenant("globex")) == []
    assert await store.usage.tenant_llm_tokens("acme", start) == spent == LLM.total_tokens
