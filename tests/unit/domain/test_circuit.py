from __future__ import annotations

import pytest

from core.domain.circuit import CircuitBreaker, DuringOutage

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_and_half_opens_after_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(max_consecutive_failures=2, cooldown_seconds=10, clock=clock)
    assert breaker.try_acquire("c")
    breaker.record_failure("c")
    assert breaker.state("c") == "closed"
    breaker.record_failure("c")
    assert breaker.state("c") == "open"
    assert not breaker.try_acquire("c")
    assert breaker.try_acquire("other")  # per conversation
    assert breaker.retry_in("c") == 10
    clock.now = 10
    assert breaker.state("c") == "half_open"
    assert breaker.try_acquire("c")
    assert not breaker.try_acquire("c")  # one trial at a time
    breaker.record_failure("c")  # trial failed: open again for a full cool-down
    assert breaker.state("c") == "open"
    clock.now = 20
    assert breaker.try_acquire("c")
    breaker.record_success("c")
    assert breaker.state("c") == "closed"


def test_success_resets_failure_count() -> None:
    breaker = CircuitBreaker(max_consecutive_failures=2, cooldown_seconds=10, clock=Clock())
    breaker.record_failure("c")
    breaker.record_success("c")
    breaker.record_failure("c")
    assert breaker.state("c") == "closed"


def test_release_ends_a_trial_without_verdict() -> None:
    clock = Clock()
    breaker = CircuitBreaker(max_consecutive_failures=1, cooldown_seconds=1, clock=clock)
    breaker.record_failure("c")
    clock.now = 1
    assert breaker.try_acquire("c")
    breaker.release("c")
    assert breaker.try_acquire("c")


def test_a_circuit_opened_in_an_outage_waits_for_the_provider_not_the_cool_down() -> None:
    """Issue 29: ``end_outage`` turns it half-open at once: one trial."""
    clock = Clock()
    breaker = CircuitBreaker(max_consecutive_failures=2, cooldown_seconds=30, clock=clock)
    breaker.record_failure("c", DuringOutage(answers=4))
    assert breaker.state("c") == "closed"
    assert breaker.outage_of("c") is None  # not open: nothing to wait for
    breaker.record_failure("c", DuringOutage(answers=5))
    assert breaker.state("c") == "open"
    assert breaker.outage_of("c") == DuringOutage(answers=5)
    clock.now = 3
    breaker.end_outage("c")  # the provider answers again
    assert breaker.state("c") == "half_open"
    assert breaker.outage_of("c") is None
    assert breaker.try_acquire("c")
    assert not breaker.try_acquire("c")  # one trial at a time
    breaker.record_success("c")
    assert breaker.state("c") == "closed"


def test_a_trial_failing_with_the_provider_up_opens_for_the_whole_cool_down() -> None:
    clock = Clock()
    breaker = CircuitBreaker(max_consecutive_failures=1, cooldown_seconds=30, clock=clock)
    breaker.record_failure("c", DuringOutage(answers=0))
    breaker.end_outage("c")
    assert breaker.try_acquire("c")
    breaker.record_failure("c")  # the provider answers others: the request's own trouble
    assert breaker.state("c") == "open"
    assert breaker.outage_of("c") is None
    breaker.end_outage("c")  # changes nothing now
    assert breaker.state("c") == "open"
    assert breaker.retry_in("c") == 30


def test_the_conversations_own_opening_is_not_ended_by_the_provider() -> None:
    clock = Clock()
    breaker = CircuitBreaker(max_consecutive_failures=1, cooldown_seconds=30, clock=clock)
    breaker.record_failure("c")
    breaker.end_outage("c")
    assert breaker.state("c") == "open"
    breaker.end_outage("unknown")  # no circuit: nothing to do
    assert breaker.state("unknown") == "closed"
