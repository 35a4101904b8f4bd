from __future__ import annotations

import pytest

from core.domain.circuit import CircuitBreaker

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
