"""Usage per compaction and the specifics ledger on a real PostgreSQL (migration 0012):
what apply_compaction records, usage by tenant and day through row-level
security, a tenant's LLM tokens today, and batches that remember their specifics."""

from __future__ import annotations

import pytest

from core.adapters.postgres.store import PostgresStore
from core.domain.specifics import Specific
from core.domain.usage import LlmUsage
from core.ports.storage import Applied
from tests.support.plans import make_plan, msg, save_all, stored

pytestmark = pytest.mark.integration

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
LEDGER = (Specific(kind="identifier", text="ORD-55120", message_id="m1", score=2.5),)


async def _compact(
    store: PostgresStore, conversation: str, compaction_id: str, usage: LlmUsage
) -> None:
    messages = [msg(i, f"turn {i}", conversation_id=conversation) for i in range(3)]
    await save_all(store, messages)
    batch = stored(compaction_id, 0, "a summary", messages, conversation_id=conversation)
    batch = batch.model_copy(
        update={"batch": batch.batch.model_copy(update={"specifics": LEDGER, "ledger": LEDGER})}
    )
    plan = make_plan(
        compaction_id, [batch], [m.id for m in messages], conversation_id=conversation
    ).model_copy(update={"usage": usage})
    assert await store.compactions.apply_compaction(plan) == Applied()


async def test_a_compaction_records_its_usage_and_tenant(pg_store: PostgresStore) -> None:
    await _compact(pg_store, "acme/c1", "cmp-1", LLM)
    row = await pg_store.pool.fetchrow("SELECT * FROM compactions WHERE compaction_id = 'cmp-1'")
    assert row is not None
    assert (row["tenant_id"], row["summarizer"], row["model"], row["llm_calls"]) == (
        "acme",
        "anthropic",
        "claude-haiku-4-5",
        3,
    )
    assert (row["input_tokens"], row["cache_read_tokens"], row["cache_write_tokens"]) == (
        900,
        4000,
        500,
    )
    assert row["cost_usd"] == pytest.approx(0.00249) and row["budget_fallback"] is False


async def test_a_batch_remembers_its_specifics_and_its_ledger(pg_store: PostgresStore) -> None:
    await _compact(pg_store, "acme/c1", "cmp-1", LLM)
    (live,) = await pg_store.archive.live_batches("acme/c1")
    assert live.batch.specifics == LEDGER and live.batch.ledger == LEDGER
