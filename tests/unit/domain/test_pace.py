"""The compaction pace (``core.domain.pace``): a wave starts at the floor, grows
while turns keep up, halves when one is late, never leaves [floor, ceiling]."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.pace import (
    Baseline,
    PaceRule,
    on_delay,
    on_demand,
    on_time,
    start,
)
from core.domain.pace import (
    observe as observe_baseline,
)

pytestmark = pytest.mark.unit

RULE = PaceRule(floor=8, ceiling=128, target_seconds=0.1)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("demand"), st.integers(0, 500)),
        st.tuples(st.just("delay"), st.floats(0, 30)),
        st.tuples(st.just("time"), st.floats(0, 5)),
    ),
    max_size=60,
)


@given(steps)
def test_the_limit_never_leaves_floor_and_ceiling(events: list[tuple[str, float]]) -> None:
    now = 0.0
    pace = start(RULE, now)
    for kind, value in events:
        if kind == "demand":
            pace = on_demand(pace, int(value))
        elif kind == "delay":
            pace = on_delay(RULE, pace, value, now)
        else:
            now += value
            pace = on_time(RULE, pace, now, pace.wanted)
        assert RULE.floor <= pace.limit <= RULE.ceiling


def test_a_wave_starts_at_the_floor_and_doubles_each_round_it_keeps_up() -> None:
    pace = on_demand(start(RULE, 0.0), 200)
    limits = [pace.limit]
    for second in range(1, 6):
        pace = on_delay(RULE, pace, 0.01, second - 0.5)  # a turn stored on time
        pace = on_time(RULE, pace, float(second), 200)
        limits.append(pace.limit)
    assert limits == [8, 16, 32, 64, 128, 128]


def test_a_round_without_a_turn_goes_straight_to_what_was_wanted() -> None:
    """No message stored: no one to keep waiting (a burst's backlog of compactions)."""
    pace = on_time(RULE, on_demand(start(RULE, 0.0), 50), 1.0, 50)
    assert pace.limit == 50
    pace = on_time(RULE, on_demand(pace, 500), 2.0, 500)
    assert pace.limit == RULE.ceiling
    turned = on_delay(RULE, on_demand(start(RULE, 0.0), 500), 0.01, 0.5)
    assert on_time(RULE, turned, 1.0, 500).limit == 2 * RULE.floor  # a turn: doubles only


def test_a_late_group_halves_the_limit_at_once_and_once_a_round() -> None:
    pace = start(RULE, 0.0)
    for second in range(1, 4):
        pace = on_delay(RULE, on_demand(pace, 200), 0.01, second - 0.5)
        pace = on_time(RULE, pace, float(second), 200)
    assert pace.limit == 64
    pace = on_delay(RULE, pace, 0.5, 3.2)
    assert pace.limit == 32
    assert on_delay(RULE, pace, 0.5, 3.9).limit == 32  # the same round: once
    assert on_delay(RULE, pace, 0.5, 4.3).limit == 16  # a round later: again


def test_a_late_round_does_not_grow_and_an_on_time_delay_changes_nothing() -> None:
    pace = on_demand(start(RULE, 0.0), 200)
    on_target = on_delay(RULE, pace, 0.1, 0.5)  # at the target is not late
    assert (on_target.limit, on_target.late, on_target.turns) == (pace.limit, False, True)
    late = on_delay(RULE, pace, 0.2, 0.5)
    assert on_time(RULE, late, 1.0, 200).limit == RULE.floor


def test_a_quiet_round_brings_the_limit_back_towards_twice_what_was_used() -> None:
    pace = start(RULE, 0.0)
    for second in range(1, 5):
        pace = on_time(RULE, on_demand(pace, 500), float(second), 500)
    assert pace.limit == 128
    pace = on_time(RULE, pace, 5.0, 20)  # a round that wanted 500 still: stays
    pace = on_time(RULE, pace, 6.0, 0)  # it wanted 20 at most
    assert pace.limit == 40
    pace = on_time(RULE, pace, 7.0, 0)  # idle: the next wave starts at the floor
    assert pace.limit == RULE.floor


def test_without_a_target_the_limit_is_the_ceiling_whatever_happens() -> None:
    rule = PaceRule(floor=8, ceiling=128, target_seconds=0)
    pace = start(rule, 0.0)
    pace = on_time(rule, on_delay(rule, on_demand(pace, 1), 60.0, 0.5), 2.0, 0)
    assert pace.limit == 128


@given(skew=st.floats(0, 600), jitter=st.lists(st.floats(0, 0.05), min_size=2, max_size=30))
def test_a_clock_behind_by_a_constant_is_not_late(skew: float, jitter: list[float]) -> None:
    """The baseline (the least delay of the last windows) takes a producer clock's
    constant error out: only the part above it is late."""
    baseline = Baseline(window_start=0.0)
    now = 0.0
    for extra in jitter:
        now += 0.5
        baseline = observe_baseline(RULE, baseline, skew + extra, now)
        assert skew + extra - baseline.value <= 0.05 + 1e-9


def test_the_baseline_forgets_windows_older_than_two() -> None:
    baseline = observe_baseline(RULE, Baseline(window_start=0.0), 0.02, 1.0)
    baseline = observe_baseline(RULE, baseline, 5.0, 61.0)  # next window: keeps the last
    assert baseline.value == pytest.approx(0.02)
    baseline = observe_baseline(RULE, baseline, 5.0, 122.0)
    assert baseline.value == pytest.approx(5.0)


def test_the_rule_refuses_a_floor_over_the_ceiling() -> None:
    with pytest.raises(ValueError, match="floor"):
        PaceRule(floor=9, ceiling=8, target_seconds=0.1)
