"""``compactor dev up|down|status``: a local Kafka and PostgreSQL that outlive the command.

Why: the worker, ``replay``, ``tail`` and ``compact`` all need a broker and a
database, and copying ports between terminals is where local setups go wrong.
``dev up`` starts both once, as detached processes whose files (data, logs,
``stack.json``) live in one state directory, and every other command finds
them through ``streams.stack_state.dev_stack_bootstrap``/``dev_stack_dsn``
(used by ``streams.addresses.configured_bootstrap``/``streams.database.configured_dsn`` after the
environment and the config file). That lookup, and the format of
``stack.json``, live in ``streams.stack_state`` so that the worker never
imports this module.

Without Java and Maven the broker cannot run from jars; if a Docker engine
answers, ``docker compose`` runs both services from ``docker-compose.yml``
instead, and ``stack.json`` records that so ``dev down`` stops the containers.

This module decides ``up`` and ``down`` (under a lock on the state
directory); the work is done by ``dev_services`` (probes, reports),
``dev_processes`` (the launchers started and stopped), ``dev_ports`` (a
restarted broker's ports), ``dev_compose`` (docker compose) and
``dev_status`` (``dev status`` and the shell exports).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

from core.adapters.postgres.migrate import migrate
from devtools.dev_compose import (
    COMPOSE_BOOTSTRAP,
    COMPOSE_DSN,
    COMPOSE_FILE,
    compose_down,
    compose_up,
    docker_engine_available,
    record_compose,
)
from devtools.dev_ports import kafka_ports_to_reuse
from devtools.dev_processes import (
    KafkaPorts,
    launch_kafka,
    launch_postgres,
    stop_processes,
    stop_service,
)
from devtools.dev_services import (
    SERVICES,
    DevStackError,
    Say,
    ServiceReport,
    address_of,
    answers,
    redact_dsn,
)
from devtools.dev_status import export_lines, status
from devtools.kafka_errors import MissingToolError
from devtools.kafka_jars import ensure_kafka_jars, find_java
from streams.stack_state import (
    DOCKER_COMPOSE,
    KAFKA,
    POSTGRES,
    PROCESSES,
    Explicit,
    StackState,
    StackStateError,
    clear_state,
    read_state,
    service_alive,
    state_path,
    write_state,
)

__all__ = [
    "COMPOSE_BOOTSTRAP",
    "COMPOSE_DSN",
    "DevStackError",
    "ServiceReport",
    "down",
    "export_lines",
    "redact_dsn",
    "status",
    "up",
]

INSTALL_HINT = (
    "install OpenJDK 17+ and Maven (Debian/Ubuntu: "
    "apt-get install -y openjdk-17-jre-headless maven), or a Docker engine with the "
    "compose plugin; or point KAFKA_BOOTSTRAP_SERVERS at a broker you already run"
)


def _open_lock_file(state_dir: Path) -> IO[str]:
    state_dir.mkdir(parents=True, exist_ok=True)
    return (state_dir / ".lock").open("a+")


@contextlib.asynccontextmanager
async def _state_lock(state_dir: Path, say: Say) -> AsyncIterator[None]:
    """One ``dev up``/``dev down`` per state dir at a time: two would start two stacks."""
    with _open_lock_file(state_dir) as handle:
        warned = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not warned:
                    say(f"another dev command holds {state_dir}; waiting for it")
                    warned = True
                await asyncio.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _java_tools_problem() -> str | None:
    """Why the broker cannot run from jars here, or None if it can (resolving them if needed)."""
    try:
        find_java()
        ensure_kafka_jars()
    except MissingToolError as error:
        return str(error)
    return None


# --------------------------------------------------------------------------- up


async def up(
    state_dir: Path,
    explicit: Explicit,
    *,
    partitions: int = 4,
    say: Say = print,
) -> list[ServiceReport]:
    """Bring Kafka and PostgreSQL up (or confirm they are), and return one report per service.

    Idempotent: services recorded in ``stack.json`` that still run and answer
    are left alone; dead or hung ones are restarted on their recorded address
    and data directory (running workers reconnect to them; see
    ``dev_ports.kafka_ports_to_reuse``). The state file is written after each
    start, so a failure half-way still lets ``dev down`` clean up.
    """
    async with _state_lock(state_dir, say):
        return await _up_locked(state_dir, explicit, partitions, say)


async def _up_locked(
    state_dir: Path, explicit: Explicit, partitions: int, say: Say
) -> list[ServiceReport]:
    try:
        previous = read_state(state_dir)
    except StackStateError as error:
        say(f"ignoring {error}: starting afresh")
        previous = None
    state = previous or StackState()
    reports = await _configured(explicit)
    wanted = [name for name in SERVICES if name not in reports]
    if not wanted:
        return [reports[name] for name in SERVICES]
    needed: list[str] = []
    for name in wanted:
        kept = None if previous is None else await _still_running(state_dir, state, name, say)
        if kept is not None:
            reports[name] = kept
        else:
            needed.append(name)
    if needed:
        if previous is not None and previous.launcher == DOCKER_COMPOSE:
            await compose_up(needed, say, "this stack runs in docker compose")
            record_compose(state, needed)
            write_state(state_dir, state)
        else:
            needed = await _start_needed(state_dir, state, needed, wanted, partitions, say)
        for name in needed:
            reports[name] = _fresh_report(state_dir, state, name)
    if POSTGRES in needed and state.postgres_dsn:
        applied = await migrate(state.postgres_dsn)
        say(f"migrations: {', '.join(applied)} applied" if applied else "schema up to date")
    return [reports[name] for name in SERVICES]


async def _configured(explicit: Explicit) -> dict[str, ServiceReport]:
    """Addresses given by the environment or the config file: only checked, never started."""
    reports: dict[str, ServiceReport] = {}
    if explicit.kafka_bootstrap:
        if not await answers(KAFKA, explicit.kafka_bootstrap):
            raise DevStackError(
                f"Kafka at {explicit.kafka_bootstrap} (from {explicit.kafka_source}) does not "
                "answer; start it, or unset it to let `dev up` start a local broker"
            )
        reports[KAFKA] = ServiceReport(
            KAFKA, "configured", explicit.kafka_source, explicit.kafka_bootstrap, None, None, True
        )
    if explicit.postgres_dsn:
        if not await answers(POSTGRES, explicit.postgres_dsn):
            raise DevStackError(
                f"PostgreSQL at {redact_dsn(explicit.postgres_dsn)} (from "
                f"{explicit.postgres_source}) does not answer; start it, or unset it to let "
                "`dev up` start an embedded one"
            )
        reports[POSTGRES] = ServiceReport(
            POSTGRES,
            "configured",
            explicit.postgres_source,
            explicit.postgres_dsn,
            None,
            None,
            True,
        )
    return reports


async def _still_running(
    state_dir: Path, state: StackState, name: str, say: Say
) -> ServiceReport | None:
    """The report of a recorded service that still runs and answers; None if it must
    be started (a recorded process that runs but does not answer is stopped first)."""
    address = address_of(state, name)
    if not address or not service_alive(state, name):
        return None
    if await answers(name, address):
        docker = state.launcher == DOCKER_COMPOSE
        pid = state.pids.get(name)
        return ServiceReport(
            name,
            "already running",
            "docker compose" if docker else "dev up",
            address,
            pid,
            None if pid is None else True,
            True,
            log=None if docker else state_dir / f"{name}.log",
        )
    if state.launcher == PROCESSES and name in state.pids:
        say(f"{name} (pid {state.pids[name]}) runs but does not answer: restarting it")
        await asyncio.to_thread(stop_service, state, name, say)
    return None


def _fresh_report(state_dir: Path, state: StackState, name: str) -> ServiceReport:
    address = address_of(state, name)
    if state.launcher == DOCKER_COMPOSE:
        return ServiceReport(name, "docker compose", str(COMPOSE_FILE), address, None, None, True)
    log = state_dir / f"{name}.log"
    return ServiceReport(name, "started", "dev up", address, state.pids.get(name), True, True, log)


async def _start_needed(
    state_dir: Path,
    state: StackState,
    needed: list[str],
    wanted: list[str],
    partitions: int,
    say: Say,
) -> list[str]:
    """Start ``needed`` as local processes; returns the services (re)started.

    Without Java/Maven, every service the stack owns (``wanted``) moves to
    docker compose, including a healthy local PostgreSQL: one launcher per
    stack keeps ``dev down`` simple.
    """
    ports: KafkaPorts = (None, None)
    if KAFKA in needed:
        say("checking Java and the Kafka jars (the first run resolves them with Maven)")
        problem = await asyncio.to_thread(_java_tools_problem)
        if problem is not None:
            return await _move_to_compose(state_dir, state, wanted, problem, say)
        ports = await asyncio.to_thread(kafka_ports_to_reuse, state_dir, state, say)
    state.launcher = PROCESSES
    state.started_at = time.time()
    starts: dict[str, asyncio.Task[tuple[str, int]]] = {}
    if POSTGRES in needed:
        starts[POSTGRES] = asyncio.create_task(launch_postgres(state_dir, say))
    if KAFKA in needed:
        starts[KAFKA] = asyncio.create_task(launch_kafka(state_dir, partitions, say, ports))
    await asyncio.wait(starts.values())
    errors = _record_started(state_dir, state, starts, say)
    if state.pids:
        write_state(state_dir, state)
    if errors:
        up_now = [name for name, task in starts.items() if task.exception() is None]
        hint = f"\n({', '.join(up_now)} is up; `compactor dev down` stops it)" if up_now else ""
        raise DevStackError("\n".join(errors) + hint)
    return list(needed)


async def _move_to_compose(
    state_dir: Path, state: StackState, wanted: list[str], problem: str, say: Say
) -> list[str]:
    """No local broker possible: the whole stack in docker compose, if an engine answers."""
    if not await asyncio.to_thread(docker_engine_available):
        raise DevStackError(f"cannot start Kafka: {problem}.\nTo fix: {INSTALL_HINT}")
    if state.pids:
        await asyncio.to_thread(stop_processes, state, say)
    await compose_up(wanted, say, "no usable Java/Maven for a local broker")
    record_compose(state, wanted)
    write_state(state_dir, state)
    return list(wanted)


def _record_started(
    state_dir: Path, state: StackState, starts: dict[str, asyncio.Task[tuple[str, int]]], say: Say
) -> list[str]:
    """Each started service's address, pid and data dir into ``state``; the errors of the rest."""
    errors: list[str] = []
    for name, task in starts.items():
        error = task.exception()
        if error is not None:
            errors.append(str(error))
            continue
        address, pid = task.result()
        _warn_if_moved(name, address_of(state, name), address, say)
        state.pids[name] = pid
        state.data_dirs[name] = str((state_dir / name).resolve())
        if name == KAFKA:
            state.kafka_bootstrap = address
        else:
            state.postgres_dsn = address
    return errors


