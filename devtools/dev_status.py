"""``compactor dev status``: what every other command would use, checked for real."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from devtools.dev_compose import COMPOSE_FILE
from devtools.dev_services import SERVICES, ServiceReport, address_of, answers
from streams.stack_state import (
    DEFAULT_STATE_DIR,
    DEV_STATE_DIR_ENV,
    DOCKER_COMPOSE,
    KAFKA,
    PROCESSES,
    Explicit,
    StackState,
    StackStateError,
    owns_pid,
    read_state,
    state_path,
)


async def status(state_dir: Path, explicit: Explicit) -> list[ServiceReport]:
    """What every other command would use, one report per service, checked for real."""
    try:
        state = read_state(state_dir)
    except StackStateError:
        state = None
    reports = []
    for name in SERVICES:
        given = explicit.kafka_bootstrap if name == KAFKA else explicit.postgres_dsn
        source = explicit.kafka_source if name == KAFKA else explicit.postgres_source
        if given:
            ok = await answers(name, given)
            reports.append(ServiceReport(name, "configured", source, given, None, None, ok))
        elif state is None:
            reports.append(
                ServiceReport(
                    name, "not running", "run `compactor dev up`", None, None, None, False
                )
            )
        else:
            reports.append(await _recorded_status(state_dir, state, name))
    return reports


async def _recorded_status(state_dir: Path, state: StackState, name: str) -> ServiceReport:
    """A service ``dev up`` recorded: is its process ours, and does it answer."""
    address = address_of(state, name)
    pid = state.pids.get(name)
    alive = None if pid is None else owns_pid(name, pid)
    ok = False
    if address and alive is not False:
        ok = await answers(name, address)
    if state.launcher == DOCKER_COMPOSE:
        source_name: Literal["started", "docker compose"] = "docker compose"
        detail = state.data_dirs.get("compose_file", str(COMPOSE_FILE))
    else:
        source_name = "started"
        detail = f"dev up, {state_path(state_dir)}"
    log = state_dir / f"{name}.log" if state.launcher == PROCESSES else None
    return ServiceReport(name, source_name, detail, address, pid, alive, ok, log=log)


def export_lines(reports: list[ServiceReport], state_dir: Path) -> list[str]:
    """Shell lines that point other tools (and other directories) at this stack."""
    lines = []
    for report in reports:
        if report.address is None or report.source == "configured":
            continue
        var = "KAFKA_BOOTSTRAP_SERVERS" if report.name == KAFKA else "POSTGRES_DSN"
        lines.append(f"export {var}='{report.address}'")
    if Path(state_dir) != DEFAULT_STATE_DIR:
        lines.append(f"export {DEV_STATE_DIR_ENV}='{Path(state_dir).resolve()}'")
    return lines
