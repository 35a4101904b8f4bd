from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.budget import BudgetConfig
from core.domain.tally import (
    Completion,
    ConversationTally,
    compaction_id_for,
    on_completion,
    on_message,
    on_reconcile,
    on_resync,
    resynced,
)

pytestmark = pytest.mark.unit

BUDGET = BudgetConfig(context_budget=0.5, model_max_tokens=200)  # 100 tokens


def fresh() -> ConversationTally:
    return ConversationTally(conversation_id="c")


def done(
    tally: ConversationTally, removed: int, status: str = "compacted", compressed: int = 5
) -> Completion:
    assert tally.outstanding
    return Completion(
        compaction_id=tally.outstanding,
        status=status,  # type: ignore[arg-type]
        messages_compressed=compressed if status == "compacted" else 0,
        rows_removed=compressed if status == "compacted" else 0,
        rows_added=1 if status == "compacted" else 0,
        tokens_removed=removed,
        tokens_added=10 if status == "compacted" else 0,
    )


def test_one_command_when_the_budget_is_crossed() -> None:
    tally, issue = on_message(fresh(), 60, BUDGET, now=1)
    assert not issue
    tally, issue = on_message(tally, 60, BUDGET, now=2)
    assert issue and tally.outstanding == compaction_id_for("c", 0) and tally.outstanding_since == 2
    tally, issue = on_message(tally, 60, BUDGET, now=3)
    assert not issue  # one outstanding at a time
    assert (tally.token_total, tally.message_count) == (180, 3)


def test_completion_subtracts_exactly_and_advances_generation() -> None:
    tally = fresh()
    for i in range(6):
        tally, _ = on_message(tally, 25, BUDGET, now=i)
    assert (tally.token_total, tally.message_count) == (150, 6)
    tally, issue = on_completion(tally, done(tally, removed=100, compressed=5), BUDGET, now=9)
    assert not issue
    assert (tally.token_total, tally.message_count) == (150 - 100 + 10, 6 - 5 + 1)
    assert (tally.generation, tally.compactions, tally.outstanding) == (1, 1, None)


def test_duplicate_and_stale_completions_are_ignored() -> None:
    tally, _ = on_message(fresh(), 150, BUDGET, now=1)
    completion = done(tally, removed=100)
    tally, _ = on_completion(tally, completion, BUDGET, now=2)
    again, issue = on_completion(tally, completion, BUDGET, now=3)
    assert again == tally and not issue


def test_still_over_budget_after_a_real_compaction_issues_the_next_generation() -> None:
    tally, _ = on_message(fresh(), 300, BUDGET, now=1)
    tally, issue = on_completion(tally, done(tally, removed=100), BUDGET, now=2)
    assert issue and tally.outstanding == compaction_id_for("c", 1)


def test_noop_stalls_until_a_new_message() -> None:
    tally, _ = on_message(fresh(), 150, BUDGET, now=1)
    tally, issue = on_completion(tally, done(tally, removed=0, status="noop"), BUDGET, now=2)
    assert not issue and tally.stalled
    assert on_reconcile(tally, BUDGET, now=1000, command_timeout=10) == (tally, False)
    tally, issue = on_message(tally, 1, BUDGET, now=3)
    assert issue and not tally.stalled


def test_reconcile_reissues_same_id_after_timeout() -> None:
    tally, _ = on_message(fresh(), 150, BUDGET, now=100)
    same, issue = on_reconcile(tally, BUDGET, now=105, command_timeout=10)
    assert not issue and same == tally
    later, issue = on_reconcile(tally, BUDGET, now=111, command_timeout=10)
    assert issue and later.outstanding == tally.outstanding and later.outstanding_since == 111


def test_reconcile_issues_for_over_budget_conversation_without_command() -> None:
    tally = resynced(fresh(), token_total=500, message_count=9)
    tally, issue = on_reconcile(tally, BUDGET, now=1, command_timeout=10)
    assert issue and tally.outstanding == compaction_id_for("c", 0)
    under = resynced(fresh(), token_total=50, message_count=2)
    assert on_reconcile(under, BUDGET, now=1, command_timeout=10) == (under, False)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("msg"), st.integers(0, 80)),
            st.tuples(st.just("done"), st.integers(0, 200)),
            st.just(("dup", 0)),
            st.just(("tick", 0)),
        ),
        max_size=60,
    )
)
def test_invariants_under_any_interleaving(steps: list[tuple[str, int]]) -> None:
    """At most one outstanding command; totals never negative; each completion applied once."""
    tally = fresh()
    applied: list[str] = []
    last: Completion | None = None
    now = 0.0
    for kind, amount in steps:
        now += 1
        if kind == "msg":
            tally, _ = on_message(tally, amount, BUDGET, now)
        elif kind == "done" and tally.outstanding:
            last = done(tally, removed=min(amount, tally.token_total))
            before = tally.generation
            tally, _ = on_completion(tally, last, BUDGET, now)
            assert tally.generation == before + 1
            applied.append(last.compaction_id)
        elif kind == "dup" and last is not None:
            assert on_completion(tally, last, BUDGET, now)[0] == tally
        elif kind == "tick":
            before = tally.outstanding
            tally, issued = on_reconcile(tally, BUDGET, now, command_timeout=5)
            if before is not None and issued:
                assert tally.outstanding == before
        assert tally.token_total >= 0
        assert (tally.outstanding is None) == (tally.outstanding_since is None)
        if tally.outstanding:
            assert tally.outstanding == compaction_id_for("c", tally.generation)
    assert len(applied) == len(set(applied))


def test_an_erase_epoch_salts_compaction_ids_and_a_resync_of_another_epoch_starts_anew() -> None:
    ids = {compaction_id_for("c", g, e) for g in range(3) for e in range(3)}
    assert len(ids) == 9  # no generation of one epoch repeats another's
    stale = ConversationTally(conversation_id="c", generation=4, compactions=4, token_total=7)
    tally, issued = on_resync(stale, "c", 150, 3, BUDGET, 1.0, epoch=1)
    assert (tally.epoch, tally.generation, tally.compactions) == (1, 0, 0)
    assert issued and tally.outstanding == compaction_id_for("c", 0, 1)
    same, _ = on_resync(tally, "c", 150, 3, BUDGET, 2.0, epoch=1)
    assert same.outstanding == tally.outstanding  # the same epoch keeps its entry
