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
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from core.adapters.postgres.migrate import migrate
from devtools.localstack import (
    REPO_ROOT,
    MissingToolError,
    ensure_kafka_jars,
    find_java,
    stop_process,
)
from streams.kafka.probe import LOOPBACK, is_reachable
from streams.stack_state import (
    DEFAULT_STATE_DIR,
    DEV_STATE_DIR_ENV,
    DOCKER_COMPOSE,
    KAFKA,
    KAFKA_LAUNCHER_MODULE,
    POSTGRES,
    POSTGRES_LAUNCHER_MODULE,
    PROCESSES,
    Explicit,
    StackState,
    StackStateError,
    clear_state,
    owns_pid,
    pid_alive,
    process_cmdline,
    read_state,
    service_alive,
    state_path,
    write_state,
)

SERVICES: tuple[str, ...] = (KAFKA, POSTGRES)

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
#: Where ``docker-compose.yml`` publishes the services on the host.
COMPOSE_BOOTSTRAP = "127.0.0.1:9092"
COMPOSE_DSN = "postgresql://compactor:compactor@127.0.0.1:5432/compactor"

INSTALL_HINT = (
    "install OpenJDK 17+ and Maven (Debian/Ubuntu: "
    "apt-get install -y openjdk-17-jre-headless maven), or a Docker engine with the "
    "compose plugin; or point KAFKA_BOOTSTRAP_SERVERS at a broker you already run"
)

KAFKA_READY_TIMEOUT = 180.0
POSTGRES_READY_TIMEOUT = 90.0
COMPOSE_READY_TIMEOUT = 240.0

Say = Callable[[str], None]
#: The broker's client and controller ports; None lets the launcher pick a free one.
KafkaPorts = tuple[int | None, int | None]


class DevStackError(RuntimeError):
    """``dev up`` could not bring a service up; the message says what to do."""


async def kafka_answers(bootstrap: str, probe_seconds: float = 2.0) -> bool:
    return await asyncio.to_thread(is_reachable, bootstrap, probe_seconds)


