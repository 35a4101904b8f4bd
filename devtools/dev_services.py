"""``compactor dev``'s two services: whether one answers, and the line that reports it.

Every probe goes through ``answers`` (it looks ``kafka_answers`` and
``postgres_answers`` up here at each call), so the stack's modules ask the
same way and a test replaces the probes in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from streams.kafka.probe import is_reachable
from streams.stack_state import KAFKA, POSTGRES, StackState

SERVICES: tuple[str, ...] = (KAFKA, POSTGRES)

Say = Callable[[str], None]


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


async def answers(name: str, address: str) -> bool:
    """Whether service ``name`` (``KAFKA`` or ``POSTGRES``) answers at ``address``."""
    return await (kafka_answers(address) if name == KAFKA else postgres_answers(address))


def address_of(state: StackState, name: str) -> str | None:
    """Where ``state`` says service ``name`` is."""
    return state.kafka_bootstrap if name == KAFKA else state.postgres_dsn


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for tables and logs."""
    parts = urlsplit(dsn)
    if parts.password:
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    return dsn


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