def _warn_if_moved(name: str, before: str | None, now: str, say: Say) -> None:
    """Say so when a restarted service is not where it was recorded.

    Kafka comes back on its recorded port and the embedded PostgreSQL on the
    socket its data directory implies, so this should not happen; if it does
    (pgserver chose another socket directory, say), whatever runs with the old
    address needs restarting, and silence would hide why it cannot connect.
    """
    if before and before != now:
        shown = redact_dsn if name == POSTGRES else str
        say(
            f"warning: {name} moved from {shown(before)} to {shown(now)}: restart anything "
            "(workers, tail) that was given the old address"
        )


# --------------------------------------------------------------------------- down


async def down(state_dir: Path, *, say: Say = print) -> bool:
    """Stop what ``dev up`` started in ``state_dir``; False if nothing was recorded."""
    async with _state_lock(state_dir, say):
        try:
            state = read_state(state_dir)
        except StackStateError as error:
            raise DevStackError(
                f"{error}; cannot tell what to stop: stop the processes named in "
                f"{state_dir}/*.log by hand, then delete {state_path(state_dir)}"
            ) from None
        if state is None:
            return False
        if state.launcher == DOCKER_COMPOSE:
            await compose_down(state, say)
        else:
            await asyncio.to_thread(stop_processes, state, say)
        clear_state(state_dir)
        (state_dir / "kafka.ready").unlink(missing_ok=True)
        return True
