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
from core.domain.tally import MAX_ATTEMPTS
from core.ports.storage import HistoryConflictError, ReadScope
from streams.events import ReconcileRequest
from streams.http.bodies import ConversationStatus
from tests.support.builders import T0
from tests.support.metrics_text import sample
from tests.unit.worker.harness import harness, over_budget, settings
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


async def test_a_compaction_failing_at_every_attempt_stops_at_the_cap_with_its_spend_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every apply refused (as a message squatting the clip-archive id did): the
    command is sent MAX_ATTEMPTS times in all, then given up, the conversation
    stalled, logged and counted; a new message asks again."""
    model = GistModel()
    h = harness(model=model)

    async def refused(*_: object, **__: object) -> None:
        raise HistoryConflictError("clip-archive id taken")

    monkeypatch.setattr(h.store.compactions, "apply_compaction", refused)
    for index in range(8):
        await h.message(index, f"topic{index} " * 20, tenant="acme")
    request = ReconcileRequest(conversation_id="c1", tenant_id="acme", requested_at=T0)
    run = 0
    for _ in range(MAX_ATTEMPTS + 3):
        for command in h.commands()[run:]:  # the processor runs each command sent
            assert isinstance(await h.components.processor.compact(command), Failed)
        run = len(h.commands())
        h.clock.now += 61  # past command_timeout_seconds: reconciliation re-sends
        await h.control(request)
    assert len(h.commands()) == MAX_ATTEMPTS
    assert len({c.compaction_id for c in h.commands()}) == 1
    tally = h.tally("acme/c1")
    assert tally.stalled and tally.outstanding is None
    assert sample(h.components.metrics, "compactor_compactions_given_up_total") == 1
    assert f"sent {MAX_ATTEMPTS} times without a completion" in caplog.text
    (day,) = await h.store.usage.usage_by_day(scope=ReadScope.everything())
    assert day.failed_compactions == MAX_ATTEMPTS and day.llm_calls == model.calls
    status = ConversationStatus.of(tally, settings().budget)
    assert status.stalled and status.compaction_outstanding is None
    await h.message(8, "topic8 " * 20, tenant="acme")  # a new message asks again
    assert len(h.commands()) == MAX_ATTEMPTS + 1 and not h.tally("acme/c1").stalled
