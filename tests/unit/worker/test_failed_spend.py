"""A failed compaction's LLM spend is recorded and counted (issue 29, item 3).

Why: a compaction whose apply failed (a message squatting its clip-archive's
id; any conflict) had spent its summariser's tokens all the same, and nothing
recorded them: re-sent without end, it was free for the tenant's
``llm_tokens_per_day``. Now the spend of a plan the store refused is a
content-free usage row, in ``usage_by_day`` and in the tenant's budget.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.domain.compaction import Failed
from core.ports.storage import HistoryConflictError, ReadScope
from tests.unit.worker.harness import harness, over_budget
from tests.unit.worker.test_usage_and_budgets import ACME, GistModel, compact_once

pytestmark = pytest.mark.unit

START = datetime(1970, 1, 1, tzinfo=UTC)


async def test_a_plan_the_store_refuses_has_its_llm_spend_recorded_and_counted() -> None:
    model = GistModel()
    h = harness(model=model, tenants=ACME)
    for index in range(8):
        await h.message(index, f"topic{index} " * 20, tenant="acme")
    (command,) = h.commands()
    h.store.fail_next["apply_compaction"] = HistoryConflictError("clip-archive id taken")
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Failed) and outcome.kind == "history_conflict"
    assert outcome.usage is not None and outcome.usage.calls == model.calls >= 1
    spent = 1_320 * model.calls  # 300 in, 20 out, 1,000 cache reads a call
    assert await h.store.usage.tenant_llm_tokens("acme", START) == spent
    (day,) = await h.store.usage.usage_by_day(scope=ReadScope.everything())
    assert (day.tenant_id, day.compactions, day.failed_compactions) == ("acme", 0, 1)
    assert (day.llm_calls, day.input_tokens) == (model.calls, 300 * model.calls)
    # Its tenant's budget (1,000 tokens) is spent: the next compaction falls back.
    calls = model.calls
    await compact_once(h, "c2", "acme")
    assert model.calls == calls


async def test_a_failure_that_spent_nothing_records_nothing() -> None:
    h = harness()  # the extractive summariser: no LLM call
    command = await over_budget(h)
    h.store.fail_next["apply_compaction"] = HistoryConflictError("taken")
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Failed)
    assert await h.store.usage.usage_by_day(scope=ReadScope.everything()) == []
