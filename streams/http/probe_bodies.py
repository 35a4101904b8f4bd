"""What the probes answer: ``/healthz``, ``/livez`` and ``/readyz``."""

from __future__ import annotations

from typing import Literal

from streams.http.bodies import Body


class HealthProblem(Body):
    component: str
    detail: str
    for_seconds: float


class Health(Body):
    """``GET /healthz``: ``ok``, or ``degraded`` (503) with the problems."""

    status: Literal["ok", "degraded"]
    problems: list[HealthProblem]
    app_id: str
    summariser: str
    assigned_partitions: list[str]


class Liveness(Body):
    status: Literal["alive", "dead"]
    reasons: list[str]
    agents: dict[str, str]


class Readiness(Body):
    status: Literal["ready", "not ready"]
    reasons: list[str]
    assigned_partitions: int
    degraded: bool
