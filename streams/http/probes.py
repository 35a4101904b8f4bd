"""Kubernetes probes of a worker: ``/livez`` (restart me?) and ``/readyz`` (send me traffic?).

Both are open: the guard (``streams.http.guard``) lets ``PROBE_PATHS``
through without a token, even when ``[service].metrics_token`` protects
``/healthz`` and ``/metrics``, since a kubelet cannot hold a secret. So their
bodies say only what a probe needs: a status, the reasons, counts; never a
host name, an error message or a partition's topic. ``/healthz`` is unchanged
(the readiness-like view with the problem details, for compatibility).

``/livez``: the process answers, so its event loop runs (a blocked loop makes
the probe time out, which the kubelet counts as a failure), and the Faust app
and its agents are not dead. It never looks at PostgreSQL, Kafka or the LLM:
restarting a worker does not bring a database back, and restarting every
worker at once while it is away would only add table recoveries to the outage.
"Agents running" is judged per agent from what Faust exposes:

- the app must not be stopping or crashed (``app.should_stop``, which is
  mode's ``Service`` state: stopped or crashed);
- an agent that crashed (``agent.crashed``) is dead;
- an agent that has not started, or has started but has no actor yet, is
  *starting* (Faust starts the web server before the agents, so the probe
  answers before them): alive, the startupProbe covers that stretch;
- a started agent must have at least one actor whose task has not ended
  (Faust keeps them in ``agent._actors``; no public accessor exists, so it
  is read with ``getattr`` and an agent without it counts as starting).
  An actor waiting for PostgreSQL (``WorkerRuntime.wait_open``) is running.

``/readyz``: ready to serve the HTTP API, i.e. every one of

- the worker's runtime is open (``runtime.is_open``: PostgreSQL, the
  embedder and the model were opened at start-up);
- table recovery has finished (``not app.in_recovery``: the token table
  answers ``/conversations/{id}`` from complete data);
- partitions are assigned (``app.consumer.assignment()``): a worker with
  none owns no table entry. With more replicas than partitions some workers
  never get one and stay unready (keep replicas ≤ ``[kafka].partitions``);
- the database answers a cheap store call (``compaction_applied`` of an id
  that never exists: one index lookup) within ``db_timeout`` seconds. Under
  a saturated connection pool that can time out: the worker would answer
  reads slowly then too, so being taken out of the Service is right.

503 with ``reasons`` otherwise. ``degraded`` (``Health``: some component is
riding out an outage; details on ``/healthz``) is reported, not judged:
readiness follows the conditions above only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

import faust
from faust.web import Request, Response, View

from core.ports.storage import CompactionLedger
from streams.worker.components import Components

LIVEZ = "/livez"
READYZ = "/readyz"
PROBE_PATHS = frozenset({LIVEZ, READYZ})
# The store call /readyz makes: an id no compaction ever has (ids are UUID-like).
PROBE_COMPACTION_ID = "readyz-probe"
DEFAULT_DB_TIMEOUT_SECONDS = 2.0


class ProbeRuntime(Protocol):
    """What the probes need of ``streams.runtime.WorkerRuntime``."""

    @property
    def is_open(self) -> bool: ...

    @property
    def compactions(self) -> CompactionLedger: ...


def agent_state(agent: Any) -> str:
    """``running``, ``starting``, ``crashed``, ``stopped`` or ``exited`` (see the module doc)."""
    if agent.crashed:
        return "crashed"
    if not agent.started:
        return "starting"
    if agent.should_stop:
        return "stopped"
    tasks = [getattr(actor, "actor_task", None) for actor in getattr(agent, "_actors", ())]
    if not tasks:
        return "starting"
    if any(task is not None and not task.done() for task in tasks):
        return "running"
    return "exited"


ALIVE_STATES = frozenset({"running", "starting"})


def liveness(app: faust.App) -> tuple[bool, dict[str, Any]]:
    """(alive?, body) of ``/livez``."""
    reasons: list[str] = []
    if app.should_stop:
        reasons.append(f"app is {app.state}")
    agents = {name: agent_state(agent) for name, agent in _agents(app)}
    reasons += [
        f"agent {name} is {state}" for name, state in agents.items() if state not in ALIVE_STATES
    ]
    body = {"status": "alive" if not reasons else "dead", "reasons": reasons, "agents": agents}
    return not reasons, body


def _agents(app: faust.App) -> Iterable[tuple[str, Any]]:
    return list(app.agents.items())


def assigned_partitions(app: faust.App) -> int:
    try:
        return len(app.consumer.assignment())
    except Exception:  # not started yet (or stopping): nothing assigned
        return 0


async def readiness(
    app: faust.App,
    runtime: ProbeRuntime,
    components: Components[Any],
    db_timeout: float = DEFAULT_DB_TIMEOUT_SECONDS,
) -> tuple[bool, dict[str, Any]]:
    """(ready?, body) of ``/readyz``."""
    reasons: list[str] = []
    is_open = runtime.is_open
    if not is_open:
        reasons.append("runtime not open: PostgreSQL has not been opened yet")
    if app.in_recovery:
        reasons.append("table recovery in progress")
    assigned = assigned_partitions(app)
    if not assigned:
        reasons.append("no partitions assigned")
    if is_open:
        problem = await database_problem(runtime, db_timeout)
        if problem is not None:
            reasons.append(problem)
    body = {
        "status": "ready" if not reasons else "not ready",
        "reasons": reasons,
        "assigned_partitions": assigned,
        "degraded": not components.health.ok,
    }
    return not reasons, body


async def database_problem(runtime: ProbeRuntime, seconds: float) -> str | None:
    """Why the database does not answer within ``seconds``, or None; the error's
    type only (an open view must not echo a host or a DSN)."""
    try:
        async with asyncio.timeout(seconds):
            await runtime.compactions.compaction_applied(PROBE_COMPACTION_ID)
    except TimeoutError:
        return f"database: no answer within {seconds:g}s"
    except Exception as error:
        return f"database: {type(error).__name__}"
    return None


def register_probes(
    app: faust.App,
    components: Components[Any],
    runtime: ProbeRuntime,
    *,
    db_timeout: float = DEFAULT_DB_TIMEOUT_SECONDS,
) -> None:
    """``/livez`` and ``/readyz`` (open: the guard lets ``PROBE_PATHS`` through)."""

    @app.page(LIVEZ)
    class Livez(View):
        async def get(self, request: Request) -> Response:
            alive, body = liveness(app)
            return self.json(body, status=200 if alive else 503)

    @app.page(READYZ)
    class Readyz(View):
        async def get(self, request: Request) -> Response:
            ready, body = await readiness(app, runtime, components, db_timeout)
            return self.json(body, status=200 if ready else 503)
