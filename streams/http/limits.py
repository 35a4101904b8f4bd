"""A request rate limit per token: a token bucket per token id.

``[service].rate_limit_per_second`` refills each bucket, up to
``[service].rate_limit_burst`` requests at once; 0 turns the limit off. A
request beyond it is answered 429 with ``Retry-After`` (whole seconds, at
least 1). Only configured tokens (and the one anonymous caller when no token
is configured) have buckets, so their number is bounded by the configuration.
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
        self, per_second: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return self.per_second > 0

    def acquire(self, key: str) -> float | None:
        """Take one request from ``key``'s bucket: None when allowed, else the
        seconds until one is available."""
        if not self.enabled:
            return None
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.per_second)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / self.per_second

    def retry_after(self, wait: float) -> str:
        """The ``Retry-After`` header value for a wait (whole seconds, at least 1)."""
        return str(max(1, math.ceil(wait)))
