"""The failure policy alone: what follows each kind of failure, and how long it waits."""

from __future__ import annotations

import random

import pytest

from core.ports.publisher import PublisherUnavailable
from core.ports.storage import StoreRejected, StoreUnavailable
from streams.worker.failures import DeadLetter, FailurePolicy, Split, Wait
from streams.worker.retry import backoff_seconds, jittered_backoff_seconds

pytestmark = pytest.mark.unit

POLICY = FailurePolicy(max_attempts=5)


@pytest.mark.parametrize("error", [StoreUnavailable("down"), PublisherUnavailable("away")])
@pytest.mark.parametrize("attempts", [1, 5, 6, 1000])
def test_an_outage_is_waited_out_however_long_it_lasts(error: Exception, attempts: int) -> None:
    decision = POLICY.decide(error, attempts, records=3)
    assert isinstance(decision, Wait) and decision.then is None
    assert 0.0 <= decision.delay <= min(10.0, 0.2 * 2 ** (attempts - 1))


def test_a_rejection_is_given_up_at_once_a_group_split_first() -> None:
    error = StoreRejected("PostgreSQL refused the data")
    assert not FailurePolicy.counts_as_attempt(error)
    alone = POLICY.decide(error, 0, records=1)
    assert isinstance(alone, DeadLetter) and alone.reason.error_type == "store_rejected"
    assert "PostgreSQL refused the data" in alone.reason.reason
    assert POLICY.decide(error, 0, records=2) == Split()


def test_another_error_is_retried_then_given_up_after_the_last_backoff() -> None:
    error = ValueError("boom")
    assert FailurePolicy.counts_as_attempt(error)
    for attempts in range(1, 5):
        decision = POLICY.decide(error, attempts, records=1)
        assert isinstance(decision, Wait) and decision.then is None
    last = POLICY.decide(error, 5, records=1)
    assert isinstance(last, Wait) and isinstance(last.then, DeadLetter)
    assert last.then.reason.error_type == "processing_error"
    assert "after 5 attempts: ValueError: boom" in last.then.reason.reason
    group = POLICY.decide(error, 5, records=4)
    assert isinstance(group, Wait) and group.then == Split()


def test_the_waits_are_full_jitter_under_the_old_backoff() -> None:
    """Random between 0 and min(10, 0.2 × 2^(n-1)) seconds after the n-th failure."""
    random.seed(26)
    for failures in range(1, 13):
        bound = backoff_seconds(failures - 1)
        waits = [jittered_backoff_seconds(failures) for _ in range(200)]
        assert all(0.0 <= wait <= bound for wait in waits)
        assert len(set(waits)) > 1 and max(waits) > bound / 2  # spread over the window
    assert backoff_seconds(0) == 0.2 and backoff_seconds(6) == 10.0
