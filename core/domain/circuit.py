"""A per-conversation circuit breaker.

A conversation whose compactions keep failing (a prompt the provider rejects,
a poisonous message) must not burn LLM calls on every event; other
conversations are unaffected. After the cool-down one trial is let through
(half-open): success closes the circuit, failure opens it again.

A failure the caller could not pin on the provider, but that came while the
provider was failing for everyone (``DuringOutage``), still counts; a circuit
it opens is provisional, though: ``end_outage`` turns it half-open as soon as
the provider answers again, so a conversation is not shut out for a whole
cool-down after an outage that was never its doing (issue 29).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

CircuitState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class DuringOutage:
    """A failure that came while the provider was failing for everyone;
    ``answers``: how many answers the provider had given (to anyone) then."""

    answers: int


@dataclass
class _Circuit:
    failures: int = 0
    opened_at: float | None = None
    trial_in_flight: bool = False
    outage: DuringOutage | None = None  # set: opened during a provider outage


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

    def record_failure(self, key: str, outage: DuringOutage | None = None) -> None:
        """``outage``: the failure came during a provider outage; a circuit it
        (re-)opens waits for the provider, not the cool-down (``end_outage``)."""
        circuit = self._circuits.setdefault(key, _Circuit())
        circuit.failures += 1
        circuit.trial_in_flight = False
        if circuit.opened_at is not None or circuit.failures >= self._max_failures:
            circuit.opened_at = self._clock()
            circuit.outage = outage

    def outage_of(self, key: str) -> DuringOutage | None:
        """The outage an open circuit was opened in; ``None`` when it is closed,
        half-open, or was opened by the conversation's own failures."""
        circuit = self._circuits.get(key)
        if circuit is None or self.state(key) != "open":
            return None
        return circuit.outage

    def end_outage(self, key: str) -> None:
        """The provider answers again: a circuit opened during its outage turns
        half-open now (one trial) instead of after its cool-down. A circuit the
        conversation's own failures opened is left as it is."""
        circuit = self._circuits.get(key)
        if circuit is None or circuit.outage is None or circuit.opened_at is None:
            return
        circuit.outage = None
        circuit.opened_at = min(circuit.opened_at, self._clock() - self._cooldown)

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
