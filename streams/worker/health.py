"""What is wrong with this worker right now, for ``/healthz`` and the metrics.

Components report a problem when they start waiting on something (the
database is away, a partition makes no progress) and clear it when they get
going again; ``/healthz`` answers 503 while any problem is open, so a
supervisor or load balancer sees an outage the worker is riding out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    component: str
    detail: str
    since: float


class Health:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._problems: dict[str, Problem] = {}

    def report(self, component: str, detail: str) -> None:
        """Open (or update) ``component``'s problem; its start time is kept."""
        previous = self._problems.get(component)
        since = previous.since if previous is not None else self._clock()
        self._problems[component] = Problem(component, detail, since)

    def clear(self, component: str) -> None:
        self._problems.pop(component, None)

    @property
    def ok(self) -> bool:
        return not self._problems

    def problems(self) -> list[Problem]:
        return sorted(self._problems.values(), key=lambda p: p.component)

    def describe(self) -> list[dict[str, object]]:
        now = self._clock()
        return [
            {"component": p.component, "detail": p.detail, "for_seconds": round(now - p.since, 1)}
            for p in self.problems()
        ]
