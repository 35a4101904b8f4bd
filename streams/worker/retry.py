"""How long to wait between tries: quick after a blip, gentle in an outage.

Exponential from ``FIRST_SECONDS``, at most ``CAP_SECONDS``. Accounting waits
a random time up to that ("full jitter", tenacity's
``wait_random_exponential``): the workers that an outage stopped together do
not all come back in the same instant. What to retry is
``streams.worker.failures``.
"""

from __future__ import annotations

from tenacity import RetryCallState, Retrying, wait_random_exponential

FIRST_SECONDS = 0.2
CAP_SECONDS = 10.0

_FULL_JITTER = wait_random_exponential(multiplier=FIRST_SECONDS, max=CAP_SECONDS)
_RETRYING = Retrying()


def backoff_seconds(
    attempt: int, *, first: float = FIRST_SECONDS, cap: float = CAP_SECONDS
) -> float:
    """0.2, 0.4, 0.8, … seconds (``attempt`` from 0), at most ``cap``: no jitter (the
    worker opening its store, ``streams.bootstrap``, waits these)."""
    return float(min(cap, first * 2.0 ** min(attempt, 30)))


def jittered_backoff_seconds(failures: int) -> float:
    """Between 0 and ``backoff_seconds(failures - 1)``, at random (``failures`` from 1).

    A tenacity wait strategy reads the attempt number off a call state; the loop
    that waits is ``failures.Durably``'s own, so the state is made for the asking."""
    state = RetryCallState(_RETRYING, fn=None, args=(), kwargs={})
    state.attempt_number = failures
    return float(_FULL_JITTER(state))