async def postgres_answers(dsn: str, probe_seconds: float = 5.0) -> bool:
    """A real login and ``SELECT 1``: an open port alone can still refuse connections."""
    try:
        conn = await asyncio.wait_for(
            asyncpg.connect(dsn, timeout=probe_seconds), probe_seconds + 1
        )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for tables and logs."""
    parts = urlsplit(dsn)
    if parts.password:
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    return dsn


# --------------------------------------------------------------------------- helpers


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _read_line_value(path: Path, prefix: str) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


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


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached: its own session, so neither the terminal's Ctrl-C nor the
    end of this command reaches it; output goes to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


# --------------------------------------------------------------------------- results


@dataclass
class ServiceReport:
    """One line of ``dev up``/``dev status``."""

    name: str
    source: Literal["configured", "started", "already running", "docker compose", "not running"]
    detail: str  # where the address came from, e.g. "$KAFKA_BOOTSTRAP_SERVERS"
    address: str | None
    pid: int | None
    pid_alive: bool | None
    answering: bool
    log: Path | None = None

    def line(self) -> str:
        address = self.address or "-"
        if self.name == POSTGRES and self.address:
            address = redact_dsn(self.address)
        if self.pid is None:
            pid = "pid -"
        else:
            pid = f"pid {self.pid} {'alive' if self.pid_alive else 'gone'}"
        health = "answering" if self.answering else "NOT answering"
        log = f"  log {self.log}" if self.log is not None else ""
        return f"{self.name:<9} {self.source} ({self.detail})  {address}  {pid}  {health}{log}"


# --------------------------------------------------------------------------- up


async def _await_answer(
    name: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    *,
    address: Callable[[], str | None],
    answers: Callable[[str], Awaitable[bool]],
    within: float,
    stop_grace: float,
    interval: float,
) -> tuple[str, int]:
    """Wait until the service started as ``proc`` prints its address and answers there.

    Fails early if the process exits, and stops it if it never answers.
    """
    deadline = time.monotonic() + within
    while True:
        found = address()
        if found is not None and await answers(found):
            return found, proc.pid
        code = proc.poll()
        if code is not None:
            raise DevStackError(
                f"{name} exited with code {code} before answering; "
                f"log {log_path}:\n{_log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            await asyncio.to_thread(stop_process, proc.pid, stop_grace)
            raise DevStackError(
                f"{name} did not answer within {within:.0f}s; "
                f"log {log_path}:\n{_log_tail(log_path)}"
            )
        await asyncio.sleep(interval)


async def _start_postgres(state_dir: Path, say: Say) -> tuple[str, int]:
    data_dir = (state_dir / POSTGRES).resolve()
    log_path = (state_dir / "postgres.log").resolve()
    offset = log_path.stat().st_size if log_path.exists() else 0
    proc = _spawn(
        [sys.executable, "-m", POSTGRES_LAUNCHER_MODULE, "--data-dir", str(data_dir)], log_path
    )
    say(f"starting PostgreSQL (embedded, data in {data_dir}, pid {proc.pid})")
    return await _await_answer(
        "embedded PostgreSQL",
        proc,
        log_path,
        address=lambda: _dsn_after(log_path, offset),
        answers=postgres_answers,
        within=POSTGRES_READY_TIMEOUT,
        stop_grace=10,
        interval=0.2,
    )


def _dsn_after(log_path: Path, offset: int) -> str | None:
    """The ``POSTGRES_DSN=`` line this start printed (not one from an earlier run)."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    match = re.search(r"^POSTGRES_DSN=(\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


async def _start_kafka(
    state_dir: Path, partitions: int, say: Say, ports: KafkaPorts = (None, None)
) -> tuple[str, int]:
    """Start the broker on ``ports`` (client, controller; None: a free one)."""
    data_dir = (state_dir / KAFKA).resolve()
    log_path = (state_dir / "kafka.log").resolve()
    ready = (state_dir / "kafka.ready").resolve()
    ready.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        KAFKA_LAUNCHER_MODULE,
        "kafka",
        "--data-dir",
        str(data_dir),
        "--ready-file",
        str(ready),
        "--partitions",
        str(partitions),
        "--ready-timeout",
        str(KAFKA_READY_TIMEOUT - 10),
    ]
    for option, port in zip(("--port", "--controller-port"), ports, strict=True):
        if port is not None:
            argv += [option, str(port)]
    proc = _spawn(argv, log_path)
    where = f", port {ports[0]} as before" if ports[0] is not None else ""
    say(f"starting Kafka (KRaft, data in {data_dir}{where}, pid {proc.pid})")
    return await _await_answer(
        "Kafka",
        proc,
        log_path,
        address=lambda: _read_line_value(ready, "KAFKA_BOOTSTRAP="),
        answers=kafka_answers,
        within=KAFKA_READY_TIMEOUT,
        stop_grace=20,
        interval=0.3,
    )


def _port_free(port: int) -> bool:
    """Whether the broker could listen on ``port`` (a TIME_WAIT left by a dead one is fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _port_holder(port: int) -> str | None:
    """``pid N (command)`` of the process listening on ``port``, as far as ``/proc`` tells."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if len(fields) > 9 and fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc_dir in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc_dir / "fd").iterdir()):
                argv = (process_cmdline(int(proc_dir.name)) or b"").replace(b"\0", b" ")
                return f"pid {proc_dir.name} ({argv.decode(errors='replace').strip()[:100]})"
    return None


def _recorded_controller_port(data_dir: Path) -> int | None:
    """The controller port in the broker's last ``server.properties``, if there is one."""
    listeners = _read_line_value(data_dir / "server.properties", "listeners=") or ""
    match = re.search(r"CONTROLLER://[^,]*:(\d+)", listeners)
    return int(match.group(1)) if match else None


