"""The soft trigger, ``[budget].compact_at``: compact before the budget is reached.

Why: a compaction takes at least one LLM round trip, and messages keep
arriving meanwhile, so a conversation compacted only once it is over the
budget is seen over it by every reader until the compaction lands (and, in a
burst, for as long as compactions queue). Starting at ``compact_at × budget``
leaves that room. The rules checked here: one threshold for everything that
decides to compact (accounting, reconciler, processor), a command issued at
the threshold and never twice while one is outstanding, a compacted history
never due again at once, and a configuration that cannot trigger in a loop.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.budget import BudgetConfig, compaction_due, over_budget
from core.domain.tally import (
    Completion,
    ConversationTally,
    on_completion,
    on_message,
    on_resync,
    reconcile_due,
)
from core.settings import ConfigError, parse_settings
from streams.worker.processor import Compacted
from tests.support.stores import counts
from tests.unit.worker import harness as components

pytestmark = pytest.mark.unit

SOFT = BudgetConfig(context_budget=0.5, model_max_tokens=200, compact_at=0.85)  # 100, at 85
HARD = BudgetConfig(context_budget=0.5, model_max_tokens=200)  # 100

ratios = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)


@st.composite
def budgets(draw: st.DrawFn) -> BudgetConfig:
    """Any valid budget, with or without a soft trigger."""
    target = draw(st.floats(min_value=0.01, max_value=0.99))
    compact_at = draw(
        st.none() | st.floats(min_value=target, max_value=1.0).filter(lambda value: value > target)
    )
    return BudgetConfig(
        context_budget=draw(ratios),
        model_max_tokens=draw(st.integers(min_value=1, max_value=1_000_000)),
        target_ratio=target,
        compact_at=compact_at,
    )


def fresh() -> ConversationTally:
    return ConversationTally(conversation_id="c")


def completion(tally: ConversationTally, status: str = "compacted") -> Completion:
    assert tally.outstanding is not None
    compacted = status == "compacted"
    return Completion(
        compaction_id=tally.outstanding,
        status=status,
        messages_compressed=3 if compacted else 0,
        tokens_removed=0,
        tokens_added=0,
    )


# -- the threshold -------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(budget=budgets(), tokens=st.integers(min_value=0, max_value=2_000_000))
def test_due_means_over_the_trigger_and_equals_over_budget_without_one(
    budget: BudgetConfig, tokens: int
) -> None:
    assert compaction_due(tokens, budget) == (tokens > budget.trigger_tokens)
    if budget.compact_at is None:
        assert compaction_due(tokens, budget) == over_budget(tokens, budget)
    else:
        assert budget.trigger_tokens == math.floor(budget.compact_at * budget.budget_tokens)
    # Over the budget is always due: the trigger never sits above the budget.
    if over_budget(tokens, budget):
        assert compaction_due(tokens, budget)


@settings(max_examples=300, deadline=None)
@given(budget=budgets())
def test_a_history_at_the_target_is_never_due(budget: BudgetConfig) -> None:
    """What a compaction leaves (at most the target) must not trigger the next one."""
    assert budget.target_tokens <= budget.trigger_tokens <= budget.budget_tokens
    assert not compaction_due(budget.target_tokens, budget)


# -- accounting ---------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=40))
def test_one_command_at_the_trigger_and_none_while_it_is_outstanding(sizes: list[int]) -> None:
    tally = fresh()
    issued = []
    for now, tokens in enumerate(sizes):
        before = tally
        tally, issue = on_message(tally, tokens, SOFT, now=now)
        if issue:
            issued.append(now)
            assert before.outstanding is None and tally.outstanding is not None
            assert compaction_due(tally.token_total, SOFT)
    crossed = [n for n in range(len(sizes)) if sum(sizes[: n + 1]) > SOFT.trigger_tokens]
    # Exactly one, at the first message past the trigger (not at the budget).
    assert issued == crossed[:1]


def test_the_trigger_fires_under_the_budget() -> None:
    tally, issue = on_message(fresh(), 85, SOFT, now=1)
    assert not issue
    tally, issue = on_message(tally, 1, SOFT, now=2)  # 86: over 85, under the budget of 100
    assert issue and not over_budget(tally.token_total, SOFT)
    _, hard_issue = on_message(on_message(fresh(), 85, HARD, now=1)[0], 1, HARD, now=2)
    assert not hard_issue


@settings(max_examples=300, deadline=None)
@given(
    left=st.integers(min_value=0, max_value=150),
    status=st.sampled_from(["compacted", "noop"]),
)
def test_a_completion_reissues_only_when_still_due_after_a_real_compaction(
    left: int, status: str
) -> None:
    tally, _ = on_message(fresh(), 90, SOFT, now=1)
    tally, issue = on_completion(tally, completion(tally, status), SOFT, 2, store_totals=(left, 4))
    due = compaction_due(left, SOFT)
    assert issue == (status == "compacted" and due)
    assert tally.stalled == (status == "noop" and due)
    # Nothing left for the reconciler: a stalled conversation waits for a new
    # message, a re-issued command for its timeout.
    assert not reconcile_due(tally, SOFT, now=3, command_timeout=30)


def test_reconcile_and_resync_use_the_trigger() -> None:
    between = ConversationTally(conversation_id="c", token_total=90, message_count=9)
    assert reconcile_due(between, SOFT, now=1, command_timeout=30)
    assert not reconcile_due(between, HARD, now=1, command_timeout=30)
    _, issue = on_resync(None, "c", 90, 9, SOFT, now=1)
    assert issue
    _, issue = on_resync(None, "c", 90, 9, HARD, now=1)
    assert not issue


# -- configuration ------------------------------------------------------------------


def test_compact_at_is_optional_and_validated_naming_the_key() -> None:
    assert parse_settings({}).budget.compact_at is None
    budget = parse_settings({"budget": {"compact_at": 0.85}}).budget
    assert budget.compact_at == 0.85
    assert budget.trigger_tokens == math.floor(0.85 * budget.budget_tokens)
    for value in (0, -0.1, 1.01):
        with pytest.raises(ConfigError, match=rf"\[budget\]\.compact_at = {value}"):
            parse_settings({"budget": {"compact_at": value}})
    with pytest.raises(ConfigError) as error:
        parse_settings({"budget": {"compact_at": 0.8}})  # = the default target_ratio
    assert "[budget].compact_at = 0.8: must be greater than [budget].target_ratio (0.8)" in str(
        error.value
    )
    assert "e.g. 0.85" in str(error.value)
    with pytest.raises(ConfigError, match=r"lower target_ratio or leave compact_at unset"):
        parse_settings({"budget": {"target_ratio": 1.0, "compact_at": 1.0}})
    parse_settings({"budget": {"target_ratio": 0.5, "compact_at": 0.6}})


# -- the worker: the processor and the reconciler agree ---------------------------------


def soft_harness(monkeypatch: pytest.MonkeyPatch, compact_at: float) -> Any:
    """The worker-components harness (budget 200) with a soft trigger."""
    plain = components.settings

    def with_trigger(tenancy: Any = None, tenants: Any = None, **service: Any) -> Any:
        config = plain(tenancy, tenants, **service)
        budget = config.budget.model_copy(update={"compact_at": compact_at})
        return config.model_copy(update={"budget": budget})

    monkeypatch.setattr(components, "settings", with_trigger)
    return components.harness()


async def test_a_command_issued_at_the_trigger_compacts_rather_than_noops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = soft_harness(monkeypatch, compact_at=0.85)  # trigger 170, budget 200
    index = 0
    while not h.commands():
        await h.message(index, "x" * 100)  # 25 tokens each
        index += 1
    total, _ = await counts(h.store, "c1")
    assert 170 < total <= 200  # due, not over the budget
    (command,) = h.commands()
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Compacted) and outcome.plan.messages_compressed > 0
    (completed,) = h.completions()
    await h.control(completed)
    assert not h.tally().stalled and h.tally().outstanding is None


async def test_the_reconciler_asks_the_store_for_conversations_over_the_trigger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = soft_harness(monkeypatch, compact_at=0.85)
    for i in range(3):
        await h.message(i, "x" * 240)  # 180 tokens: due, under the budget
    assert len(h.commands()) == 1
    h.components.table.put(
        ConversationTally(conversation_id="c1", token_total=10, message_count=3)
    )  # drifted low
    assert await h.components.reconciler.tick() == 1  # the store has it over the trigger
