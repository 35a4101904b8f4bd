"""How long to wait between tries: quick after a blip, gentle in an outage.

What to retry is ``streams.worker.failures``.
"""

from __future__ import annotations


def backoff_seconds(attempt: int, *, first: float = 0.2, cap: float = 10.0) -> float:
    """0.2, 0.4, 0.8, … seconds, at most ``cap``: quick after a blip, gentle in an outage."""
    return float(min(cap, first * 2.0 ** min(attempt, 30)))
