"""Where a running ``compactor dev up`` stack is: its ``stack.json``, and whether it still runs.

Why a module of its own: every command (the worker included) asks
:func:`dev_stack_bootstrap` / :func:`dev_stack_dsn` on start-up, through
``streams.addresses.configured_bootstrap``/``streams.database.configured_dsn``, when neither the
environment nor the config file names a broker or a database. That question
needs only a small file and ``/proc``; the code that starts and stops the
stack (a JVM launcher, Maven, docker compose) lives in ``devtools`` and must
stay off the worker's import path. ``devtools.devstack`` writes this state,
this module reads it; both use the format defined here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("compactor.devstack")

DEV_STATE_DIR_ENV = "COMPACTOR_DEV_STATE_DIR"
DEFAULT_STATE_DIR = Path(".state/dev")

KAFKA = "kafka"
POSTGRES = "postgres"

#: ``StackState.launcher``: recorded pids, or containers (no pids: ``docker compose down``).
PROCESSES = "processes"
DOCKER_COMPOSE = "docker-compose"

#: The modules ``dev up`` runs with ``python -m`` for each service.
KAFKA_LAUNCHER_MODULE = "devtools.localstack"
POSTGRES_LAUNCHER_MODULE = "devtools.embedded_postgres"

#: A recorded pid counts as ours only while its command line still names the
#: module that ``dev up`` ran: after a reboot the same number may be anything.
_MARKERS = {KAFKA: KAFKA_LAUNCHER_MODULE, POSTGRES: POSTGRES_LAUNCHER_MODULE}


class StackStateError(RuntimeError):
    """``stack.json`` exists but cannot be read."""


def default_state_dir() -> Path:
    """``$COMPACTOR_DEV_STATE_DIR`` or ``.state/dev`` (relative to the working directory,
    like every other ``.state`` default, so each checkout has its own stack)."""
    return Path(os.environ.get(DEV_STATE_DIR_ENV) or DEFAULT_STATE_DIR)


# --------------------------------------------------------------------------- liveness


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; it is not a running broker. But a JVM's
    # main thread exits first: its leader shows "Z" while the other threads
    # are still shutting down (and the process cannot be reaped yet), so a
    # zombie only counts as gone once it has no other threads left.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                return True
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:  # vanished while we looked
        return os.path.exists(f"/proc/{pid}")


def process_cmdline(pid: int) -> bytes | None:
    """``pid``'s NUL-separated command line, or None without ``/proc`` (or once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def owns_pid(service: str, pid: int) -> bool:
    """Whether ``pid`` is still the process ``dev up`` started for ``service``."""
    if not pid_alive(pid):
        return False
    argv = process_cmdline(pid)
    if argv is None:
        return True  # no /proc: trust the pid
    return _MARKERS[service].encode() in argv


# --------------------------------------------------------------------------- state file


@dataclasses.dataclass
class StackState:
    """What ``dev up`` started, for ``dev status``/``dev down`` in a later process.

    ``launcher`` says how to stop it: ``"processes"`` (the recorded pids) or
    ``"docker-compose"`` (containers, no pids: ``docker compose down``).
    """

    kafka_bootstrap: str | None = None
    postgres_dsn: str | None = None
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    data_dirs: dict[str, str] = dataclasses.field(default_factory=dict)
    started_at: float = dataclasses.field(default_factory=time.time)
    launcher: str = PROCESSES

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackState:
        return cls(
            kafka_bootstrap=data.get("kafka_bootstrap"),
            postgres_dsn=data.get("postgres_dsn"),
            pids={str(k): int(v) for k, v in dict(data.get("pids") or {}).items()},
            data_dirs={str(k): str(v) for k, v in dict(data.get("data_dirs") or {}).items()},
            started_at=float(data.get("started_at") or 0.0),
            launcher=str(data.get("launcher") or PROCESSES),
        )

    def alive_pids(self) -> dict[str, int]:
        return {name: pid for name, pid in self.pids.items() if pid_alive(pid)}


def state_path(state_dir: Path) -> Path:
    return Path(state_dir) / "stack.json"


def write_state(state_dir: Path, state: StackState) -> Path:
    """Atomically replace ``stack.json``, so a concurrent reader never sees half a file."""
    path = state_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_state(state_dir: Path) -> StackState | None:
    try:
        data = json.loads(state_path(state_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StackStateError(f"unreadable {state_path(state_dir)}: {exc}") from exc
    if not isinstance(data, dict):
        raise StackStateError(f"unreadable {state_path(state_dir)}: not an object")
    return StackState.from_json(data)


def clear_state(state_dir: Path) -> None:
    state_path(state_dir).unlink(missing_ok=True)


# --------------------------------------------------------------------------- lookup


def service_alive(state: StackState, service: str) -> bool:
    if state.launcher == DOCKER_COMPOSE:
        return True  # containers: no pid to check; "answering" tells the truth
    pid = state.pids.get(service)
    return pid is not None and owns_pid(service, pid)


def running_stack(state_dir: Path | None = None) -> StackState | None:
    """The dev stack recorded in ``state_dir``, keeping only the services still running.

    Cheap (a small file and ``/proc``), never raises, and never touches the
    network: it runs on every command's start-up.
    """
    directory = state_dir if state_dir is not None else default_state_dir()
    try:
        state = read_state(directory)
    except StackStateError as error:
        log.warning("ignoring the dev stack state: %s", error)
        return None
    if state is None:
        return None
    if not service_alive(state, KAFKA):
        state.kafka_bootstrap = None
    if not service_alive(state, POSTGRES):
        state.postgres_dsn = None
    if state.kafka_bootstrap is None and state.postgres_dsn is None:
        return None
    return state


def dev_stack_bootstrap(state_dir: Path | None = None) -> str | None:
    """The broker of a running ``compactor dev up`` stack, if any."""
    state = running_stack(state_dir)
    return state.kafka_bootstrap if state is not None else None


def dev_stack_dsn(state_dir: Path | None = None) -> str | None:
    """The PostgreSQL of a running ``compactor dev up`` stack, if any."""
    state = running_stack(state_dir)
    return state.postgres_dsn if state is not None else None


@dataclasses.dataclass
class Explicit:
    """Addresses given by the environment or config file: ``dev`` uses them, never starts.

    Built by ``streams.database.explicit_addresses``; read by ``devtools.devstack``.
    """

    kafka_bootstrap: str | None
    kafka_source: str
    postgres_dsn: str | None
    postgres_source: str
