"""``dev up``'s own processes: the two launchers started detached, awaited, and stopped.

Each service runs as ``python -m <launcher>`` in a session of its own
(neither the terminal's Ctrl-C nor the end of ``dev up`` reaches it), with its
output in ``STATE_DIR/<service>.log``; the launcher prints the service's
address once it answers. Stopping also finds what a killed launcher left
behind (the PostgreSQL server, the broker JVM) through their own pid files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from devtools.dev_services import SERVICES, DevStackError, Say, answers
from devtools.processes import stop_process
from streams.stack_state import (
    KAFKA,
    KAFKA_LAUNCHER_MODULE,
    POSTGRES,
    POSTGRES_LAUNCHER_MODULE,
    StackState,
    owns_pid,
    pid_alive,
    process_cmdline,
)

KAFKA_READY_TIMEOUT = 180.0
POSTGRES_READY_TIMEOUT = 90.0

#: The broker's client and controller ports; None lets the launcher pick a free one.
KafkaPorts = tuple[int | None, int | None]


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def read_line_value(path: Path, prefix: str) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


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


async def _await_answer(
    name: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    *,
    address: Callable[[], str | None],
    probe: Callable[[str], Awaitable[bool]],
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
        if found is not None and await probe(found):
            return found, proc.pid
        code = proc.poll()
        if code is not None:
            raise DevStackError(
                f"{name} exited with code {code} before answering; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            await asyncio.to_thread(stop_process, proc.pid, stop_grace)
            raise DevStackError(
                f"{name} did not answer within {within:.0f}s; log {log_path}:\n{log_tail(log_path)}"
            )
        await asyncio.sleep(interval)


async def launch_postgres(state_dir: Path, say: Say) -> tuple[str, int]:
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
        probe=partial(answers, POSTGRES),
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


async def launch_kafka(
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
        address=lambda: read_line_value(ready, "KAFKA_BOOTSTRAP="),
        probe=partial(answers, KAFKA),
        within=KAFKA_READY_TIMEOUT,
        stop_grace=20,
        interval=0.3,
    )


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


def stop_service(state: StackState, name: str, say: Say) -> None:
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
    if not state.data_dirs.get(name):
        return
    root = Path(state.data_dirs[name])
    if name == POSTGRES:
        _stop_leftover_postgres(root, say)
    elif name == KAFKA:
        _stop_leftover_broker(root, say)


def _stop_leftover_postgres(root: Path, say: Say) -> None:
    server = _postmaster_pid(root)
    if server is None or not pid_alive(server):
        return
    argv = process_cmdline(server) or b""
    if b"postgres" in argv or not argv:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGINT)  # "fast" shutdown
        if not _wait_gone(server, 30):
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGKILL)
        say(f"stopped a leftover PostgreSQL server (pid {server})")


def _stop_leftover_broker(root: Path, say: Say) -> None:
    broker = _broker_pid(root)
    if broker is None or not pid_alive(broker):
        return
    argv = process_cmdline(broker) or b""
    if str(root / "server.properties").encode() in argv:
        stop_process(broker, timeout=30)
        say(f"stopped a leftover Kafka broker (pid {broker})")


def stop_processes(state: StackState, say: Say) -> None:
    for name in SERVICES:
        stop_service(state, name, say)
    state.pids = {}
