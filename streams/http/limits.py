"""Request rate limits: a token bucket per key, a cost per request, and a cap on
the searches in flight.

Per token and per tenant (``guard``): ``[service].rate_limit_per_second``
refills each token's bucket, up to ``rate_limit_burst``; ``tenant_rate_limit_*``
do the same for all the tokens of one tenant together (the tenant a request is
about: a tenant-bound token's own, or ``tenant_id`` of a token bound to none).
A request takes its cost from both, or from neither: a memory search costs
``rate_limit_search_cost`` (20), every other request 1, so an expensive view
cannot ride on the cheap views' allowance. 0 turns a limit off. A request
beyond one is answered 429 with ``Retry-After`` (whole seconds, at least 1).

Searches in flight (``InFlight``): at most ``max_concurrent_searches_per_tenant``
per tenant (per token for a search of no tenant); one more is 429 at once.

Per client address, for failed authentications (``[service].auth_failures_*``):
each 401 takes one from the address's bucket, and an address whose bucket is
empty is answered 429 before its token is even looked at, so guessing tokens
costs the guesser time.

Keys an outsider chooses (addresses, ``tenant_id``) are bounded by
``max_keys``: the buckets are kept in the order they were last used, and a new
key past the bound drops the least recently used one (O(1), whatever the
number of buckets: the one dropped has had the longest to refill).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    def __init__(
        self,
        per_second: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int | None = None,
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._max_keys = max_keys
        # Least recently used first.
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.per_second > 0

    def __len__(self) -> int:
        return len(self._buckets)

    def acquire(self, key: str, cost: float = 1.0) -> float | None:
        """Take ``cost`` from ``key``'s bucket: None when allowed, else the seconds
        until it holds that much (nothing is taken then)."""
        wait = self.wait(key, cost)
        if wait is None:
            self.take(key, cost)
        return wait

    def wait(self, key: str, cost: float = 1.0) -> float | None:
        """Without taking anything: None when ``key``'s bucket holds ``cost`` (a cost
        above the burst counts as the burst), else the seconds until it does."""
        if not self.enabled:
            return None
        bucket = self._refilled(key)
        needed = min(cost, float(self.burst))
        return None if bucket.tokens >= needed else (needed - bucket.tokens) / self.per_second

    def take(self, key: str, cost: float = 1.0) -> None:
        """Take ``cost`` (at most the burst) from ``key``'s bucket, which ``wait``
        just found holds it."""
        if self.enabled:
            bucket = self._refilled(key)
            bucket.tokens = max(0.0, bucket.tokens - min(cost, float(self.burst)))

    def blocked(self, key: str) -> float | None:
        """Without taking one, and without making a bucket for a new key: None when
        ``key`` has a request left, else the seconds until it has."""
        if not self.enabled or key not in self._buckets:
            return None
        return self.wait(key)

    def _refilled(self, key: str) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if self._max_keys is not None and len(self._buckets) >= self._max_keys:
                self._buckets.popitem(last=False)  # the least recently used
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        else:
            self._buckets.move_to_end(key)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.per_second)
        bucket.at = now
        return bucket

    def retry_after(self, wait: float) -> str:
        """The ``Retry-After`` header value for a wait (whole seconds, at least 1)."""
        return str(max(1, math.ceil(wait)))


@dataclass(frozen=True)
class Throttled:
    """A request beyond a limit: how long to wait, and which limit."""

    wait: float
    why: str

    @property
    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.wait)))


# Tenants named in ``tenant_id`` by tokens bound to none: a bound on their buckets.
MAX_TENANT_BUCKETS = 10_000


class RequestLimits:
    """The buckets a request takes its cost from: its token's, and its tenant's."""

    def __init__(self, per_token: RateLimiter, per_tenant: RateLimiter) -> None:
        self.per_token = per_token
        self.per_tenant = per_tenant

    def admit(self, token_id: str, tenant: str | None, cost: float) -> Throttled | None:
        """Take ``cost`` from both buckets, or from neither when one lacks it."""
        waits = [
            Throttled(wait, why)
            for limiter, key, why in self._buckets(token_id, tenant)
            if (wait := limiter.wait(key, cost)) is not None
        ]
        if waits:
            return max(waits, key=lambda throttled: throttled.wait)
        for limiter, key, _ in self._buckets(token_id, tenant):
            limiter.take(key, cost)
        return None

    def _buckets(self, token_id: str, tenant: str | None) -> list[tuple[RateLimiter, str, str]]:
        buckets = [(self.per_token, token_id, "too many requests for this token")]
        if tenant is not None:
            buckets.append((self.per_tenant, tenant, "too many requests for this tenant"))
        return buckets


class InFlight:
    """How many requests per key are being answered; at most ``limit`` (0: no cap).
    A key is dropped when its last request ends, so memory follows what is in
    flight, never how many keys were seen."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def enter(self, key: str) -> bool:
        """Count one more for ``key``: False (nothing counted) when it is at the cap."""
        count = self._counts.get(key, 0)
        if self.limit and count >= self.limit:
            return False
        self._counts[key] = count + 1
        return True

    def leave(self, key: str) -> None:
        count = self._counts.get(key, 0) - 1
        if count > 0:
            self._counts[key] = count
        else:
            self._counts.pop(key, None)

    def __len__(self) -> int:
        return len(self._counts)
