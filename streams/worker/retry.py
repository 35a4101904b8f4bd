"""Which failures are worth waiting out, and how long to wait between tries.

The accounting path never acknowledges a record whose effect is not durable:
while PostgreSQL or the broker is away it retries the same record, which
also stops consumption of its partitions (the agent is busy with it). Every
step is idempotent, so a retried record is written once. A failure that is
not an outage (a bug, a record that breaks an assumption) is retried a few
times and then dead-lettered with the error, so one poisonous record cannot
hold a partition forever, and nothing is dropped without a trace.

An outage is said by the ports' own errors: the adapters map their drivers'
exceptions at the edge (``core.adapters.postgres.errors``,
``streams.kafka.errors``), so this policy imports no driver.
"""

from __future__ import annotations

from core.ports.publisher import PublisherUnavailable
from core.ports.storage import StoreUnavailable

_OUTAGES: tuple[type[BaseException], ...] = (StoreUnavailable, PublisherUnavailable)


def is_outage(error: BaseException) -> bool:
    return isinstance(error, _OUTAGES)


def backoff_seconds(attempt: int, *, first: float = 0.2, cap: float = 10.0) -> float:
    """0.2, 0.4, 0.8, … seconds, at most ``cap``: quick after a blip, gentle in an outage."""
    return float(min(cap, first * 2.0 ** min(attempt, 30)))