def _reuse_kafka_ports(state_dir: Path, state: StackState, say: Say) -> KafkaPorts:
    """The ports a restarted broker must take again: the ones recorded before.

    Workers and other commands were given the recorded bootstrap address, and a
    broker on a new port is one they never find again. So a recorded client port
    taken by another process is an error naming it, never a quiet move; the
    controller port, which only the broker itself uses, moves with a note.
    """
    if state.launcher != PROCESSES or not state.kafka_bootstrap:
        return (None, None)
    _stop_service(state, KAFKA, say)  # a broker JVM its killed launcher left behind
    try:
        port = int(state.kafka_bootstrap.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return (None, None)
    if not _port_free(port):
        holder = _port_holder(port) or "another process"
        raise DevStackError(
            f"cannot restart Kafka on {state.kafka_bootstrap}, the address recorded in "
            f"{state_path(state_dir)} that workers and other commands were given: port {port} "
            f"is now taken by {holder}.\nTo fix: stop that process and run `compactor dev up` "
            "again; or run `compactor dev down` and `compactor dev up` to start the stack on "
            "new ports (then restart whatever was given the old address)"
        )
    controller = _recorded_controller_port((state_dir / KAFKA).resolve())
    if controller is not None and not _port_free(controller):
        holder = _port_holder(controller) or "another process"
        say(
            f"Kafka's controller port {controller} (internal, clients never use it) is taken "
            f"by {holder}: the broker gets a new one, its client port stays {port}"
        )
        controller = None
    return (port, controller)


def _java_tools_problem() -> str | None:
    """Why the broker cannot run from jars here, or None if it can (resolving them if needed)."""
    try:
        find_java()
        ensure_kafka_jars()
    except MissingToolError as error:
        return str(error)
    return None


def docker_engine_available() -> bool:
    """``docker info`` succeeds: a client alone (no engine) cannot run anything."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        proc = subprocess.run(
            [docker, "info"], capture_output=True, timeout=20, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


#: Compose interpolates the whole file, the worker's required API token included,
#: even when only Kafka and PostgreSQL are started; ``dev`` never starts the worker.
INFRA_ONLY_ENV = {"COMPACTOR_API_TOKENS": "unused-dev-stack-starts-no-worker"}


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    docker = shutil.which("docker") or "docker"
    cmd = [docker, "compose", "-f", str(COMPOSE_FILE), *args]
    env = {**INFRA_ONLY_ENV, **os.environ}
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DevStackError(f"`{' '.join(cmd)}` failed: {error}") from error


async def _compose_up(services: list[str], say: Say, why: str) -> None:
    if not COMPOSE_FILE.exists():
        raise DevStackError(f"{why}, and there is no {COMPOSE_FILE} to run with docker compose")
    say(f"{why}: starting {', '.join(services)} with docker compose ({COMPOSE_FILE})")
    proc = await asyncio.to_thread(_compose, "up", "-d", *services)
    if proc.returncode != 0:
        raise DevStackError(
            f"`docker compose up -d {' '.join(services)}` failed (exit {proc.returncode}):\n"
            + (proc.stderr or proc.stdout)[-3000:]
        )
    deadline = time.monotonic() + COMPOSE_READY_TIMEOUT
    while time.monotonic() < deadline:
        kafka_ok = KAFKA not in services or await kafka_answers(COMPOSE_BOOTSTRAP)
        pg_ok = POSTGRES not in services or await postgres_answers(COMPOSE_DSN)
        if kafka_ok and pg_ok:
            return
        await asyncio.sleep(1.0)
    raise DevStackError(
        f"docker compose started {', '.join(services)} but they did not answer within "
        f"{COMPOSE_READY_TIMEOUT:.0f}s; see `docker compose -f {COMPOSE_FILE} logs`"
    )


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
    :func:`_reuse_kafka_ports`). The state file is written after each start, so
    a failure half-way still lets ``dev down`` clean up.
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
    reports: dict[str, ServiceReport] = {}

    # Given addresses: only check them.
    if explicit.kafka_bootstrap:
        if not await kafka_answers(explicit.kafka_bootstrap):
            raise DevStackError(
                f"Kafka at {explicit.kafka_bootstrap} (from {explicit.kafka_source}) does not "
                "answer; start it, or unset it to let `dev up` start a local broker"
            )
        reports[KAFKA] = ServiceReport(
            KAFKA, "configured", explicit.kafka_source, explicit.kafka_bootstrap, None, None, True
        )
    if explicit.postgres_dsn:
        if not await postgres_answers(explicit.postgres_dsn):
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
    wanted = [name for name in SERVICES if name not in reports]
    if not wanted:
        return [reports[name] for name in SERVICES]

    # Recorded and still healthy: keep.
    needed: list[str] = []
    for name in wanted:
        address = state.kafka_bootstrap if name == KAFKA else state.postgres_dsn
        if previous is not None and address and service_alive(state, name):
            healthy = await (kafka_answers(address) if name == KAFKA else postgres_answers(address))
            if healthy:
                docker = state.launcher == DOCKER_COMPOSE
                pid = state.pids.get(name)
                reports[name] = ServiceReport(
                    name,
                    "already running",
                    "docker compose" if docker else "dev up",
                    address,
                    pid,
                    None if pid is None else True,
                    True,
                    log=None if docker else state_dir / f"{name}.log",
                )
                continue
            if state.launcher == PROCESSES and name in state.pids:
                say(f"{name} (pid {state.pids[name]}) runs but does not answer: restarting it")
                await asyncio.to_thread(_stop_service, state, name, say)
        needed.append(name)

    if needed:
        if previous is not None and previous.launcher == DOCKER_COMPOSE:
            await _compose_up(needed, say, "this stack runs in docker compose")
            _record_compose(state, needed)
            write_state(state_dir, state)
        else:
            needed = await _start_needed(state_dir, state, needed, wanted, partitions, say)
        for name in needed:
            reports[name] = _fresh_report(state_dir, state, name)

    if POSTGRES in needed and state.postgres_dsn:
        applied = await migrate(state.postgres_dsn)
        say(f"migrations: {', '.join(applied)} applied" if applied else "schema up to date")
    return [reports[name] for name in SERVICES]


def _record_compose(state: StackState, services: list[str]) -> None:
    state.launcher = DOCKER_COMPOSE
    state.pids = {}
    state.data_dirs["compose_file"] = str(COMPOSE_FILE)
    if KAFKA in services:
        state.kafka_bootstrap = COMPOSE_BOOTSTRAP
    if POSTGRES in services:
        state.postgres_dsn = COMPOSE_DSN


def _fresh_report(state_dir: Path, state: StackState, name: str) -> ServiceReport:
    address = state.kafka_bootstrap if name == KAFKA else state.postgres_dsn
    if state.launcher == DOCKER_COMPOSE:
        return ServiceReport(name, "docker compose", str(COMPOSE_FILE), address, None, None, True)
    return ServiceReport(
        name,
        "started",
        "dev up",
        address,
        state.pids.get(name),
        True,
        True,
        log=state_dir / f"{name}.log",
    )


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
    if KAFKA in needed:
        say("checking Java and the Kafka jars (the first run resolves them with Maven)")
        problem = await asyncio.to_thread(_java_tools_problem)
        if problem is not None:
            if not await asyncio.to_thread(docker_engine_available):
                raise DevStackError(f"cannot start Kafka: {problem}.\nTo fix: {INSTALL_HINT}")
            if state.pids:
                await asyncio.to_thread(_stop_processes, state, say)
            await _compose_up(wanted, say, "no usable Java/Maven for a local broker")
            _record_compose(state, wanted)
            write_state(state_dir, state)
            return list(wanted)

    ports: KafkaPorts = (None, None)
    if KAFKA in needed:
        ports = await asyncio.to_thread(_reuse_kafka_ports, state_dir, state, say)
    state.launcher = PROCESSES
    state.started_at = time.time()
    starts: dict[str, asyncio.Task[tuple[str, int]]] = {}
    if POSTGRES in needed:
        starts[POSTGRES] = asyncio.create_task(_start_postgres(state_dir, say))
    if KAFKA in needed:
        starts[KAFKA] = asyncio.create_task(_start_kafka(state_dir, partitions, say, ports))
    await asyncio.wait(starts.values())
    errors: list[str] = []
    for name, task in starts.items():
        error = task.exception()
        if error is not None:
            errors.append(str(error))
            continue
        address, pid = task.result()
        _warn_if_moved(
            name, state.kafka_bootstrap if name == KAFKA else state.postgres_dsn, address, say
        )
        state.pids[name] = pid
        state.data_dirs[name] = str((state_dir / name).resolve())
        if name == KAFKA:
            state.kafka_bootstrap = address
        else:
            state.postgres_dsn = address
    if state.pids:
        write_state(state_dir, state)
    if errors:
        up_now = [name for name, task in starts.items() if task.exception() is None]
        hint = f"\n({', '.join(up_now)} is up; `compactor dev down` stops it)" if up_now else ""
        raise DevStackError("\n".join(errors) + hint)
    return list(needed)


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


def _postmaster_pid(pg_root: Path) -> int | None:
    """The server's own pid from ``postmaster.pid``: it outlives a killed wrapper."""
    try:
        first = (pg_root / "postgres" / "postmaster.pid").read_text().splitlines()[0]
        return int(first.strip())
    except (OSError, ValueError, IndexError):
        return None


def _broker_pid(kafka_root: Path) -> int | None:
    try:
        return int((kafka_root / "broker.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def _stop_service(state: StackState, name: str, say: Say) -> None:
    """Stop one recorded service, then anything it left behind.

    The wrapper stops its server on SIGTERM; if the wrapper was killed
    instead, the PostgreSQL server (a daemon of its own) or the broker JVM
    may still run, so their own pid files are checked afterwards.
    """
    pid = state.pids.get(name)
    if pid is not None:
        if owns_pid(name, pid):
            stop_process(pid, timeout=30)
            say(f"stopped {name} (pid {pid})")
        elif pid_alive(pid):
            say(f"{name}: pid {pid} is no longer the process dev up started; left alone")
    root = Path(state.data_dirs.get(name, ""))
    if not state.data_dirs.get(name):
        return
    if name == POSTGRES:
        server = _postmaster_pid(root)
        if server is not None and pid_alive(server):
            argv = process_cmdline(server) or b""
            if b"postgres" in argv or not argv:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server, signal.SIGINT)  # "fast" shutdown
                if not _wait_gone(server, 30):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(server, signal.SIGKILL)
                say(f"stopped a leftover PostgreSQL server (pid {server})")
    elif name == KAFKA:
        broker = _broker_pid(root)
        if broker is not None and pid_alive(broker):
            argv = process_cmdline(broker) or b""
            if str(root / "server.properties").encode() in argv:
                stop_process(broker, timeout=30)
                say(f"stopped a leftover Kafka broker (pid {broker})")


def _stop_processes(state: StackState, say: Say) -> None:
    for name in SERVICES:
        _stop_service(state, name, say)
    state.pids = {}


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
            compose_file = state.data_dirs.get("compose_file", str(COMPOSE_FILE))
            say(f"docker compose -f {compose_file} down")
            proc = await asyncio.to_thread(_compose, "down")
            if proc.returncode != 0:
                raise DevStackError(
                    f"`docker compose down` failed (exit {proc.returncode}):\n"
                    + (proc.stderr or proc.stdout)[-3000:]
                )
        else:
            await asyncio.to_thread(_stop_processes, state, say)
        clear_state(state_dir)
        (state_dir / "kafka.ready").unlink(missing_ok=True)
        return True


# --------------------------------------------------------------------------- status


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
            ok = await (kafka_answers(given) if name == KAFKA else postgres_answers(given))
            reports.append(ServiceReport(name, "configured", source, given, None, None, ok))
            continue
        if state is None:
            reports.append(
                ServiceReport(
                    name, "not running", "run `compactor dev up`", None, None, None, False
                )
            )
            continue
        address = state.kafka_bootstrap if name == KAFKA else state.postgres_dsn
        pid = state.pids.get(name)
        alive = None if pid is None else owns_pid(name, pid)
        ok = False
        if address and alive is not False:
            ok = await (kafka_answers(address) if name == KAFKA else postgres_answers(address))
        if state.launcher == DOCKER_COMPOSE:
            source_name: Literal["started", "docker compose"] = "docker compose"
            detail = state.data_dirs.get("compose_file", str(COMPOSE_FILE))
        else:
            source_name = "started"
            detail = f"dev up, {state_path(state_dir)}"
        reports.append(
            ServiceReport(
                name,
                source_name,
                detail,
                address,
                pid,
                alive,
                ok,
                log=state_dir / f"{name}.log" if state.launcher == PROCESSES else None,
            )
        )
    return reports


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
