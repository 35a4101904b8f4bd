"""Compact while the conversation pauses ([budget].idle_seconds, issue 18 part 6)."""

from __future__ import annotations

import pytest

from core.domain.budget import BudgetConfig, compaction_due_now
from core.domain.tally import ConversationTally, on_message, reconcile_due

pytestmark = pytest.mark.unit

# budget 1,000 tokens, trigger 900, target 800; idle after 20 s.
BUDGET = BudgetConfig(
    context_budget=0.5, model_max_tokens=2000, compact_at=0.9, target_ratio=0.8, idle_seconds=20
)


def test_between_the_trigger_and_the_budget_it_waits_for_a_pause() -> None:
    assert not compaction_due_now(950, BUDGET, 0.0)
    assert not compaction_due_now(950, BUDGET, 19.9)
    assert compaction_due_now(950, BUDGET, 20.0)
    assert not compaction_due_now(850, BUDGET, 1000.0)  # under the trigger: never


def test_over_the_budget_it_compacts_at_once() -> None:
    assert compaction_due_now(1001, BUDGET, 0.0)


def test_without_idle_seconds_the_trigger_compacts_at_once() -> None:
    plain = BUDGET.model_copy(update={"idle_seconds": None})
    assert compaction_due_now(950, plain, 0.0)


def test_a_message_over_the_trigger_waits_and_reconciliation_sends_after_the_pause() -> None:
    tally = ConversationTally(conversation_id="c1", token_total=880)
    tally, issued = on_message(tally, 70, BUDGET, now=100.0)  # 950: over the trigger
    assert not issued and tally.outstanding is None
    assert not reconcile_due(tally, BUDGET, 110.0, command_timeout=30)
    tally, issued = on_message(tally, 10, BUDGET, now=115.0)  # the pause starts again
    assert not issued and not reconcile_due(tally, BUDGET, 130.0, command_timeout=30)
    assert reconcile_due(tally, BUDGET, 135.0, command_timeout=30)
    tally, issued = on_message(tally, 100, BUDGET, now=131.0)  # 1,060: over the budget
    assert issued and tally.outstanding is not None
