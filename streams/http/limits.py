"""Request rate limits: a token bucket per key.

Per token (``guard``): ``[service].rate_limit_per_second`` refills each
bucket, up to ``[service].rate_limit_burst`` requests at once; 0 turns the
limit off. A request beyond it is answered 429 with ``Retry-After`` (whole
seconds, at least 1). Only configured tokens (and the one anonymous caller
when no token is configured) have buckets, so their number is bounded by the
configuration.

Per client address, for failed authentications (``[service].auth_failures_*``):
each 401 takes one from the address's bucket, and an address whose bucket is
empty is answered 429 before its token is even looked at, so guessing tokens
costs the guesser time. Addresses are unbounded, so buckets that have refilled
are dropped once there are more than ``max_keys``.
"""

from __future__ import annotations

import math
import time
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
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return self.per_second > 0

    def acquire(self, key: str) -> float | None:
        """Take one request from ``key``'s bucket: None when allowed, else the
        seconds until one is available."""
        if not self.enabled:
            return None
        bucket = self._refilled(key)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / self.per_second

    def blocked(self, key: str) -> float | None:
        """Without taking one: None when ``key`` has a request left, else the seconds
        until it has."""
        if not self.enabled or key not in self._buckets:
            return None
        bucket = self._refilled(key)
        return None if bucket.tokens >= 1.0 else (1.0 - bucket.tokens) / self.per_second

    def _refilled(self, key: str) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if self._max_keys is not None and len(self._buckets) >= self._max_keys:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.per_second)
        bucket.at = now
        return bucket

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (they are as good as new)."""
        full = float(self.burst)
        self._buckets = {
            key: bucket
            for key, bucket in self._buckets.items()
            if bucket.tokens + (now - bucket.at) * self.per_second < full
        }

    def retry_after(self, wait: float) -> str:
        """The ``Retry-After`` header value for a wait (whole seconds, at least 1)."""
        return str(max(1, math.ceil(wait)))
