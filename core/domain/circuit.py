"""A per-conversation circuit breaker.

A conversation whose compactions keep failing (a prompt the provider rejects,
a poisonous message) must not burn LLM calls on every event; other
conversations are unaffected. After the cool-down one trial is let through
(half-open): success closes the circuit, failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

CircuitState = Literal["closed", "open", "half_open"]


@dataclass
class _Circuit:
    failures: int = 0
    opened_at: float | None = None
    trial_in_flight: bool = False


class CircuitBreaker:
    def __init__(
        self,
        max_consecutive_failures: int,
        cooldown_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_consecutive_failures < 1:
            raise ValueError("max_consecutive_failures must be >= 1")
        self._max_failures = max_consecutive_failures
        self._cooldown = cooldown_seconds
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}

    def state(self, key: str) -> CircuitState:
        circuit = self._circuits.get(key)
        if circuit is None or circuit.opened_at is None:
            return "closed"
        if self._clock() - circuit.opened_at >= self._cooldown:
            return "half_open"
        return "open"

    def try_acquire(self, key: str) -> bool:
        """May a compaction of ``key`` run now? Half-open admits one trial at a time."""
        state = self.state(key)
        if state == "closed":
            return True
        if state == "open":
            return False
        circuit = self._circuits[key]
        if circuit.trial_in_flight:
            return False
        circuit.trial_in_flight = True
        return True

    def record_success(self, key: str) -> None:
        self._circuits.pop(key, None)

    def record_failure(self, key: str) -> None:
        circuit = self._circuits.setdefault(key, _Circuit())
        circuit.failures += 1
        circuit.trial_in_flight = False
        if circuit.opened_at is not None or circuit.failures >= self._max_failures:
            circuit.opened_at = self._clock()

    def release(self, key: str) -> None:
        """End a trial that neither succeeded nor failed (nothing to compress)."""
        circuit = self._circuits.get(key)
        if circuit is not None:
            circuit.trial_in_flight = False

    def retry_in(self, key: str) -> float:
        circuit = self._circuits.get(key)
        if circuit is None or circuit.opened_at is None:
            return 0.0
        return max(0.0, self._cooldown - (self._clock() - circuit.opened_at))
